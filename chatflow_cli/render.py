"""Rich renderers for chatflow's command line: sessions, turns, tool calls, handoffs, events.

Safety (issue 5, issue 7): text that comes from a model, a tool or the database is passed
through :func:`safe_text` before it reaches a terminal *or* a plain-text pipe, so escape
sequences (screen clear, title change, OSC 52 clipboard writes, hyperlinks), other C0/C1
control characters and bidirectional overrides are shown inert, as visible symbols. It is
printed as ``rich.text.Text`` (never parsed as Rich markup). Only ``--output json``/``jsonl``
carry the text verbatim, JSON-escaped by :func:`dumps` (control characters become
``\\u001b`` and so on, which no terminal executes).

Layout of one turn in ``sessions show`` (plain form; on a terminal the model's text is
rendered Markdown and labels are coloured)::

    ── Turn 3 · outside the context window ──────────────────────────
    You: where is my order 42?
    Support called check_order_status {"order_id": "42"}
      result: {"status": "IN_TRANSIT"}
    handoff: Support -> Billing
    Billing: It is in transit and arrives tomorrow.

Long tool arguments and results are folded to :data:`FOLD_LINES` lines /
:data:`FOLD_CHARS` characters with a note saying how much was left out (``--full`` shows
everything).

``rich.markdown`` is imported only when Markdown is actually rendered (a terminal), so
``sessions show`` into a pipe stays fast (issue 5's speed targets).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any, Iterable, Sequence

from .core._stream import cut_phrase

__all__ = [
    "FOLD_CHARS",
    "FOLD_LINES",
    "ReplyPrinter",
    "dumps",
    "event_text",
    "fold",
    "format_age",
    "has_markdown",
    "markdown_lines",
    "markdown_renderable",
    "safe_text",
    "TextSanitizer",
    "sessions_lines",
    "turn_interrupted",
    "plural",
    "turn_renderables",
]

FOLD_LINES = 8
FOLD_CHARS = 600

# -- the terminal sanitizer ---------------------------------------------------------------
#: Bidirectional formatting characters: they reorder what a terminal shows ("Trojan Source").
BIDI_CONTROLS = frozenset(
    [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
)
#: Characters that end a line for Unicode or for ``str.splitlines`` besides ``\n``.
LINE_SEPARATORS = frozenset([0x2028, 0x2029])


def _picture(code: int) -> str:
    if code < 0x20:
        return chr(0x2400 + code)  # control pictures: ESC -> "␛", CR -> "␍", VT -> "␋"
    if code == 0x7F:
        return "\u2421"  # "␡"
    if 0xD800 <= code <= 0xDFFF:
        return "\ufffd"  # a lone surrogate cannot be written as UTF-8 at all
    return f"<U+{code:04X}>"  # C1 controls (NEL, the one-byte CSI U+009B...), bidi controls


def _sanitizer_table(*, one_line: bool) -> dict[int, str]:
    table = {code: _picture(code) for code in [*range(0x20), 0x7F, *range(0x80, 0xA0), *BIDI_CONTROLS]}
    table.update({code: _picture(code) for code in range(0xD800, 0xE000)})
    if one_line:
        table.update({0x09: " ", 0x0A: " ", **{code: " " for code in LINE_SEPARATORS}})
    else:
        del table[0x09], table[0x0A]
        table.update({code: "\n" for code in LINE_SEPARATORS})
    return table


_TEXT_TABLE = _sanitizer_table(one_line=False)
_LINE_TABLE = _sanitizer_table(one_line=True)
_C1_JSON_RE = re.compile("[\x7f-\x9f\u2028\u2029]")


def safe_text(text: str | None, *, one_line: bool = False) -> str:
    """``text`` made safe for a terminal or a line-oriented pipe: the one sanitizer of chatflow.

    Every character that could control a terminal becomes a visible, inert stand-in, so
    text from a model, a tool or the database can never clear the screen, set the title,
    write the clipboard (OSC 52), hide a link (OSC 8) or reorder what is shown. By class:

    ==========================================  ==================================================
    ``\n`` and tab                               kept (``one_line``: a space each)
    CR LF                                       ``\n`` (``one_line``: a space); a lone CR ``␍``
    other C0 controls (ESC, BEL, VT, FF, ...)   their control pictures: ``␛`` ``␇`` ``␋`` ``␌``
    DEL                                         ``␡``
    C1 controls U+0080–U+009F (NEL, CSI ...)    ``<U+0085>``, ``<U+009B>``
    U+2028 line / U+2029 paragraph separator    ``\n`` (``one_line``: a space)
    bidi controls: ALM, LRM, RLM, U+202A–E,
    U+2066–9                                    ``<U+202E>`` and so on
    lone surrogates (invalid in UTF-8)          ``\ufffd``
    everything else (letters, emoji with their
    ZWJ and variation selectors, tags, other
    format characters such as U+200B, U+00AD)   kept: a terminal prints them, never obeys them
    ==========================================  ==================================================

    ``one_line=True`` is for one-row fields (``sessions ls`` previews, names): no character
    of the result makes a terminal or ``str.splitlines`` start a new line. ``None`` -> ``""``.
    Pure, O(len(text)).
    """
    if not text:
        return ""
    if "\r" in text:
        text = text.replace("\r\n", "\n")
    return text.translate(_LINE_TABLE if one_line else _TEXT_TABLE)


class TextSanitizer:
    """:func:`safe_text` over a stream of deltas: a CR at the end of a delta waits for the
    next one, so CR LF split across two deltas still becomes one ``\n``."""

    def __init__(self) -> None:
        self._carry = ""

    def feed(self, text: str) -> str:
        text = self._carry + text
        self._carry = ""
        if text.endswith("\r"):
            self._carry, text = "\r", text[:-1]
        return safe_text(text)

    def flush(self) -> str:
        text, self._carry = self._carry, ""
        return safe_text(text)


def dumps(obj: Any, *, indent: int | None = None) -> str:
    """JSON for chatflow's ``--json``/``jsonl`` output: UTF-8 text kept readable, but every
    control character (C0 by ``json`` itself, DEL and C1 here) escaped, so the line is
    inert on a terminal and loads back to the verbatim text."""
    text = json.dumps(obj, ensure_ascii=False, indent=indent, separators=None if indent else (",", ":"), default=str)
    return _C1_JSON_RE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def fold(text: str, *, full: bool = False, max_lines: int = FOLD_LINES, max_chars: int = FOLD_CHARS) -> str:
    """``text`` cut to ``max_lines`` lines and ``max_chars`` characters, with a note of what was left out."""
    if full:
        return text
    lines = text.splitlines()
    cut = "\n".join(lines[:max_lines])
    if len(cut) > max_chars:
        cut = cut[:max_chars]
    if len(cut) >= len(text.rstrip("\n")):
        return text
    hidden_lines = len(lines) - cut.count("\n") - 1
    more = f"{hidden_lines} more lines" if hidden_lines > 0 else f"{len(text) - len(cut)} more characters"
    return f"{cut}… ({more}; --full shows all)"


def pretty_json_text(raw: str | None, *, full: bool = False) -> str:
    """Tool arguments or results for display: JSON compacted (or indented when long), else as is."""
    if raw is None:
        return ""
    try:
        data = json.loads(raw)
    except (ValueError, TypeError):
        return fold(raw, full=full)
    if isinstance(data, str):
        return fold(data, full=full)
    compact = json.dumps(data, ensure_ascii=False)
    if len(compact) <= 100:
        return compact
    return fold(json.dumps(data, ensure_ascii=False, indent=2), full=full)


def plural(count: int, word: str, words: str | None = None) -> str:
    """``"1 turn"``, ``"0 turns"``, ``"3 turns"``: a count with its noun agreeing (issue 5)."""
    return f"{count} {word if count == 1 else (words or word + 's')}"


def format_age(timestamp: float | None, now: float | None = None) -> str:
    """``"12s ago"``, ``"5m ago"``, ``"3h ago"``, ``"2d ago"``, or a date past 30 days."""
    if not timestamp:
        return "-"
    now = time.time() if now is None else now
    delta = max(0.0, now - timestamp)
    if delta < 60:
        return f"{int(delta)}s ago"
    if delta < 3600:
        return f"{int(delta // 60)}m ago"
    if delta < 86400:
        return f"{int(delta // 3600)}h ago"
    if delta < 30 * 86400:
        return f"{int(delta // 86400)}d ago"
    return time.strftime("%Y-%m-%d", time.localtime(timestamp))


class Lines:
    """Styled text built piece by piece; ``plain`` for a pipe, :meth:`to_text` for Rich.

    Cheaper than appending to ``rich.text.Text`` (which scans every piece for control
    codes again): chatflow's pieces are already made safe by :func:`safe_text`. Nothing
    from Rich is imported until :meth:`to_text`, so ``sessions show`` into a pipe does not
    load Rich at all.
    """

    __slots__ = ("parts",)

    def __init__(self, text: str = "", style: str = "") -> None:
        self.parts: list[tuple[str, str]] = [(text, style)] if text else []

    def append(self, text: str, style: str = "") -> "Lines":
        if text:
            self.parts.append((text, style))
        return self

    @property
    def plain(self) -> str:
        return "".join(text for text, _ in self.parts)

    def rstrip(self) -> None:
        while self.parts:
            text, style = self.parts[-1]
            stripped = text.rstrip()
            if stripped:
                self.parts[-1] = (stripped, style)
                return
            self.parts.pop()

    def to_text(self) -> Any:
        from rich.text import Span, Text

        plain = self.plain
        spans = []
        offset = 0
        for text, style in self.parts:
            if style:
                spans.append(Span(offset, offset + len(text), style))
            offset += len(text)
        text = Text(plain, spans=spans)
        return text

    def __rich__(self) -> Any:
        return self.to_text()

    def wrapped(self, width: int, *, hang: int | None = None) -> "Lines":
        """These lines word-wrapped to ``width`` cells, for a terminal (which would otherwise
        cut words at its edge). A wrapped row hangs under the start of its line's text: after
        a leading label such as ``You: `` (a bold piece ending in ``": "``) or under its
        leading spaces. Words longer than a row are folded; nothing else is ever split."""
        from rich.cells import cell_len

        out = Lines()
        logical: list[list[tuple[str, str]]] = [[]]
        for text, style in self.parts:
            for index, piece in enumerate(text.split("\n")):
                if index:
                    logical.append([])
                if piece:
                    logical[-1].append((piece, style))
        for number, parts in enumerate(logical):
            if number:
                out.append("\n")
            plain = "".join(text for text, _ in parts)
            if cell_len(plain) <= width:
                out.parts.extend(parts)
                continue
            indent = len(plain) - len(plain.lstrip(" ")) if hang is None else hang
            if hang is None and parts and parts[0][1].startswith("bold") and parts[0][0].endswith(": "):
                indent = len(parts[0][0])
            indent = min(indent, width // 3)
            used = 0
            for text, style in parts:
                for token in re.findall(r" +|[^ ]+", text):
                    size = cell_len(token)
                    if token[0] == " ":
                        if used + size < width:
                            out.append(token, style)
                            used += size
                        continue
                    if used + size > width and used > indent:
                        out.rstrip_spaces()
                        out.append("\n" + " " * indent)
                        used = indent
                    while used + cell_len(token) > width:  # a word longer than the row
                        room, cut = width - used, 0
                        while cut < len(token) and cell_len(token[: cut + 1]) <= room:
                            cut += 1
                        cut = max(cut, 1)
                        out.append(token[:cut], style)
                        out.append("\n" + " " * indent)
                        token, used = token[cut:], indent
                    out.append(token, style)
                    used += cell_len(token)
        return out

    def rstrip_spaces(self) -> None:
        """Drop the spaces at the end of the last line (not its newline)."""
        while self.parts:
            text, style = self.parts[-1]
            stripped = text.rstrip(" ")
            if stripped or text == "":
                self.parts[-1] = (stripped, style)
                return
            self.parts.pop()

    def ansi(self, color_system: str | None) -> str:
        """The text with SGR colour codes for ``color_system`` (``None``: plain), no wrapping.

        Used for terminals and pagers: the terminal wraps long lines itself, so Rich's
        layout pass (the slow part of printing thousands of lines) is skipped.
        """
        if not color_system:
            return self.plain
        return "".join(_style_of(style, color_system).render(text, color_system=_color_system(color_system))
                       if style else text for text, style in self.parts)


_STYLES: dict[tuple[str, str], Any] = {}


def _style_of(style: str, color_system: str) -> Any:
    key = (style, color_system)
    if key not in _STYLES:
        from rich.style import Style

        _STYLES[key] = Style.parse(style)
    return _STYLES[key]


_COLOR_SYSTEMS: dict[str, Any] = {}


def _color_system(name: str) -> Any:
    if name not in _COLOR_SYSTEMS:
        from rich.color import ColorSystem

        _COLOR_SYSTEMS[name] = {"standard": ColorSystem.STANDARD, "256": ColorSystem.EIGHT_BIT,
                                "truecolor": ColorSystem.TRUECOLOR,
                                "windows": ColorSystem.WINDOWS}.get(name, ColorSystem.STANDARD)
    return _COLOR_SYSTEMS[name]


# ---------------------------------------------------------------------------------------
# sessions ls
# ---------------------------------------------------------------------------------------
_LS_HEADERS = ("SESSION", "AGENT", "STATUS", "TURNS", "UPDATED", "PREVIEW")
_LS_STATUS_STYLES = {"running": "yellow", "rescheduled": "magenta", "terminated": "dim"}
_LS_MIN_PREVIEW = 12  # a preview narrower than this is dropped instead
_LS_MIN_AGENT = 6  # an agent name narrower than this (with its ellipsis) is dropped instead


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "\u2026"


def sessions_lines(summaries: Sequence[Any], *, width: int | None = None, now: float | None = None) -> list[Lines]:
    """The ``sessions ls`` table as styled lines, columns two spaces apart (issue 5).

    ``width`` is the terminal's width in cells; ``None`` (output is not a terminal) means
    no limit: nothing is wrapped or truncated, each line is as long as it needs to be.
    On a narrow terminal the PREVIEW column shrinks (ellipsis) and is dropped below
    ``_LS_MIN_PREVIEW`` cells, then AGENT likewise; SESSION, STATUS, TURNS and UPDATED
    are never truncated (a terminal too narrow even for those wraps the lines itself).
    """
    rows: list[list[str]] = []
    statuses: list[str] = []
    for s in summaries:
        status = str(getattr(s.status, "value", s.status))
        statuses.append(status)
        rows.append([
            safe_text(s.session_id), safe_text(s.active_agent_name or "-"), status, str(s.turn_count),
            format_age(s.updated_at, now),
            # a session whose only turns failed previews the failed message, marked as such
            ("(failed) " if s.turn_count == 0 and s.preview else "") + safe_text(s.preview, one_line=True).strip(),
        ])
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(_LS_HEADERS)]
    columns = list(range(len(_LS_HEADERS)))
    if width is not None:
        def total() -> int:
            return sum(widths[i] for i in columns) + 2 * (len(columns) - 1)

        for col, minimum in ((5, _LS_MIN_PREVIEW), (1, _LS_MIN_AGENT)):
            excess = total() - width
            if excess <= 0:
                break
            if widths[col] - excess >= minimum:
                widths[col] -= excess
            else:
                columns.remove(col)
        if total() > width:  # even the columns that are never truncated do not fit
            return _sessions_stacked(rows, statuses, width)
    lines: list[Lines] = []
    header = Lines()
    for n, i in enumerate(columns):
        last = n == len(columns) - 1
        text = _LS_HEADERS[i] if last else _LS_HEADERS[i].ljust(widths[i]) if i != 3 else _LS_HEADERS[i].rjust(widths[i])
        header.append(text + ("" if last else "  "), "bold")
    header.rstrip()
    lines.append(header)
    for row, status in zip(rows, statuses):
        line = Lines()
        for n, i in enumerate(columns):
            last = n == len(columns) - 1
            cell = _clip(row[i], widths[i])
            cell = cell.rjust(widths[i]) if i == 3 else (cell if last else cell.ljust(widths[i]))
            style = "cyan" if i == 0 else _LS_STATUS_STYLES.get(status, "") if i == 2 else ""
            line.append(cell, style)
            if not last:
                line.append("  ")
        line.rstrip()
        lines.append(line)
    return lines


def _sessions_stacked(rows: list[list[str]], statuses: list[str], width: int) -> list[Lines]:
    """``sessions ls`` on a terminal too narrow for its columns: two lines a session, the id
    and status, then turns, age, agent and preview, indented and clipped to ``width``."""
    lines: list[Lines] = []
    for row, status in zip(rows, statuses):
        sid, agent, _, turns, updated, preview = row
        first = Lines(sid, "cyan")
        if len(sid) + 2 + len(status) <= width:
            first.append("  " + status, _LS_STATUS_STYLES.get(status, ""))
        lines.append(first)
        detail = f"{plural(int(turns), 'turn')} · {updated}" + (f" · {agent}" if agent != "-" else "")
        detail = _clip("  " + detail, width)
        second = Lines(detail, "dim")
        room = width - len(detail) - 2
        if preview and room >= _LS_MIN_PREVIEW:
            second.append("  " + _clip(preview, room))
        lines.append(second)
    return lines


def agents_lines(rows: Sequence[dict[str, Any]], *, width: int | None = None) -> list[Lines]:
    """The ``agents ls`` listing as styled lines.

    ``rows`` as :func:`agent_dicts` gives them. A table (AGENT, MODEL, HANDOFFS, TOOLS,
    INSTRUCTIONS; ``*`` marks the starting agent) when it fits ``width`` with at least
    :data:`_LS_MIN_PREVIEW` cells of instructions, or when ``width`` is ``None`` (a pipe:
    nothing truncated); otherwise one block an agent, each line wrapped to ``width``.
    """
    def cells(r: dict[str, Any]) -> list[str]:
        tools = ", ".join(t["name"] + (" (custom)" if t["kind"] == "custom" else "") for t in r["tools"])
        first = (r["instructions"] or "").strip().splitlines()[0] if (r["instructions"] or "").strip() else ""
        return [safe_text(r["name"]) + (" *" if r["start"] else ""), safe_text(r["model"] or "(default)"),
                safe_text(", ".join(r["handoffs"]) or "-"), safe_text(tools or "-"), safe_text(first)]

    headers = ("AGENT", "MODEL", "HANDOFFS", "TOOLS", "INSTRUCTIONS")
    table = [cells(r) for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in table]) for i, h in enumerate(headers)]
    fixed = sum(widths[:4]) + 2 * 4
    if width is None or fixed + _LS_MIN_PREVIEW <= width:
        last = widths[4] if width is None else max(0, min(widths[4], width - fixed))
        out = [Lines("  ".join(h.ljust(w) for h, w in zip(headers[:4], widths)) + "  " + headers[4], "bold")]
        for c in table:
            line = Lines(c[0].ljust(widths[0]), "cyan")
            line.append("  " + "  ".join(v.ljust(w) for v, w in zip(c[1:4], widths[1:4])) + "  ")
            line.append(_clip(c[4], last) if width is not None else c[4], "dim")
            line.rstrip()
            out.append(line)
        return out
    import textwrap

    out = []
    for c in table:
        out.append(Lines(_clip(c[0], width), "bold cyan"))
        for label, value in (("model", c[1]), ("handoffs", c[2]), ("tools", c[3]), ("", c[4])):
            if not value or (label and value == "-"):
                continue
            text = f"{label}: {value}" if label else value
            for piece in textwrap.wrap(text, width=max(10, width - 2), break_long_words=True) or [""]:
                out.append(Lines("  " + piece, "dim" if not label else ""))
    return out


# ---------------------------------------------------------------------------------------
# the JSON event shape (chat --output jsonl, replay --output json/jsonl)
# ---------------------------------------------------------------------------------------
#: The version of the JSON event shape, in every event's ``"schema"`` field. It changes
#: only when a field is removed or changes meaning; new fields may appear within a version.
EVENT_SCHEMA = 1


def _without_tokens(data: Any) -> Any:
    """``data`` without the lock tokens of the owners it names (a ``status`` or
    ``session.recovered`` payload's ``owner``): the token is the running turn's credential."""
    if isinstance(data, dict) and isinstance(data.get("owner"), dict) and "token" in data["owner"]:
        data = {**data, "owner": {k: v for k, v in data["owner"].items() if k != "token"}}
    return data


def event_json(type: str, session_id: str | None, data: Any = None, *, seq: int | None = None,
               turn: int | None = None, created_at: float | None = None,
               idempotency_key: str | None = None) -> dict[str, Any]:
    """One event in chatflow's JSON shape (README, "JSON output")::

        {"schema": 1, "seq": 7, "type": "message.model", "session_id": "s1", "turn": 2,
         "created_at": 1764547200.5, "data": {...}}

    ``seq`` (the event-log position) and ``created_at`` (epoch seconds, UTC) are present only
    on events stored in the log; runtime events (``text.delta``, ``tool.call_started``...)
    and ``result`` have neither. ``turn`` is always present (``null`` when none applies).
    ``data`` is the event's payload; a ``result``/``error`` event's ``data`` holds
    ``is_error``. Owners' lock tokens are never included.
    """
    out: dict[str, Any] = {"schema": EVENT_SCHEMA}
    if seq is not None:
        out["seq"] = seq
    out["type"] = type
    out["session_id"] = session_id
    out["turn"] = turn
    if created_at is not None:
        out["created_at"] = created_at
    if idempotency_key is not None:
        out["idempotency_key"] = idempotency_key
    out["data"] = _without_tokens(data if data is not None else {})
    return out


def stored_event_json(event: Any) -> dict[str, Any]:
    """A stored :class:`~chatflow_cli.core.events.Event` in the JSON event shape."""
    payload = event.payload or {}
    turn = payload.get("turn") if isinstance(payload, dict) else None
    return event_json(str(getattr(event.type, "value", event.type)), event.session_id, payload, seq=event.seq,
                      turn=turn if isinstance(turn, int) else None, created_at=event.created_at,
                      idempotency_key=event.idempotency_key)


def summary_dict(s: Any) -> dict[str, Any]:
    """A session summary as JSON-ready data (``sessions ls --json``)."""
    return {
        "session_id": s.session_id,
        "agent": s.active_agent_name,
        "status": getattr(s.status, "value", s.status),
        "turns": s.turn_count,
        "max_turns": s.max_turns,
        "created_at": s.created_at,
        "updated_at": s.updated_at,
        "preview": s.preview,
        "metadata": s.metadata,
    }


# ---------------------------------------------------------------------------------------
# sessions show
# ---------------------------------------------------------------------------------------
def _role(msg: Any) -> str:
    return getattr(msg.role, "value", msg.role)


def turn_handoffs(record: Any) -> list[dict[str, Any]]:
    """The handoffs of one turn, from its messages: each ``transfer_to_*`` call, with the
    agent that made it and the agent that spoke next (``from_agent``, ``to_agent``,
    ``tool_call_id``). No event-log scan is needed, so ``sessions show`` stays fast."""
    out: list[dict[str, Any]] = []
    msgs = record.messages
    for index, msg in enumerate(msgs):
        if _role(msg) != "model":
            continue
        for call in msg.tool_calls:
            if call.name.startswith("transfer_to_"):
                out.append({
                    "from_agent": msg.agent,
                    "to_agent": _next_agent(msgs, index, msg.agent) or call.name[len("transfer_to_"):],
                    "tool_call_id": call.id,
                })
    return out


def turn_interrupted(record: Any, interrupted_turns: Any = ()) -> bool:
    """Whether a stored turn was stopped by Ctrl-C or cancellation (issue 5).

    True when a message carries the ``interrupted`` flag (partial model text, synthetic
    tool results), or when the turn ends with its user message (stopped while the model
    was thinking: nothing else was stored) or with a tool result (stopped after a complete
    tool round) and its number is in ``interrupted_turns`` (the
    turn numbers of the session's ``turn.interrupted`` events; any container, queried
    only in that second case).
    """
    msgs = record.messages
    if any(m.interrupted for m in msgs):
        return True
    return bool(msgs) and _role(msgs[-1]) in ("user", "tool") and record.number in interrupted_turns


def turn_dict(record: Any, *, interrupted: bool = False) -> dict[str, Any]:
    """One turn as JSON-ready data (``sessions show --json``)."""
    return {
        "number": record.number,
        "in_window": record.in_window,
        "rolled_back": record.rolled_back,
        "failed": record.failed,
        "interrupted": interrupted,
        "messages": [m.to_dict() for m in record.messages],
        "handoffs": turn_handoffs(record),
    }


#: Characters and line shapes that make Markdown differ from the text as written:
#: emphasis, code, headings, quotes, links, images, tables, strikethrough, HTML and
#: entities, escapes, list items, indented code, setext underlines and rules.
_MARKDOWN_SYNTAX_RE = re.compile(
    r"[*_`#>\[\]|~<&\\]"
    r"|^[ \t]*(?:[-+][ \t]|\d{1,9}[.)](?:[ \t]|$))"
    r"|^(?: {4}|\t)"
    r"|^[ \t]*(?:=+|-{2,})[ \t]*$",
    re.MULTILINE,
)


def has_markdown(text: str | None) -> bool:
    """Whether rendering ``text`` as Markdown could look different from the text itself.

    Conservative: any character or line shape with a Markdown meaning counts, so a false
    ``True`` only costs time; ``False`` means CommonMark would show the same words (it
    would join a paragraph's lines; chatflow keeps them, see :func:`parse_markdown`).
    """
    return bool(text) and _MARKDOWN_SYNTAX_RE.search(text) is not None


_MARKDOWN_TEMPLATE: Any = None
_MARKDOWN_PARSER: Any = None


def markdown_renderable(text: str) -> Any:
    """``rich.markdown.Markdown`` of ``text`` (already made safe), parsed by one shared parser.

    ``Markdown()`` builds a new ``markdown_it.MarkdownIt`` for every instance, which is
    about half the cost of a short answer; ``sessions show`` renders hundreds, so one
    parser configured as Rich's (CommonMark + strikethrough + tables) is reused and each
    instance copies a template's settings. Links are shown as ``text (url)``, not as
    OSC 8 hyperlinks, as in the REPL; single line breaks are kept (:func:`parse_markdown`).
    The REPL's live view renders through this too, so a reply looks the same live and in
    ``sessions show``.

    It renders through private copies of Rich's styles (see
    :class:`chatflow_cli.markdown_stream.OwnStyles`): Rich caches a shared ``Style``'s
    ANSI codes for the colour system of the first console that prints it, so printing
    Markdown on, say, a 256-colour console would otherwise make later 16-colour output
    (the REPL's code blocks) come out in 256-colour codes, and the other way round.
    """
    global _MARKDOWN_TEMPLATE
    import copy

    if _MARKDOWN_TEMPLATE is None:
        _MARKDOWN_TEMPLATE = _isolated_markdown_class()("", hyperlinks=False)
    item = copy.copy(_MARKDOWN_TEMPLATE)
    item.markup = text
    item.parsed = parse_markdown(text)
    return item


def _isolated_markdown_class() -> Any:
    """``rich.markdown.Markdown`` whose segments carry styles private to each rendering."""
    from rich.markdown import Markdown
    from rich.segment import Segment

    from .markdown_stream import OwnStyles

    class IsolatedMarkdown(Markdown):
        def __rich_console__(self, console: Any, options: Any) -> Any:
            styles = OwnStyles()
            for item in super().__rich_console__(console, options):
                if isinstance(item, Segment):
                    yield Segment(item.text, styles.style(item.style), item.control)
                else:
                    yield from styles.own(console.render(item, options))

    IsolatedMarkdown.__name__ = IsolatedMarkdown.__qualname__ = "Markdown"
    return IsolatedMarkdown


# -- a fast path for the Markdown models write most ---------------------------------------
#: Block tokens :func:`markdown_lines` lays out itself; anything else (headings, code,
#: quotes, tables, rules, HTML) is left to ``rich.markdown``.
_SIMPLE_BLOCKS = frozenset({
    "paragraph_open", "paragraph_close", "inline", "bullet_list_open", "bullet_list_close",
    "ordered_list_open", "ordered_list_close", "list_item_open", "list_item_close",
})
#: Inline styles, as Rich's default Markdown theme has them.
_INLINE_STYLES = {"strong": "bold", "em": "italic", "s": "strike"}
_CODE_STYLE = "bold cyan on black"
_BULLET_STYLE = "bold"
_NUMBER_STYLE = "cyan"


def _markdown_parser() -> Any:
    global _MARKDOWN_PARSER
    if _MARKDOWN_PARSER is None:
        from markdown_it import MarkdownIt

        _MARKDOWN_PARSER = MarkdownIt().enable("strikethrough").enable("table")
    return _MARKDOWN_PARSER


def parse_markdown(text: str) -> list[Any]:
    """``text`` parsed as chatflow shows Markdown: CommonMark with tables and strikethrough,
    and every single line break kept (a soft break becomes a hard one), as chat interfaces
    show replies: CSV rows, addresses and poems keep their lines. A blank line still
    separates paragraphs."""
    tokens = _markdown_parser().parse(text)
    for token in tokens:
        if token.type == "inline" and token.children:
            for child in token.children:
                if child.type == "softbreak":
                    child.type, child.tag, child.markup = "hardbreak", "br", ""
    return tokens


def _inline_pieces(children: Sequence[Any]) -> list[tuple[str, str]] | None:
    """Inline tokens -> ``(text, style)`` pieces; ``"\n"`` alone is a hard line break.
    ``None`` when a token is not one :func:`markdown_lines` handles (links, images, HTML)."""
    pieces: list[tuple[str, str]] = []
    active: list[str] = []
    for tok in children:
        kind = tok.type
        if kind == "text":
            if tok.content:
                pieces.append((tok.content, " ".join(active)))
        elif kind == "softbreak":
            pieces.append((" ", " ".join(active)))
        elif kind == "hardbreak":
            pieces.append(("\n", ""))
        elif kind == "code_inline":
            pieces.append((tok.content, " ".join([*active, _CODE_STYLE])))
        elif kind.endswith("_open") and kind[:-5] in _INLINE_STYLES:
            active.append(_INLINE_STYLES[kind[:-5]])
        elif kind.endswith("_close") and kind[:-6] in _INLINE_STYLES:
            if active:
                active.pop()
        else:
            return None
    return pieces


def _wrap(pieces: list[tuple[str, str]], width: int) -> list[list[tuple[str, str]]]:
    """Greedy word wrap of styled pieces to ``width`` cells, as Rich wraps a paragraph:
    words (runs without spaces, possibly spanning styles) never split unless longer than
    the line, spaces at a break dropped, ``"\n"`` pieces force a break."""
    from rich.cells import cell_len

    width = max(1, width)
    # words: each a list of (text, style) fragments; separators remember their style
    lines: list[list[tuple[str, str]]] = []
    line: list[tuple[str, str]] = []
    used = 0
    word: list[tuple[str, str]] = []
    word_len = 0
    gap: tuple[str, str] | None = None  # the space before the word being built

    def place() -> None:
        nonlocal line, used, word, word_len, gap
        if not word:
            return
        if line and used + 1 + word_len > width:
            lines.append(line)
            line, used, gap = [], 0, None
        if line and gap is not None:
            line.append(gap)
            used += 1
        if word_len > width - used:  # longer than a whole line: fold it by characters
            for text, style in word:
                for ch in text:
                    w = cell_len(ch)
                    if used + w > width and line:
                        lines.append(line)
                        line, used = [], 0
                    line.append((ch, style))
                    used += w
        else:
            line.extend(word)
            used += word_len
        word, word_len, gap = [], 0, None

    for text, style in pieces:
        if text == "\n":
            place()
            lines.append(line)
            line, used, gap = [], 0, None
            continue
        for index, chunk in enumerate(text.split(" ")):
            if index > 0:  # a space came before this chunk
                place()
                if line or lines:
                    gap = (" ", style)
            if chunk:
                word.append((chunk, style))
                word_len += cell_len(chunk)
    place()
    if line or not lines:
        lines.append(line)
    return lines


def markdown_lines(text: str, width: int) -> list[Lines] | None:
    """``text`` (already made safe) laid out as Rich's Markdown would, or ``None``.

    Covers what models write most -- paragraphs, bullet and numbered lists (nested,
    tight), bold, italic, strikethrough and inline code -- with Rich's default styles,
    wrapping and list markers, without Rich's layout engine, which costs several times
    more per answer (issue 5: ``sessions show`` of 500 turns within 1 s). Anything else
    (headings, code blocks, quotes, tables, rules, links, images, HTML, loose lists)
    returns ``None``: the caller renders it with :func:`markdown_renderable`. Lines carry
    no trailing padding.
    """
    tokens = parse_markdown(text)
    out: list[Lines] = []
    # open list levels: [is_ordered, next_number, marker_width, marker_pending]
    levels: list[list[Any]] = []
    for index, tok in enumerate(tokens):
        kind = tok.type
        if kind not in _SIMPLE_BLOCKS:
            return None
        if kind == "paragraph_open":
            if levels and not tok.hidden:
                return None  # a loose list: Rich spaces it differently
            if not levels and out:
                out.append(Lines())
        elif kind in ("bullet_list_open", "ordered_list_open"):
            if not levels and out:
                out.append(Lines())
            ordered = kind == "ordered_list_open"
            start = int(tok.attrs.get("start", 1)) if ordered else 1
            count = 0
            for later in tokens[index + 1:]:
                if later.level == tok.level and later.type == kind.replace("_open", "_close"):
                    break
                if later.type == "list_item_open" and later.level == tok.level + 1:
                    count += 1
            marker_width = len(str(start + count)) + 2 if ordered else 3
            levels.append([ordered, start, marker_width, False])
        elif kind in ("bullet_list_close", "ordered_list_close"):
            levels.pop()
        elif kind == "list_item_open":
            levels[-1][3] = True
        elif kind == "inline":
            pieces = _inline_pieces(tok.children or [])
            if pieces is None:
                return None
            indent = sum(level[2] for level in levels)
            for row in _wrap(pieces, width - indent):
                line = Lines()
                for level in levels:
                    ordered, number, marker_width, pending = level
                    if pending:
                        if ordered:
                            line.append(f"{number}".rjust(marker_width - 1) + " ", _NUMBER_STYLE)
                            level[1] = number + 1
                        else:
                            line.append(" • ", _BULLET_STYLE)
                        level[3] = False
                    else:
                        line.append(" " * marker_width)
                for piece_text, style in row:
                    line.append(piece_text, style)
                out.append(line)
    return out


def turn_renderables(record: Any, *, markdown: bool = False, full: bool = False, width: int | None = None,
                     interrupted: bool = False) -> list[Any]:
    """The renderables of one turn (see the module docstring for the layout).

    Items are :class:`Lines` (with ``plain`` text and Rich styles) and, when ``markdown``
    is true (a terminal), the model's text as Markdown: laid out by
    :func:`markdown_lines` into :class:`Lines` when it only uses paragraphs, lists and
    inline styles, else a ``rich.markdown.Markdown`` (:func:`markdown_renderable`). Text
    with no Markdown syntax at all (:func:`has_markdown`) is shown as written, unparsed.
    Issue 5: a 500-turn ``sessions show`` on a terminal within 1 s. With ``markdown`` and
    ``width`` (a terminal) the lines are word-wrapped to ``width`` (:meth:`Lines.wrapped`);
    continuation lines of a multi-line message are indented under its text.
    """
    marks = []
    if record.rolled_back:
        marks.append("rolled back")
    if record.failed:
        marks.append("failed")
    if interrupted:
        marks.append("interrupted")
    cut = next((m.finish_reason for m in record.messages if getattr(m, "finish_reason", None)), None)
    if cut:
        marks.append(f"cut ({cut})")
    if not record.in_window and not record.rolled_back:
        marks.append("outside the context window")
    title = f"── Turn {record.number}" + ("".join(f" · {m}" for m in marks)) + " "
    rule_style = "dim" if marks else "bold blue"
    out: list[Any] = [Lines(title + "─" * max(3, (width or 72) - len(title)), rule_style)]

    msgs = record.messages
    results = {m.tool_call_id: m for m in msgs if _role(m) == "tool"}
    handoff_to = {h["tool_call_id"]: h["to_agent"] for h in turn_handoffs(record)}
    agent_so_far: str | None = None
    body = Lines()

    def flush() -> None:
        nonlocal body
        body.rstrip()
        if body.parts:
            out.append(body)
        body = Lines()

    for msg in msgs:
        role = _role(msg)
        if role == "user":
            body.append("You: ", "bold green").append(_hanging(safe_text(msg.content), 5)).append("\n")
            if interrupted and msg is msgs[-1]:
                body.append("  (interrupted)\n", "yellow")
        elif role == "system":
            body.append("System: ", "bold magenta").append(_hanging(fold(safe_text(msg.content), full=full), 8), "dim")
            body.append("\n")
        elif role == "model":
            agent = msg.agent or agent_so_far or "model"
            agent_so_far = agent
            if msg.content:
                body.append(f"{safe_text(agent)}: ", "bold cyan")
                if markdown and has_markdown(msg.content):
                    flush()
                    safe = safe_text(msg.content)
                    laid_out = markdown_lines(safe, width or 80)
                    if laid_out is None:
                        out.append(markdown_renderable(safe))
                    else:
                        block = Lines()
                        for number, line in enumerate(laid_out):
                            if number:
                                block.append("\n")
                            block.parts.extend(line.parts)
                        out.append(block)
                else:
                    body.append(_hanging(safe_text(msg.content), len(safe_text(agent)) + 2)).append("\n")
            if msg.reasoning and (full or not msg.content):
                if full:
                    body.append(f"{safe_text(agent)} reasoned: ", "dim").append(safe_text(msg.reasoning), "dim")
                    body.append("\n")
                else:
                    body.append(f"{safe_text(agent)}: ", "bold cyan")
                    body.append("(reasoning only, no text; --full shows it)\n", "yellow")
            elif not msg.content and not msg.tool_calls and not msg.interrupted:
                body.append(f"{safe_text(agent)}: ", "bold cyan").append("(empty reply)\n", "yellow")
            if msg.finish_reason:
                body.append(f"  ({reply_cut_text(msg.finish_reason)})\n", "yellow")
            if msg.interrupted:
                body.append("  (interrupted)\n", "yellow")
            for call in msg.tool_calls:
                result = results.get(call.id)
                if call.id in handoff_to:
                    body.append(f"handoff: {safe_text(agent)} -> {safe_text(handoff_to[call.id])}\n", "bold magenta")
                    continue
                body.append(f"{safe_text(agent)} called ", "dim").append(safe_text(call.name), "bold yellow")
                body.append(" " + safe_text(pretty_json_text(call.arguments, full=full)) + "\n")
                if result is None:
                    body.append("  result: (waiting for --tool-result)\n", "yellow")
                else:
                    if result.is_error:
                        body.append("  error: ", "red")
                    else:
                        body.append("  result: ", "dim")
                    text = safe_text(pretty_json_text(result.content, full=full))
                    body.append(text.replace("\n", "\n    ") + "\n")
                    if result.interrupted:
                        body.append("  (interrupted)\n", "yellow")
        # TOOL messages are shown with their call
    flush()
    out.append(Lines())
    if markdown and width:
        out = [item.wrapped(width) if isinstance(item, Lines) else item for item in out]
    return out


def _hanging(text: str, indent: int) -> str:
    """``text`` with its continuation lines indented by ``indent`` (at most 12) spaces: a
    multi-line message reads as one block after its label, not from column 0."""
    return text.replace("\n", "\n" + " " * min(indent, 12)) if "\n" in text else text


def _next_agent(msgs: Sequence[Any], index: int, current: str | None = None) -> str | None:
    for msg in msgs[index + 1 :]:
        if _role(msg) == "model" and msg.agent and msg.agent != current:
            return msg.agent
    return None


# ---------------------------------------------------------------------------------------
# replay
# ---------------------------------------------------------------------------------------
def event_text(event: Any, *, full: bool = False, width: int | None = None) -> Any:
    """One stored event as a line of ``rich.text.Text`` (``chatflow replay``).

    With ``width`` (a terminal's columns) the line is word-wrapped to it, wrapped rows and
    the continuation lines of a multi-line message indented by 6 (under the event type).
    """
    if width:
        return _hanging_text(event_text(event, full=full), width, 6)
    from rich.text import Text

    p = event.payload or {}
    line = Text()
    line.append(f"{event.seq:>5} ", style="dim")
    line.append(f"{event.type:<22}", style="bold")
    t = event.type
    if t in ("message.user", "message.model", "message.system", "tool.result"):
        msg = p.get("message") or {}
        turn = p.get("turn")
        if turn:
            line.append(f"turn {turn}  ", style="dim")
        if msg.get("agent"):
            line.append(f"{safe_text(msg['agent'])}: ", style="cyan")
        if msg.get("content"):
            line.append(_hanging(safe_text(fold(str(msg["content"]), full=full, max_lines=3, max_chars=300)), 6))
        for call in msg.get("tool_calls") or ():
            line.append(f" call {safe_text(call.get('name'))}({safe_text(fold(call.get('arguments') or '', full=full, max_lines=1, max_chars=200))})", style="yellow")
        if msg.get("finish_reason"):
            line.append(f" ({reply_cut_text(str(msg['finish_reason']))})", style="yellow")
        if msg.get("reasoning") and (full or not msg.get("content")):
            line.append(" reasoning: " if full else " (reasoning only)", style="dim")
            if full:
                line.append(safe_text(str(msg["reasoning"])), style="dim")
    elif t == "handoff":
        line.append(f"{safe_text(p.get('from_agent'))} -> {safe_text(p.get('to_agent'))}", style="magenta")
    elif t == "status":
        line.append(safe_text(str(p.get("status"))))
        if p.get("reason"):
            line.append(f" ({safe_text(str(p['reason']))})", style="dim")
    elif t == "turn.completed":
        line.append(f"turn {p.get('turn')} by {safe_text(str(p.get('agent')))}")
        if cut_phrase(p.get("finish_reason")):
            line.append(f" ({reply_cut_text(str(p['finish_reason']))})", style="yellow")
    elif t == "turn.failed":
        line.append(f"turn {p.get('turn')}: {safe_text(str(p.get('error')))}", style="red")
        if p.get("reverted_from_agent"):
            line.append(f" (handoff undone: {safe_text(str(p['reverted_from_agent']))} -> "
                        f"{safe_text(str(p.get('active_agent')))})", style="dim")
    elif t == "session.created":
        line.append(f"agent {safe_text(str(p.get('agent')))}, window {p.get('max_turns')}")
        if p.get("metadata"):
            line.append(" " + _key_values(p["metadata"], full=full), style="dim")
    elif t == "turn.interrupted":
        line.append(f"turn {p.get('turn')}: {safe_text(str(p.get('reason') or 'interrupted'))}", style="yellow")
        ids = p.get("tool_use_ids") or []
        if ids:
            line.append(f" (tool calls left without a result: {safe_text(', '.join(map(str, ids)))})", style="dim")
    elif t == "turn.interrupt_requested":
        line.append(f"turn {p.get('turn')}: asked to stop", style="yellow")
    elif t == "tool.pending":
        ids = ", ".join(map(str, p.get("tool_use_ids") or []))
        line.append(f"turn {p.get('turn')}: waiting for --tool-result {safe_text(ids)}", style="yellow")
    elif t == "tool.result_submitted":
        line.append(f"turn {p.get('turn')}: result for {safe_text(str(p.get('tool_use_id')))}"
                    f"{' (error)' if p.get('is_error') else ''}: ")
        line.append(safe_text(fold(str(p.get("output") or ""), full=full, max_lines=1, max_chars=200)))
    elif t == "rollback":
        removed = p.get("removed_turns") or []
        line.append(f"to turn {p.get('to_turn')}, removed {plural(len(removed), 'turn')}"
                    + (f" ({', '.join(map(str, removed))})" if removed else ""))
    elif t == "metadata.updated":
        changes = p.get("changes") or {}
        line.append(_key_values(changes, full=full) or "-")
        if p.get("removed"):
            line.append(f" removed {safe_text(', '.join(map(str, p['removed'])))}", style="dim")
    elif t == "session.recovered":
        owner = p.get("owner") or {}
        line.append(f"turn {p.get('turn')}: closed the run of a dead process "
                    f"(pid {owner.get('pid')} on {safe_text(str(owner.get('host')))})", style="yellow")
    else:
        line.append(_key_values(p, full=full), style="dim")
    return line


def _hanging_text(text: Any, width: int, hang: int) -> Any:
    """A ``rich.text.Text`` word-wrapped to ``width`` with wrapped rows indented by ``hang``."""
    spans = [span for span in text.spans if isinstance(span.style, str)]
    plain = text.plain
    cuts = sorted({0, len(plain), *(s.start for s in spans), *(s.end for s in spans)})
    lines = Lines()
    for start, end in zip(cuts, cuts[1:]):
        style = " ".join(s.style for s in spans if s.start <= start and s.end >= end)
        lines.append(plain[start:end], style)
    return lines.wrapped(width, hang=hang).to_text()


def reply_cut_text(finish_reason: str) -> str:
    """``"cut by the token limit, finish_reason length"`` for a stored cut reply's mark."""
    phrase = cut_phrase(finish_reason) or "cut"
    return f"{phrase}, finish_reason {safe_text(finish_reason)}"


def reply_note(result: Any) -> str | None:
    """The note a front-end shows after a finished turn whose reply is not a plain whole
    answer: cut (``finish_reason`` ``length``/``content_filter``, read from the turn's
    stored verdict), reasoning only, or empty. ``None`` for a whole answer."""
    if result is None or result.pending_tool_calls or result.replayed and not result.finish_reason:
        return None
    phrase = cut_phrase(result.finish_reason)
    show = f"chatflow sessions show {result.session_id} --full"
    if phrase:
        tail = (" before any text (its reasoning: " + show + ")") if not (result.content or "").strip() and result.reasoning else ""
        return f"reply {phrase} (finish_reason {result.finish_reason}){tail}; turn {result.turn} is stored, marked as cut"
    if not (result.content or "").strip():
        if result.reasoning:
            return f"the model answered with reasoning only, no text (see it with: {show})"
        return "the model's reply was empty" if not result.content else "the model's reply was only whitespace"
    return None


def _key_values(data: Any, *, full: bool = False) -> str:
    """A compact ``key=value key2=value2`` summary of an event payload (values as compact JSON
    unless plain strings/numbers), made safe; the fallback for event types replay does not
    know (business events such as ``note`` or ``billing.refund``)."""
    if not isinstance(data, dict):
        return safe_text(fold(json.dumps(data, ensure_ascii=False), full=full, max_lines=1, max_chars=200))
    parts = []
    for key, value in data.items():
        if isinstance(value, str):
            shown = value if value and not any(c.isspace() for c in value) else json.dumps(value, ensure_ascii=False)
        elif isinstance(value, (int, float, bool)) or value is None:
            shown = json.dumps(value)
        else:
            shown = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        parts.append(f"{key}={shown}")
    return safe_text(fold(" ".join(parts), full=full, max_lines=1, max_chars=300))


# ---------------------------------------------------------------------------------------
# chat: the streamed reply
# ---------------------------------------------------------------------------------------
class ReplyPrinter:
    """Shows a reply as it streams.

    On a terminal (``live=True``) the text is rendered as Markdown as it arrives, through
    :class:`chatflow_cli.markdown_stream.MarkdownStream` (complete blocks printed once,
    only the tail redrawn); tool calls and handoffs are printed above the live tail. Into a
    pipe the text is written as it arrives, plain and made safe, and notes about tool calls
    go to stderr only when stderr is a terminal, so stdout holds the answer and nothing else.
    """

    #: Seconds between two redraws of the spinner while nothing else arrives.
    TICK_S = 0.1

    def __init__(self, out_console: Any | None, err_console: Any | None, *, live: bool, file: Any = None) -> None:
        import threading

        self.out = out_console
        self.err = err_console
        self.live_enabled = live and out_console is not None
        self._stream: Any = None
        self._text = ""
        self._printed_any = False
        self._file = file if file is not None else out_console.file
        # The spinner moves on its own: a ticker thread redraws the live tail every TICK_S
        # seconds while the main thread waits on the model. Every use of the stream holds
        # the lock, since MarkdownStream itself is not thread-safe.
        self._lock = threading.RLock()
        # (what, until: monotonic s or None, what once the countdown is over)
        self._waiting: tuple[str, float | None, str] = ("thinking", None, "thinking")
        self._stop = threading.Event()
        self._ticker: Any = None
        self._segment_text = False  # text of the current segment is live (no spinner then)
        self._sanitizer = TextSanitizer()
        if self.live_enabled:
            from .markdown_stream import MarkdownStream

            self._stream = MarkdownStream(out_console, live=True)
            self._stream.set_status("thinking")
            self._ticker = threading.Thread(target=self._tick, name="chatflow-spinner", daemon=True)
            self._ticker.start()

    # -- the spinner ----------------------------------------------------------------------
    def waiting(self, what: str, seconds: float | None = None, then: str | None = None) -> None:
        """Say what the reply waits for (any thread): ``what`` beside the spinner. With
        ``seconds``, ``{seconds}`` in ``what`` counts down ("rate limited, retrying in 3 s
        (2/3)") and ``then`` is shown once it reaches 0."""
        import time

        with self._lock:
            until = time.monotonic() + seconds if seconds is not None else None
            self._waiting = (what, until, then or what)
            self._show_waiting()

    def _status_text(self) -> str:
        import math
        import time

        what, until, then = self._waiting
        if until is None:
            return what
        left = until - time.monotonic()
        return what.format(seconds=math.ceil(left)) if left > 0 else then

    def _show_waiting(self) -> None:
        if self._stream is not None:
            self._stream.set_status(self._status_text(), refresh=False)

    def _tick(self) -> None:
        while not self._stop.wait(self.TICK_S):
            with self._lock:
                if self._stream is None:
                    return
                if self._segment_text:  # text is streaming: its own redraws suffice
                    continue
                self._show_waiting()
                self._stream.refresh()

    def _stop_ticker(self) -> None:
        self._stop.set()
        ticker, self._ticker = self._ticker, None
        if ticker is not None and ticker.is_alive():
            import threading

            if ticker is not threading.current_thread():
                ticker.join(timeout=1.0)

    # -- text ---------------------------------------------------------------------------
    def delta(self, text: str) -> None:
        if not text:
            return
        with self._lock:
            self._text += text
            self._printed_any = True
            self._segment_text = True
            self._waiting = ("thinking", None, "thinking")
            if self._stream is not None:
                self._stream.feed(text)
            else:
                self._file.write(self._sanitizer.feed(text))
                self._file.flush()

    def _end_segment(self) -> None:
        """Close the current text segment (before a tool call line, or at the end)."""
        if self._stream is not None:
            self._stream.end_text()
        elif self._text and not self._text.endswith("\n"):
            self._file.write(self._sanitizer.flush())
            self._file.write("\n")
            self._file.flush()
        self._text = ""

    # -- notes --------------------------------------------------------------------------
    def note(self, text: Any) -> None:
        """A line about a tool call or handoff: above the live tail, or on a terminal stderr."""
        with self._lock:
            self._segment_text = False  # after a tool or handoff line the spinner shows again
            if self._stream is not None:
                self._stream.print(text)
                return
            self._end_segment()
            if self.err is not None:
                self.err.print(text)

    def tool_started(self, agent: str | None, name: str, arguments: str | None) -> None:
        from rich.text import Text

        line = Text()
        line.append(f"{safe_text(agent or 'model')} called ", style="dim")
        line.append(safe_text(name), style="bold yellow")
        line.append(" " + safe_text(pretty_json_text(arguments)), style="dim")
        self.note(line)

    def tool_finished(self, name: str, output: str | None, is_error: bool = False) -> None:
        from rich.text import Text

        line = Text("  error: " if is_error else "  result: ", style="red" if is_error else "dim")
        line.append(safe_text(fold(pretty_json_text(output), max_lines=3, max_chars=300)), style="dim")
        self.note(line)

    def handoff(self, from_agent: str | None, to_agent: str | None) -> None:
        from rich.text import Text

        self.note(Text(f"handoff: {safe_text(from_agent)} -> {safe_text(to_agent)}", style="bold magenta"))

    def finish(self, final_text: str | None = None) -> None:
        """End the reply. ``final_text`` is printed when nothing was streamed (a replayed turn)."""
        if final_text and not self._printed_any:
            self.delta(final_text)
        self._stop_ticker()
        with self._lock:
            if self._stream is not None:
                self._stream.finish()
                self._stream = None
            else:
                self._end_segment()

    def abort(self) -> None:
        self._stop_ticker()
        with self._lock:
            if self._stream is not None:
                try:
                    self._stream.finish()
                finally:
                    self._stream = None
            else:
                self._end_segment()
