"""Database locations: telling a PostgreSQL URL from a SQLite path, and hiding passwords.

Imports nothing heavy: the command line uses it on every run (``--db``, ``$CHATFLOW_DB``,
``config show``, the error boundary's scrubbing).
"""

from __future__ import annotations

import re

__all__ = ["dsn_password", "dsn_without_password", "is_postgres_url", "redact_dsn"]


def is_postgres_url(value: object) -> bool:
    """True for a ``postgresql://`` or ``postgres://`` URL (any case)."""
    return isinstance(value, str) and value.lower().startswith(("postgresql://", "postgres://"))


_URL_PASSWORD = re.compile(r"(?i)(postgres(?:ql)?://[^\s/@:]*:)([^\s/@]*)(@)")
_KV_PASSWORD = re.compile(r"(?i)\b(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]+)")


def redact_dsn(text: str) -> str:
    """``text`` with every password of a PostgreSQL DSN in it replaced by ``***``: the
    ``user:password@`` of a URL, and ``password=...`` in a URL's query or a key=value DSN.

    ``redact_dsn("postgresql://bot:s3cret@db/chat")`` -> ``"postgresql://bot:***@db/chat"``.
    """
    text = _URL_PASSWORD.sub(r"\1***\3", text)
    return _KV_PASSWORD.sub(r"\1***", text)


def dsn_password(dsn: str) -> str | None:
    """The password written in ``dsn`` (URL, percent-decoded, or key=value form), or None."""
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
