"""Read a Claude Code session file (``~/.claude/projects/<project>/<session id>.jsonl``).

Claude Code writes one JSON object a line. Entries carry a ``uuid`` and the ``parentUuid``
of the entry before them: conversation entries (``"type": "user"`` or ``"assistant"``) and
others that stand in the same chain (``"type": "system"`` lines such as a command's output or
a compaction boundary). A rewound or edited conversation leaves abandoned branches in the
file, and subagent work is marked ``"isSidechain": true``. The conversation that counts is
the main line that ends at the last main-line (not side-chain) conversation entry: this
reader walks ``parentUuid`` back from it through entries of every type, so abandoned
branches and side chains are left out. At a compaction boundary (``"subtype":
"compact_boundary"``, ``parentUuid`` null, ``logicalParentUuid`` naming the last entry
before it) it follows ``logicalParentUuid``, so the turns before the compaction are kept; the
summary Claude Code wrote after the boundary (a user entry with ``isCompactSummary``) is what
it sent in their place, not a message of the conversation, and is left out. A parent that is
not in the file (a session resumed from another file, an older half cleaned up) does not end
the conversation: it goes on from the last main-line entry written before, with a warning.
A copy of an entry written before (same ``uuid``) is read once.

Every conversation entry left out is counted by reason in the session's ``skipped``
(side chain, abandoned branch, meta entry, local command, compaction summary, reply before
the first user message, a line cut mid-write, a tool result answering no call); lines that are no part of
the conversation (``summary``, ``file-history-snapshot``, ``system``) are not counted.

A file may be read while Claude Code is still writing it: a last line cut mid-write (not
JSON, no newline after it) is left out with a warning, and importing the grown file later
adds what was written since, the turn that was cut short included (its content changed, so
the importer imports it again whole: see :mod:`~chatflow_cli.core.interop.importer`).

Mapping, in chatflow's terms:

* a user entry's text (a string, or its ``text`` blocks) is a USER message: a new turn;
  ``tool_result`` blocks are TOOL messages answering the call ``tool_use_id`` names
  (``is_error`` kept; non-text blocks such as images are kept as ``[image]``);
* assistant entries that share one ``message.id`` (Claude Code writes each content block on
  its own line) are one MODEL message: ``text`` blocks its content, ``thinking`` blocks its
  reasoning, ``tool_use`` blocks its tool calls (``input`` as the JSON arguments);
  ``message.model`` and ``message.usage`` are the turn's model and token usage; a
  ``message.stop_reason`` of ``max_tokens`` (the reply was cut by the output limit) marks the
  MODEL message cut (``finish_reason`` ``"length"``), and the turn too when it is the turn's
  last reply, as chatflow marks a cut reply of its own;
* meta entries (``isMeta``: the caveat before local commands, a custom command's expanded
  text), ``system``, ``summary`` and ``file-history-snapshot`` lines are not messages and
  are skipped;
* local commands -- a slash command such as ``/model`` or ``/cost`` and its
  ``<local-command-stdout>``, the ``!`` bash mode's ``<bash-input>`` and ``<bash-stdout>``:
  user entries no reply answers -- are not prompts, and are skipped (counted as local
  commands); a custom slash command the model answered is a prompt, and opens a turn;
* a tool call the file never answers before the model's next reply gets the result ``"No
  result in the imported log."`` (marked as an error), so the history stays valid; a turn
  that ends with calls unanswered (a tool still running when the file was read, or Claude
  Code stopped) is closed as chatflow closes an interrupted turn: ``outcome``
  ``"interrupted"``, and the import adds the synthetic results.

Times: a turn's is its user entry's ``timestamp``, and each message's the ``timestamp`` of
the entry it comes from (a MODEL message's first entry); the session was created at the first
timed entry of the conversation and updated at its last. An entry with no ``timestamp`` key
has no time (a turn then takes the import's); one that is present and not an ISO 8601
string is an error naming the line.

The session id is Claude Code's ``sessionId`` of the first main-line entry (a resumed
session's later entries may carry another one); ``cwd``, ``gitBranch`` and ``version`` go
into the session's metadata (``claude_code_cwd``...).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from ..stream import TRUNCATING_FINISH_REASONS, normalize_finish_reason
from ..errors import ImportFormatError
from ..messages import Message, ToolCall
from .records import ImportedSession, ImportedTurn, count_skipped, parse_time, strict_loads

__all__ = ["NO_RESULT", "looks_like_claude_code", "read_claude_code"]

NO_RESULT = "No result in the imported log."
_CONVERSATION = ("user", "assistant")

#: Why conversation entries are left out (the keys of :attr:`ImportedSession.skipped`).
SKIP_SIDECHAIN = "side chain (a subagent's work)"
SKIP_BRANCH = "abandoned branch (rewound or edited away)"
SKIP_META = "meta entry (a caveat or expanded command Claude Code adds)"
SKIP_LOCAL = "local command or its output (run in Claude Code, not a prompt)"
SKIP_SUMMARY = "compaction summary (not a message of the conversation)"
SKIP_BEFORE_USER = "reply before the first user message"
SKIP_CUT = "line cut off mid-write"
SKIP_ORPHAN_RESULT = "tool result answering no tool call"


def _main_chain(entries: dict[str, tuple[int, dict[str, Any]]], main: list[tuple[int, dict[str, Any]]],
                warnings: list[str]) -> list[tuple[int, dict[str, Any]]]:
    """The main line, oldest first: from the last main-line conversation entry back through
    ``parentUuid`` (any entry type: a system entry may stand between two messages), through a
    compaction boundary's ``logicalParentUuid``, to the root. Where a parent is not in the file
    (a session resumed from another file, a boundary whose older half was cleaned up), the
    chain goes on from the last main-line entry written before the entry that names it, with
    a warning; a root (no parent at all) ends it, so a branch rewound to the first message
    leaves the abandoned one out."""
    chain: list[tuple[int, dict[str, Any]]] = []
    seen: set[str] = set()
    current: tuple[int, dict[str, Any]] | None = main[-1]
    while current is not None:
        number, entry = current
        if entry["uuid"] in seen:
            warnings.append(f"line {number}: the parent chain loops back to {entry['uuid']}; it starts here")
            break
        seen.add(entry["uuid"])
        chain.append(current)
        parent = entry.get("parentUuid") or entry.get("logicalParentUuid")
        if not isinstance(parent, str) or not parent:
            break  # the root of the conversation
        current = entries.get(parent)
        if current is None or current[1]["uuid"] in seen:
            earlier = [m for m in main if m[0] < number and m[1]["uuid"] not in seen]
            current = earlier[-1] if earlier else None
            if current is not None:
                warnings.append(f"line {number}: parent {parent} is not in the file (a resumed session?): "
                                f"the conversation goes on from line {current[0]}, the entry written before it")
            else:
                warnings.append(f"line {number}: parent {parent} is not in the file; the conversation starts "
                                "at this entry")
    chain.reverse()
    return chain


#: How the user entries of a local command begin: a slash command's invocation and output,
#: and the ``!`` bash mode's input and output.
_LOCAL_TAGS = ("<command-name>", "<command-message>", "<local-command-stdout>", "<local-command-stderr>",
               "<bash-input>", "<bash-stdout>", "<bash-stderr>")


def _user_text(entry: dict[str, Any]) -> str | None:
    """The text of a user entry that says something (a prompt, a command), None for one
    that holds only tool results or nothing."""
    content = entry["message"].get("content")
    if isinstance(content, str):
        return content if content.strip() else None
    blocks = content if isinstance(content, list) else []
    texts = [b for b in blocks if not (isinstance(b, dict) and b.get("type") == "tool_result")]
    text = _text_of(texts) if texts else ""
    return text if text.strip() else None


def _local_commands(chain: list[tuple[int, dict[str, Any]]]) -> set[int]:
    """The line numbers of ``chain``'s local command entries: user entries (not meta) that
    start with a command's or the bash mode's tags and that no reply answers before the next
    user entry that says something (``/model`` and its output, ``!git status``...). A custom
    slash command the model answered (its prompt expanded in a meta entry) is a prompt, not
    one of them."""
    local: set[int] = set()
    for k, (number, entry) in enumerate(chain):
        if entry["type"] != "user" or entry.get("isMeta"):
            continue
        text = _user_text(entry)
        if text is None or not text.lstrip().startswith(_LOCAL_TAGS):
            continue
        answered = False
        for _, later in chain[k + 1:]:
            if later["type"] == "assistant":
                answered = True
                break
            if not later.get("isMeta") and _user_text(later) is not None:
                break
        if not answered:
            local.add(number)
    return local


def looks_like_claude_code(first: dict[str, Any]) -> bool:
    """True for a first JSON line of a Claude Code session file."""
    keys = set(first)
    return bool(keys & {"parentUuid", "sessionId", "leafUuid"}) or first.get("type") in (
        "summary",
        "file-history-snapshot",
    )


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for block in content:
            if isinstance(block, dict):
                if block.get("type") == "text":
                    parts.append(str(block.get("text") or ""))
                elif block.get("type"):
                    parts.append(f"[{block['type']}]")
            elif isinstance(block, str):
                parts.append(block)
        return "\n".join(parts)
    if content is None:
        return ""
    return json.dumps(content, ensure_ascii=False)


def _entry_time(entry: dict[str, Any], number: int, source: str) -> float | None:
    """The entry's ``timestamp`` in UTC epoch seconds, or None when the entry has no
    ``timestamp`` key.

    Claude Code writes an ISO 8601 string on every user and assistant entry (only lines
    such as ``summary`` may have none), so a ``timestamp`` that is present and not such a
    string -- a number, null, ``""``, text that is no time -- is an error.

    Raises:
        ImportFormatError: the ``timestamp`` is present and not an ISO 8601 string (naming the line).
    """
    if "timestamp" not in entry:
        return None
    value = entry["timestamp"]
    try:
        if not isinstance(value, str) or not value.strip():
            raise ImportFormatError("not an ISO 8601 string")
        return parse_time(value)
    except ImportFormatError:
        where = f"line {number}"
        shown = value[:40] if isinstance(value, str) else value
        raise ImportFormatError(f"{source}: {where}: timestamp is not a time: {shown!r}",
                                source=source, location=where) from None


def read_claude_code(lines: Iterable[str], *, source: str = "-") -> list[ImportedSession]:
    """Parse a Claude Code session file into one :class:`ImportedSession`.

    ``lines``: the file split on ``\n`` (so a last line with no newline after it is a line
    still being written: when it is not JSON, it is left out with a warning).

    Raises:
        ImportFormatError: a line that is not a JSON object, a conversation entry with no
            ``uuid``, a ``message`` that is not an object or a ``timestamp`` that is present
            and not an ISO 8601 string (a number, null: naming the line), or a file
            with no main-line conversation entry.
    """
    entries: dict[str, tuple[int, dict[str, Any]]] = {}  # every entry with a uuid, any type
    main: list[tuple[int, dict[str, Any]]] = []  # conversation entries outside side chains, in file order
    times: dict[int, float | None] = {}  # line number -> the entry's time, parsed once
    warnings: list[str] = []
    skipped: dict[str, int] = {}
    sidechain = 0
    lines = list(lines)
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entry = strict_loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):  # no newline after it: Claude Code is still writing it
                warnings.append(f"line {number}: cut off mid-write (is Claude Code still writing the file?): "
                                "left out; import the file again when it is complete")
                count_skipped(skipped, SKIP_CUT)
                continue
            raise ImportFormatError(f"{source}: line {number}: not JSON ({exc.msg})", source=source,
                                    location=f"line {number}") from None
        if not isinstance(entry, dict):
            raise ImportFormatError(f"{source}: line {number}: not a JSON object", source=source,
                                    location=f"line {number}")
        if entry.get("type") not in _CONVERSATION:
            # system entries (a compaction boundary, a command's output...) and others with a
            # uuid stand in the parent chain too: the walk goes through them
            if isinstance(entry.get("uuid"), str) and entry["uuid"] and entry["uuid"] not in entries:
                entries[entry["uuid"]] = (number, entry)
            continue
        uuid = entry.get("uuid")
        if not isinstance(uuid, str) or not uuid:
            raise ImportFormatError(f"{source}: line {number}: a {entry['type']} entry with no uuid",
                                    source=source, location=f"line {number}")
        if not isinstance(entry.get("message"), dict):
            raise ImportFormatError(f"{source}: line {number}: the {entry['type']} entry's message is not an object",
                                    source=source, location=f"line {number}")
        # Claude Code writes every entry's time as ISO 8601: anything else is an error naming
        # the line (as llm's datetime_utc is), on side chains and abandoned branches too
        times[number] = _entry_time(entry, number, source)
        if uuid in entries and entries[uuid][1].get("type") in _CONVERSATION:
            continue  # a copy of an entry written before (a resumed session replays its history)
        entries[uuid] = (number, entry)
        if entry.get("isSidechain"):
            sidechain += 1
        else:
            main.append((number, entry))
    if not main:
        raise ImportFormatError(f"{source}: no conversation entry outside side chains: not a Claude Code session file?",
                                source=source)
    last_main = main[-1]
    chain = _main_chain(entries, main, warnings)
    on_chain = {id(e) for _, e in chain}
    for count, reason in ((sidechain, SKIP_SIDECHAIN),
                          (sum(1 for _, e in main if id(e) not in on_chain and not e.get("isMeta")), SKIP_BRANCH)):
        if count:
            skipped[reason] = skipped.get(reason, 0) + count
    chain = [(n, e) for n, e in chain if e.get("type") in _CONVERSATION]

    # the file's first main-line entry names it for good: a session resumed later writes its
    # new entries under a new sessionId, and importing the grown file must find the same session
    session_id = next((str(e["sessionId"]) for _, e in main if isinstance(e.get("sessionId"), str)
                       and e["sessionId"]), None)
    metadata: dict[str, Any] = {}
    for key, name in (("cwd", "claude_code_cwd"), ("gitBranch", "claude_code_git_branch"),
                      ("version", "claude_code_version")):
        value = last_main[1].get(key)
        if isinstance(value, str) and value:
            metadata[name] = value
    # the conversation began at its first timed entry and was last active at its last one
    # (a reply, often long after the prompt): entries with no timestamp do not count
    timed = [t for t in (times[number] for number, _ in chain) if t is not None]
    created = min(timed) if timed else None
    updated = max(timed) if timed else None

    turns: list[ImportedTurn] = []
    open_calls: dict[str, ToolCall] = {}
    current_turn: ImportedTurn | None = None
    model_msg: dict[str, Any] | None = None  # the MODEL message being assembled (one message.id)

    def flush_model() -> None:
        nonlocal model_msg
        if model_msg is None or current_turn is None:
            model_msg = None
            return
        stop = normalize_finish_reason(model_msg["stop"])
        cut = stop if stop in TRUNCATING_FINISH_REASONS.values() else None
        msg = Message.model(
            "".join(model_msg["text"]) or None,
            model_msg["calls"],
            reasoning="".join(model_msg["thinking"]) or None,
            finish_reason=cut,
        )
        if msg.content is not None or msg.tool_calls or msg.reasoning:
            close_calls()  # a reply never follows unanswered calls in chatflow's history
            current_turn.messages.append(msg)
            current_turn.times.append(model_msg["at"])
            current_turn.finish_reason = cut  # the turn's last reply says how it ended
        for call in model_msg["calls"]:
            open_calls[call.id] = call
        if model_msg["model"]:
            current_turn.model = model_msg["model"]
        if model_msg["usage"]:
            usage = current_turn.usage
            for key in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
                value = model_msg["usage"].get(key)
                if isinstance(value, int) and not isinstance(value, bool):
                    usage[key] = usage.get(key, 0) + value
        model_msg = None

    def close_calls() -> None:
        if current_turn is None:
            return
        for call in list(open_calls.values()):
            current_turn.messages.append(Message.tool(call.id, NO_RESULT, name=call.name, is_error=True))
            current_turn.times.append(None)
        open_calls.clear()

    def end_turn() -> None:
        # a turn that ends while tool calls wait (a tool still running, Claude Code stopped)
        # is closed as chatflow closes an interrupted turn: synthetic results, marked interrupted
        if open_calls and current_turn is not None:
            current_turn.outcome = "interrupted"
        open_calls.clear()

    local = _local_commands(chain)
    for number, entry in chain:
        if number in local:
            count_skipped(skipped, SKIP_LOCAL)  # not a prompt: no turn, the reply before it goes on
            continue
        if entry.get("isMeta"):
            count_skipped(skipped, SKIP_META)
            continue
        if entry.get("isCompactSummary"):
            count_skipped(skipped, SKIP_SUMMARY)  # what Claude Code sent in place of the turns before it
            continue
        message = entry["message"]
        content = message.get("content")
        if entry["type"] == "assistant":
            blocks = content if isinstance(content, list) else [{"type": "text", "text": _text_of(content)}]
            msg_id = message.get("id") or entry["uuid"]
            if model_msg is not None and model_msg["id"] != msg_id:
                flush_model()
            if current_turn is None:
                count_skipped(skipped, SKIP_BEFORE_USER)
                continue
            if model_msg is None:
                model_msg = {"id": msg_id, "text": [], "thinking": [], "calls": [], "model": None, "usage": None,
                             "at": times[number], "stop": None}
            for block in blocks:
                if not isinstance(block, dict):
                    continue
                kind = block.get("type")
                if kind == "text":
                    model_msg["text"].append(str(block.get("text") or ""))
                elif kind in ("thinking", "redacted_thinking"):
                    model_msg["thinking"].append(str(block.get("thinking") or ""))
                elif kind in ("tool_use", "server_tool_use"):
                    call_id = str(block.get("id") or f"{entry['uuid']}:{len(model_msg['calls'])}")
                    model_msg["calls"].append(
                        ToolCall(call_id, str(block.get("name") or "tool"),
                                 json.dumps(block.get("input") or {}, ensure_ascii=False))
                    )
            if isinstance(message.get("model"), str) and message["model"] != "<synthetic>":
                model_msg["model"] = message["model"]
            if isinstance(message.get("stop_reason"), str):  # the message's last line has it
                model_msg["stop"] = message["stop_reason"]
            if isinstance(message.get("usage"), dict):
                model_msg["usage"] = message["usage"]  # repeated on each line of one message: keep one
            continue
        # a user entry
        flush_model()
        user_blocks: list[Any] = content if isinstance(content, list) else []
        results = [b for b in user_blocks if isinstance(b, dict) and b.get("type") == "tool_result"]
        text_blocks = [b for b in user_blocks if not (isinstance(b, dict) and b.get("type") == "tool_result")]
        for block in results:
            call_id = str(block.get("tool_use_id") or "")
            call = open_calls.pop(call_id, None)
            if call is None or current_turn is None:
                warnings.append(f"line {number}: a tool result for {call_id or '?'} answers no open tool call; skipped")
                count_skipped(skipped, SKIP_ORPHAN_RESULT)
                continue
            current_turn.messages.append(
                Message.tool(call_id, _text_of(block.get("content")), name=call.name,
                             is_error=bool(block.get("is_error")))
            )
            current_turn.times.append(times[number])
        text = content if isinstance(content, str) else (_text_of(text_blocks) if text_blocks else "")
        if not text.strip():
            continue
        end_turn()
        current_turn = ImportedTurn(key=entry["uuid"], messages=[Message.user(text)], created_at=times[number],
                                    location=f"line {number}", times=[times[number]])
        turns.append(current_turn)
    flush_model()
    end_turn()
    sid = session_id or source.rsplit("/", 1)[-1].removesuffix(".jsonl")
    return [
        ImportedSession(
            source="claude-code",
            source_id=sid,
            session_id=sid,
            metadata=metadata,
            model=next((t.model for t in turns if t.model), None),
            created_at=created,
            updated_at=updated,
            turns=turns,
            warnings=warnings,
            skipped=skipped,
        )
    ]
