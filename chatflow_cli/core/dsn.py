"""Database locations and the passwords in them: telling a PostgreSQL URL from a SQLite
path, and hiding passwords (of a DSN, and of any URL's ``user:password@``:
:func:`url_without_userinfo`).

The stores, the model client and the front-ends (``--db``, ``$CHATFLOW_DB``, ``config
show``, the REPL's resume line, the error boundary's scrubbing) all read URLs through these
functions, so a password is hidden the same way everywhere. A string that is not a
PostgreSQL URL is returned or judged as it is.

Imports nothing heavy: the command line uses it on every run.
"""

from __future__ import annotations

import re

__all__ = [
    "dsn_password",
    "dsn_without_password",
    "is_postgres_url",
    "normalize_url",
    "raw_url_password",
    "redact_dsn",
    "url_problem",
    "url_without_userinfo",
]


def is_postgres_url(value: object) -> bool:
    """True for a ``postgresql://`` or ``postgres://`` URL (any case)."""
    return isinstance(value, str) and value.lower().startswith(("postgresql://", "postgres://"))


# Greedy up to the last ``@`` of the URL: a password written with a raw ``@`` or ``/`` (which
# libpq cannot parse either) is still hidden whole. Hiding too much is the safe side.
_URL_PASSWORD = re.compile(r"(?i)(postgres(?:ql)?://[^\s/@:'\"]*:)([^\s'\"]*)(@)")
_KV_PASSWORD = re.compile(r"(?i)\b(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]+)")


def redact_dsn(text: str) -> str:
    """``text`` with every password of a PostgreSQL DSN in it replaced by ``***``: the
    ``user:password@`` of a URL, and ``password=...`` in a URL's query or a key=value DSN.

    ``redact_dsn("postgresql://bot:s3cret@db/chat")`` -> ``"postgresql://bot:***@db/chat"``.
    """
    text = _URL_PASSWORD.sub(r"\1***\3", text)
    return _KV_PASSWORD.sub(r"\1***", text)


# ``//`` then the authority's userinfo: greedy up to the authority's last ``@`` (a password
# written with a raw ``@`` is still removed whole; the authority ends at ``/``, ``?`` or ``#``).
_URL_USERINFO = re.compile(r"//[^/?#\s]*@")


def url_without_userinfo(url: str) -> str:
    """``url`` without the ``user:password@`` (or ``user@``) of its authority: what chatflow
    shows, records with a turn and stores with a session for a model endpoint, so that a
    password given in ``--base-url`` is never written or printed.

    ``url_without_userinfo("http://bot:s3cret@host:8080/v1")`` -> ``"http://host:8080/v1"``;
    a URL without userinfo comes back unchanged.
    """
    return _URL_USERINFO.sub("//", url, count=1)


def dsn_password(dsn: str) -> str | None:
    """The password written in ``dsn`` (URL, percent-decoded, or key=value form), or None.

    Raises:
        ValueError: ``dsn`` is a PostgreSQL URL :func:`urllib.parse.urlsplit` cannot split
            (an unclosed ``[`` of an IPv6 host): check it with :func:`url_problem` first.
    """
    from urllib.parse import parse_qs, unquote, urlsplit

    if is_postgres_url(dsn):
        parts = urlsplit(dsn)
        if parts.password:
            return unquote(parts.password)
        query = parse_qs(parts.query).get("password")
        return query[0] if query else None
    match = re.search(r"(?i)\bpassword\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", dsn)
    if match is None:
        return None
    value = match.group(1)
    return value[1:-1].replace("\\'", "'").replace("\\\\", "\\") if value.startswith("'") else value


def dsn_without_password(dsn: str) -> str:
    """``dsn`` with its password left out (``postgresql://bot@db/chat``): what a command a
    person may copy shows, the password then coming from ``PGPASSWORD`` or ``~/.pgpass``."""
    text = _URL_PASSWORD.sub(lambda m: m.group(1)[:-1] + m.group(3), dsn)
    text = re.sub(r"(?i)([?&])password=[^&\s]*&?", lambda m: m.group(1), text).rstrip("?&")
    return re.sub(r"(?i)\s*\bpassword\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", "", text).strip()


def normalize_url(dsn: str) -> str:
    """``dsn`` with its scheme in lower case (``POSTGRESQL://`` -> ``postgresql://``), which
    libpq requires; anything that is not a PostgreSQL URL is returned unchanged."""
    if not is_postgres_url(dsn):
        return dsn
    scheme, rest = dsn.split("://", 1)
    return f"{scheme.lower()}://{rest}"


#: A ``%`` not followed by two hex digits, or ``%00``: libpq refuses either and quotes the
#: part of the URL (a password) that holds it.
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})|%00")


def url_problem(dsn: str) -> str | None:
    """Why libpq would misread (or could not read) the PostgreSQL URL ``dsn``, or None when
    it is well formed.

    - a user name or password holding a raw ``@`` or ``/`` must be percent-encoded (``%40``,
      ``%2F``): unencoded, the host is taken from inside the password and libpq's error
      quotes part of it;
    - a control character (a NUL, a line break), a ``%`` not followed by two hex digits or a
      ``%00``: libpq's error would quote the part that holds it;
    - a URL :func:`urllib.parse.urlsplit` cannot split (an unclosed ``[``, a host between
      ``[ ]`` that is no IPv6 address) or whose port is not a number from 0 to 65535.

    The returned text never contains the URL or any part of it.
    """
    if not is_postgres_url(dsn):
        return None
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in dsn):
        return ("the database URL holds a control character (a NUL, a tab or a line break): write it on one "
                "line, with any such character in a password percent-encoded")
    rest = dsn.split("://", 1)[1].split("?", 1)[0].split("#", 1)[0]
    authority, slash, path = rest.partition("/")
    if authority.count("@") > 1 or (slash and "@" in path):
        return ("the user name or password in the database URL holds a raw '@' or '/': "
                "percent-encode them ('@' as %40, '/' as %2F), or leave the password out of the URL "
                "and use PGPASSWORD or ~/.pgpass")
    if _BAD_PERCENT.search(dsn):
        return ("the database URL holds a '%' that is not followed by two hex digits, or a %00: write a '%' in "
                "a password as %25")
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(dsn)
    except ValueError:
        return ("the database URL cannot be read: its host has an unclosed '[' or ']', or holds something "
                "other than an IPv6 address between [ ] (write postgresql://user@[::1]:5432/db)")
    if "," not in parts.netloc:  # several hosts (h1:5432,h2:5433): libpq reads each port itself
        try:
            parts.port
        except ValueError:
            return ("the database URL's port is not a number from 0 to 65535 (write "
                    "postgresql://user@host:5432/db)")
    return None


def raw_url_password(dsn: str) -> str | None:
    """The password of the URL ``dsn`` exactly as written (up to its last ``@``, not decoded),
    or None: what must never be printed, even when a raw ``@`` makes the URL malformed."""
    match = _URL_PASSWORD.search(dsn)
    return match.group(2) if match and match.group(2) else None
