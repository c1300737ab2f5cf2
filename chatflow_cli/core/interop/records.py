"""What an import reads, before anything is written: sessions of turns, in chatflow's terms.

Every reader (``chatflow``, ``md``, ``openai``, ``llm``, ``claude-code``) parses its whole
input into :class:`ImportedSession` values first, so a malformed line or row is reported
(:class:`~chatflow_cli.core.errors.ImportFormatError`) before the store is touched.

Each turn carries a ``key``: a stable name of that turn in its source (an llm response id, a
Claude Code entry uuid, a line number and content hash...). The importer turns it into an
idempotency key, so importing the same source twice adds nothing, and an import stopped
halfway adds only what is missing when run again.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..errors import ImportFormatError
from ..messages import Message, strict_dumps

__all__ = [
    "EXPORT_FORMATS",
    "IMPORT_FORMATS",
    "ImportedSession",
    "ImportedTurn",
    "content_digest",
    "count_skipped",
    "iso_time",
    "json_line",
    "parse_time",
    "strict_dumps",
    "strict_loads",
]

#: Formats ``sessions export --format`` writes.
EXPORT_FORMATS = ("chatflow", "md", "openai", "json")
#: Formats ``sessions import --from`` reads.
IMPORT_FORMATS = ("chatflow", "md", "openai", "llm", "claude-code")


@dataclass(slots=True)
class ImportedTurn:
    """One turn read from a source.

    ``messages``: the USER message first, then MODEL and TOOL messages in order (every tool
    call answered). ``key``: the turn's stable name in the source. ``usage``: token counts
    in any shape :func:`~chatflow_cli.core.stream.normalize_usage` reads (stored in its one
    shape) when the source has them; ``model``/``base_url``: the model that answered and
    the API root it was asked at, when known (recorded on the turn); ``created_at``: UTC epoch seconds, when known. ``outcome``:
    ``"completed"``, ``"interrupted"`` (the source says the reply was cut off) or
    ``"failed"`` (the turn's user message was never answered). ``location``: where the
    turn starts in the source (``line 7``, ``responses row 01h…``, ``messages row 3f…``),
    named by errors about it. ``times``: when known, each message's time in the source (UTC
    epoch seconds, parallel to ``messages``; a missing or None one takes the message's
    before it, the first ``created_at``): the import gives each message's event that time.
    """

    key: str
    messages: list[Message]
    usage: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    base_url: str | None = None
    created_at: float | None = None
    finish_reason: str | None = None
    outcome: str = "completed"
    error: str | None = None
    location: str | None = None
    times: list[float | None] = field(default_factory=list)

    @property
    def content(self) -> str:
        """The text of the turn's last MODEL message ("" when none)."""
        for msg in reversed(self.messages):
            if msg.role.value == "model":
                return msg.content or ""
        return ""


@dataclass(slots=True)
class ImportedSession:
    """One session read from a source.

    ``source``: the format name; ``source_id``: the conversation's id in its source (an llm
    conversation or thread id, a Claude Code session id, a chatflow session id and its
    creation time); ``session_id``: the id chatflow gives it unless ``--into`` says
    otherwise. ``title``: the title the source gives it (set on a session the import
    creates). ``created_at``/``updated_at``: UTC epoch seconds of the conversation's
    start and last activity in the source, when known; a session the import creates keeps
    them (``sessions ls`` orders and ``--since`` filters by when it happened), falling back
    on its turns' ``created_at``. ``archived_at``: when the source says the session was
    archived (``md`` front matter); a session the import creates is then archived too
    (chatflow's own format replays its archive events instead). ``system``: SYSTEM messages, in order (their text, or the whole message when it carries Agents SDK items, which an import keeps as they are). ``events``: for chatflow's own
    format only, the whole event log to replay (``type``, ``payload``, ``created_at``,
    ``seq``); ``turns`` is then derived from it for counts; ``blobs``: the bytes of its
    messages' attachments (sha256 -> bytes), for that format too. ``warnings``: what the reader
    skipped or repaired (a dangling parent, an unknown entry type). ``skipped``: how many
    entries or rows of the source the reader left out, by reason (a sentence: ``"side chain
    (a subagent's work)"``); empty when it left nothing out.
    """

    source: str
    source_id: str
    session_id: str
    agent: str | None = None
    system: list[str | Message] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    base_url: str | None = None
    max_turns: int | None = None
    created_at: float | None = None
    updated_at: float | None = None
    title: str | None = None
    archived_at: float | None = None
    turns: list[ImportedTurn] = field(default_factory=list)
    events: list[dict[str, Any]] | None = None
    warnings: list[str] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    #: for chatflow's own format: the bytes of the attachments its messages use, by sha256
    blobs: dict[str, bytes] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        """``{"turns", "messages", "tool_calls", "events"}`` of what this session holds."""
        messages = sum(len(t.messages) for t in self.turns) + len(self.system)
        calls = sum(len(m.tool_calls) for t in self.turns for m in t.messages)
        out = {"turns": len(self.turns), "messages": messages, "tool_calls": calls}
        if self.events is not None:
            out["events"] = len(self.events)
        return out


def count_skipped(skipped: dict[str, int], reason: str, n: int = 1) -> None:
    """Count ``n`` more entries or rows a reader left out for ``reason`` (into ``skipped``,
    an :attr:`ImportedSession.skipped`)."""
    skipped[reason] = skipped.get(reason, 0) + n


_LINE_BREAKS = {0x85: "\\u0085", 0x2028: "\\u2028", 0x2029: "\\u2029"}


def _no_constant(name: str) -> Any:
    raise json.JSONDecodeError(f"{name} is not JSON (strict JSON has no NaN or Infinity)", name, 0)


#: ``json.loads`` for the files an import reads: strict JSON, so a bare ``NaN``, ``Infinity``
#: or ``-Infinity`` is a ``json.JSONDecodeError`` (its ``msg`` says which) like any other
#: malformed text, reported with its line before anything is written.
strict_loads = json.JSONDecoder(parse_constant=_no_constant).decode


def json_line(data: Any) -> str:
    """``data`` as one line of strict JSON (UTF-8 text, no newline). NEL, U+2028 and U+2029
    are written as escapes, since many line readers (Python's ``splitlines``, JavaScript)
    split on them.

    Raises:
        NonFiniteNumberError: a float NaN or Infinity in ``data``.
    """
    return strict_dumps(data, ensure_ascii=False, separators=(",", ":")).translate(_LINE_BREAKS)


def content_digest(data: Any, length: int = 16) -> str:
    """A short stable hex digest of JSON-able ``data`` (sorted keys). Text that is not valid
    Unicode (a lone surrogate) has a digest too: the store refuses it later, naming its line."""
    text = json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:length]


def parse_time(value: Any, *, source: str | None = None, location: str | None = None) -> float | None:
    """UTC epoch seconds from an ISO 8601 string (``Z``, an offset, or none: UTC), or a number;
    None for None/"". Raises ImportFormatError for anything else (naming ``source`` and
    ``location`` when given)."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        text = value.strip().replace("Z", "+00:00").replace(" ", "T", 1)
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            pass
        else:
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=UTC)
            return moment.timestamp()
    where = "".join(f"{part}: " for part in (source, location) if part)  # the error names the file and line
    raise ImportFormatError(f"{where}not a time: {str(value)[:40]!r}", source=source, location=location)


def iso_time(epoch: float | None) -> str | None:
    """``2026-12-01T02:54:57.839Z`` for UTC epoch seconds (None stays None)."""
    if epoch is None:
        return None
    moment = datetime.fromtimestamp(epoch, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
