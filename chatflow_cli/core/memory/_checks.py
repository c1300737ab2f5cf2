"""Helpers shared by the session context and every store: argument checks, and the small
conversions they all use.

* argument checks: each ``_check_*`` function (and :func:`storable_text`, :data:`TITLE_CHARS`,
  :data:`DEFAULT_MAX_TURNS`, :data:`MAX_TURNS_LIMIT`) -- see below;
* :func:`agent_name_of` (the name an agent is stored under), :func:`_fallback_agent` (an
  agent for a stored name no resolver knows), :func:`_plain_usage` (a usage value as a
  dict), :func:`json_sha256` (the digest of a value as canonical JSON: idempotency keys);
* :func:`metadata_matches`: a listing's ``--metadata KEY=VALUE`` filter.

Each ``_check_*`` function returns its argument (or a JSON copy of it) when valid and raises
the same error in every store otherwise: ``TypeError`` for a value of the wrong type,
``ValueError`` for one out of range, :class:`~chatflow_cli.core.errors.UsageError` for text
that is not valid Unicode (a lone surrogate, which SQLite cannot store). Checks run before
anything is written, so a refused call leaves no trace.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, is_dataclass
from typing import Any

from ..errors import UsageError
from ..messages import compact_json, is_non_finite_error

#: Turns kept in the context window unless a session says otherwise.
DEFAULT_MAX_TURNS = 40


#: Upper bound of ``max_turns``: far beyond any context window, and within SQLite's 64-bit integers.
MAX_TURNS_LIMIT = 1_000_000


def _check_max_turns(value: Any, name: str = "max_turns") -> int:
    """``value`` as an int in ``1..MAX_TURNS_LIMIT`` (1,000,000), the same in every store.

    Raises:
        TypeError: ``value`` is not an int (a bool is refused too).
        ValueError: ``value <= 0`` or above ``MAX_TURNS_LIMIT`` (SQLite could not even store 2**70).
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    if value > MAX_TURNS_LIMIT:
        raise ValueError(f"{name} must be at most {MAX_TURNS_LIMIT:,}, got {value}")
    return value


def _check_session_id(session_id: Any, *, empty_ok: bool = True) -> str:
    """A session id: a str (TypeError otherwise) of valid Unicode text (UsageError), the same in
    both stores. ``empty_ok=False`` (creating a session): ValueError for ``""``."""
    if not isinstance(session_id, str):
        raise TypeError(f"session_id must be a str, got {type(session_id).__name__}")
    if not session_id and not empty_ok:
        raise ValueError("session_id must be a non-empty string")
    if not session_id.isascii():
        _check_text(session_id, "session_id")
    return session_id


def storable_text(text: str) -> str:
    """``text`` made storable: every lone surrogate (``"\\udcff"``, e.g. from
    ``os.fsdecode(b"file-\\xff.txt")``) replaced by its backslash escape (the six characters
    ``\\udcff``); any other text is returned as is (same object).

    Used by the Runner for text chatflow did not get from the caller -- tool output, model
    text, tool-call arguments, error messages -- so such a value never fails a turn: we
    choose ``backslashreplace`` over ``replace`` ("?") because the escape keeps which
    character it was, for the model and for the user reading the log. A *user* message
    with a lone surrogate is still refused (:class:`UsageError`, see :func:`_check_text`).
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


#: The longest title a session may have (characters).
TITLE_CHARS = 200


def _check_title(title: Any, session_id: str | None = None) -> str | None:
    """A session title as stored: one line (runs of whitespace become one space), stripped;
    None for None or ``""`` (no title: it is derived again).

    Raises:
        TypeError: ``title`` is not a str or None.
        ValueError: longer than :data:`TITLE_CHARS` characters.
        UsageError: not valid Unicode text.
    """
    if title is not None and not isinstance(title, str):
        raise TypeError(f"title must be a str or None, got {type(title).__name__}")
    text = " ".join((title or "").split())
    if len(text) > TITLE_CHARS:
        raise ValueError(f"a title is at most {TITLE_CHARS} characters, got {len(text)}")
    if text:
        _check_text(text, "title", session_id)
    return text or None


def json_problem(exc: BaseException) -> str:
    """What :func:`compact_json` refused, in words (NaN and Infinity named as such)."""
    if is_non_finite_error(exc):
        return "a float NaN or Infinity, which strict JSON cannot represent"
    return str(exc)


def _check_text(data: Any, what: str, session_id: str | None = None) -> str:
    """``data`` as compact JSON text that encodes as UTF-8, or :class:`UsageError`.

    A lone surrogate (``"\\ud800"``, e.g. from ``surrogateescape``-decoded bytes) is not
    Unicode text: SQLite cannot store it, and the in-memory store must not accept what
    SQLite refuses. Both stores refuse it the same way, before writing anything (we choose
    refusing over storing an escaped copy: the caller would get back other text than sent).

    Raises:
        UsageError: a lone surrogate.
        TypeError: a value JSON cannot hold: of another type (a set, an object), or a float
            NaN or Infinity (strict JSON has no such numbers; SQLite's JSON functions refuse
            them, so one stored would break every search of the file).
    """
    try:
        text = compact_json(data)
    except (TypeError, ValueError) as exc:  # another type; NaN/Infinity (allow_nan=False); a cycle
        raise TypeError(f"{what} cannot be stored as JSON: {json_problem(exc)}") from None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start : exc.end].encode("utf-8", "backslashreplace").decode("ascii")
        raise UsageError(
            f"{what} is not valid Unicode text: lone surrogate {bad} at position {exc.start} "
            "(decode the input with errors='replace')",
            session_id=session_id,
        ) from None
    return text


def _check_idempotency_key(key: Any) -> str:
    """An idempotency key: a non-empty str of valid Unicode text (TypeError / UsageError)."""
    if not isinstance(key, str) or not key:
        raise TypeError(f"idempotency_key must be a non-empty str or None, got {key!r}")
    if not key.isascii():
        _check_text(key, "idempotency_key")
    return key


def _check_metadata(value: Any, name: str = "metadata") -> dict[str, Any]:
    """A JSON copy of ``value``: a mapping with str keys and JSON-serialisable values.

    TypeError otherwise (both stores alike; a float NaN or Infinity too: strict JSON has
    none); a lone surrogate in a string is a
    :class:`UsageError` (see :func:`_check_text`). The copy is what a JSON round trip
    gives (tuples become lists, nested keys become str), so both stores return the same.
    """
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict, got {type(value).__name__}")
    for key in value:
        if not isinstance(key, str):
            raise TypeError(f"{name} keys must be str, got {key!r}")
    try:
        text = _check_text(dict(value), name)  # TypeError names ``name`` and the problem
    except RecursionError as exc:
        raise TypeError(f"{name} must hold JSON-serialisable values only: {exc}") from None
    data: dict[str, Any] = json.loads(text)
    return data


def agent_name_of(agent: Any) -> str:
    """The name an agent is stored under: ``""`` for None, a str as given, else its ``name``
    attribute (or ``str(agent)`` when it has none)."""
    if agent is None:
        return ""
    if isinstance(agent, str):
        return agent
    return str(getattr(agent, "name", agent))


def _plain_usage(usage: Any) -> dict[str, Any]:
    if usage is None:
        return {}
    if isinstance(usage, Mapping):
        return dict(usage)
    if hasattr(usage, "to_dict"):
        return dict(usage.to_dict())
    if is_dataclass(usage) and not isinstance(usage, type):
        return asdict(usage)
    return dict(vars(usage))


def _fallback_agent(name: str) -> Any:
    """An agent with this name, no instructions and no tools: what a session gets when no
    agent resolver knows its stored agent name."""
    from ..agents import Agent

    return Agent(name=name, instructions="")


def json_sha256(data: Any, default: Callable[[Any], Any] | None = None) -> str:
    """SHA-256 of ``data`` as canonical JSON (sorted keys, compact); ``default`` as for ``json.dumps``."""
    text = json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=default)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def check_wait(wait: Any) -> float:
    """A wait in seconds: a real number >= 0 (ValueError/TypeError otherwise)."""
    if isinstance(wait, bool) or not isinstance(wait, (int, float)):
        raise TypeError(f"wait must be a number of seconds, got {type(wait).__name__}")
    if not wait >= 0:
        raise ValueError(f"wait must be >= 0 seconds, got {wait!r}")
    return float(wait)


def metadata_matches(metadata: Mapping[str, Any], key: str, value: str) -> bool:
    """A listing's ``--metadata KEY=VALUE`` filter: ``metadata[key]`` is the string ``value``,
    or a non-string whose compact JSON text is ``value`` (``n=3``, ``vip=true``)."""
    if key not in metadata:
        return False
    stored = metadata[key]
    if isinstance(stored, str):
        return stored == value
    return json.dumps(stored, ensure_ascii=False, separators=(",", ":")) == value
