"""Read llm's ``logs.db`` (Simon Willison's ``llm`` CLI) directly, read-only, without llm.

Three schema generations exist, and a file may hold several (older conversations stay in
the old tables after an upgrade); this reader takes every conversation of each:

* **logs** (llm 0.4 and early 0.5 builds; ``log`` before llm renamed it): one row a prompt
  and its reply, ``chat_id`` naming a conversation's first row. llm 0.5 moved to the
  ``responses`` tables and kept this one when it held rows; each conversation in it is a
  session ``llm-log-<first row id>``.

* **responses** (llm up to 0.2x): ``conversations`` (id, name, model) and one ``responses``
  row per model call (``prompt``, ``system``, ``response``, ``datetime_utc``,
  ``input_tokens``/``output_tokens``, ``model``/``resolved_model``), with ``tool_calls``
  (the calls a response made) and ``tool_results`` (the results sent *with* a response's
  prompt). A response with a prompt starts a turn; a response with no prompt that carries
  tool results continues the turn before it (llm's tool loop). Fragments
  (``prompt_fragments``/``system_fragments``) are part of what was sent, so their text
  comes first in the prompt or system text, as llm sends it. Attachments become the user
  message's attachments, their bytes from llm's ``content`` column or the file at their
  ``path``; one chatflow cannot keep (a URL, a file gone, a type chatflow does not send)
  becomes a line ``[attachment: <type> <path or url>]`` after the prompt text.
* **threads** (llm 0.3x): ``threads`` (id, name, ``tip_message_hash``), a content-addressed
  ``messages`` tree (``parent_hash``, ``role``) whose ``parts`` hold text, reasoning, tool
  calls and results, and ``turns`` (one model call: model, tokens, and the tip message it
  produced). Each thread is walked from its tip to the root; a fork is a thread of its own
  and becomes a session holding the shared beginning too. A text part whose text lives in
  fragments (``payload`` ``{"text_ref": [{"fragment": id} | {"literal": str}]}``) is
  rebuilt from them; attachment parts of a user message become its attachments as above
  (else, and in a tool result, the ``[attachment: ...]`` line).

Each conversation (or thread) becomes a session whose id is llm's conversation (thread)
id, and whose source identity is ``llm:<id>`` in both generations: llm gives a conversation
continued after the upgrade a thread with the conversation's id (its chain holds the older
turns too, rebuilt from the responses rows, with no ``turns`` row), and each model call a
``turns`` row with the response's id. So a conversation found in both is one session: the
older tables' turns, then the thread's newer ones; and a turn's key is its first response's
id (the id of the ``turns`` row of its first call), whichever tables it is read from, so
importing a ``logs.db`` again after llm upgraded it adds only the new turns. Each user
prompt a turn with its model's replies, tool calls, tool results, the model and the token
usage (summed over the calls of the turn).

A reply whose response JSON llm stored (``responses.response_json``, ``turns.response_json``)
says it was cut (``finish_reason`` ``length`` or ``content_filter``, Anthropic's
``max_tokens``...) keeps that mark, on the MODEL message and the turn, as chatflow marks a
cut reply of its own. A tool call with no result in the log is answered ``"No result in the
imported log."`` when the model replied again in the same turn; when the turn ends with it
unanswered (the tool loop stopped), the turn is closed as chatflow closes an interrupted
turn, with synthetic results, not as a completed one. The conversation's name and llm's
id go into the session's metadata (``llm_name``, ``llm_id``).
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..stream import TRUNCATING_FINISH_REASONS, normalize_finish_reason
from ..attachments import MAX_IMAGE_BYTES, Attachment, attachment_from_bytes
from ..errors import AttachmentError, ImportFormatError
from ..messages import Message, Role, ToolCall
from .claude_code import NO_RESULT, SKIP_BEFORE_USER, SKIP_ORPHAN_RESULT
from .records import ImportedSession, ImportedTurn, count_skipped, parse_time

__all__ = ["is_sqlite_file", "read_llm_logs"]

_SQLITE_MAGIC = b"SQLite format 3\x00"


def is_sqlite_file(path: str | Path) -> bool:
    """True when the file starts with SQLite's header."""
    try:
        with open(path, "rb") as handle:
            return handle.read(16) == _SQLITE_MAGIC
    except OSError:
        return False


def _open(path: str | Path) -> sqlite3.Connection:
    uri = Path(path).resolve().as_uri() + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True)
    conn.row_factory = sqlite3.Row
    return conn


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info([{table}])")}


def read_llm_logs(path: str | Path) -> list[ImportedSession]:
    """Every conversation of an llm ``logs.db``, oldest first.

    Raises:
        ImportFormatError: the file is not a SQLite database with llm's tables, or a row
            cannot be read (naming the table and row id).
    """
    source = str(path)
    try:
        conn = _open(path)
        try:
            tables = _tables(conn)
            oldest = _oldest_table(conn, tables)
            if not ({"responses", "conversations"} <= tables or {"threads", "messages", "parts"} <= tables
                    or oldest is not None):
                raise ImportFormatError(
                    f"{source}: not an llm logs.db (no responses/conversations or threads/messages/parts tables)",
                    source=source,
                )
            _check_references(conn, tables, source)
            sessions: list[ImportedSession] = []
            if oldest is not None:
                sessions += _read_oldest(conn, oldest, source)
            if {"responses", "conversations"} <= tables:
                sessions += _read_responses(conn, tables, source)
            if {"threads", "messages", "parts"} <= tables:
                older = {s.session_id: s for s in sessions}
                for thread, legacy in _read_threads(conn, tables, source):
                    if thread.session_id in older:
                        _merge(older[thread.session_id], thread, legacy)
                    else:
                        sessions.append(thread)
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise ImportFormatError(f"{source}: cannot read it as an llm logs.db: {exc}", source=source) from None
    sessions.sort(key=lambda s: (s.created_at or 0.0, s.session_id))
    return sessions


#: ``(table, key column, column, referenced table, referenced column)``: the references llm
#: declares as foreign keys and always keeps (it never deletes a response, message, part or
#: thread), so a row naming one that is not there was written or edited by something else.
_REFERENCES = (
    ("responses", "id", "conversation_id", "conversations", "id"),
    ("tool_calls", "id", "response_id", "responses", "id"),
    ("tool_results", "id", "response_id", "responses", "id"),
    ("threads", "id", "tip_message_hash", "messages", "hash"),
    ("threads", "id", "forked_from", "threads", "id"),
    ("messages", "hash", "parent_hash", "messages", "hash"),
    ("parts", "id", "message_hash", "messages", "hash"),
    ("turns", "id", "tip_message_hash", "messages", "hash"),
)
#: The roles llm writes in ``messages.role``, and the part types in ``parts.type``.
_ROLES = ("system", "user", "assistant", "tool")
_PART_TYPES = ("text", "reasoning", "tool_call", "tool_result", "attachment")


def _check_references(conn: sqlite3.Connection, tables: set[str], source: str) -> None:
    """Refuse rows llm never writes: a reference to a row that is not there (a message whose
    parent is gone, a part of no message, a tool call of no response...), a message role or
    a part type llm does not know, a message with no parts or whose parts skip a position
    (one is gone), a message no thread reaches (its thread is gone).

    Raises:
        ImportFormatError: naming the table, row and column (the first such row found).
    """
    for table, key, column, target, target_key in _REFERENCES:
        if not {table, target} <= tables or not {key, column} <= _columns(conn, table):
            continue
        row = conn.execute(
            f"SELECT t.[{key}] AS k, t.[{column}] AS v FROM [{table}] t WHERE t.[{column}] IS NOT NULL "
            f"AND NOT EXISTS (SELECT 1 FROM [{target}] r WHERE r.[{target_key}] = t.[{column}]) "
            f"ORDER BY t.rowid LIMIT 1"
        ).fetchone()
        if row is not None:
            raise _bad(source, f"{table} row {row['k']}",
                       f"{column} names no {target} row: {str(row['v'])[:40]!r}")
    for table, key, column, known in (("messages", "hash", "role", _ROLES), ("parts", "id", "type", _PART_TYPES)):
        if table not in tables or not {key, column} <= _columns(conn, table):
            continue
        marks = ", ".join("?" for _ in known)
        row = conn.execute(f"SELECT [{key}] AS k, [{column}] AS v FROM [{table}] WHERE [{column}] IS NULL "
                           f"OR [{column}] NOT IN ({marks}) ORDER BY rowid LIMIT 1", known).fetchone()
        if row is not None:
            raise _bad(source, f"{table} row {row['k']}",
                       f"{column} is not one llm writes ({', '.join(known)}): {str(row['v'])[:40]!r}")
    if "parts" in tables and {"message_hash", "position"} <= _columns(conn, "parts"):
        # llm numbers a message's parts 0, 1, 2...: a gap is a part that is gone
        row = conn.execute(
            "SELECT message_hash AS k, COUNT(*) AS n, MIN(position) AS low, MAX(position) AS high FROM parts "
            "GROUP BY message_hash HAVING MIN(position) != 0 OR MAX(position) != COUNT(*) - 1 LIMIT 1"
        ).fetchone()
        if row is not None:
            raise _bad(source, f"messages row {row['k']}",
                       f"its parts are at positions {row['low']}..{row['high']}, not 0..{row['n'] - 1}: "
                       "a part is missing")
    if {"messages", "parts"} <= tables and "message_hash" in _columns(conn, "parts"):
        # llm writes a message only with its parts (a prompt with no text and no attachment,
        # a reply with nothing in it, makes no message): one with none lost them
        row = conn.execute("SELECT m.hash AS k FROM messages m WHERE NOT EXISTS "
                           "(SELECT 1 FROM parts p WHERE p.message_hash = m.hash) ORDER BY m.rowid LIMIT 1").fetchone()
        if row is not None:
            raise _bad(source, f"messages row {row['k']}",
                       "no parts rows (llm writes every message with at least one part): its parts are missing")
    if {"threads", "messages"} <= tables:
        # every message llm writes is on the chain of a thread (a fork's too): one no thread
        # reaches is a conversation whose thread is gone
        row = conn.execute(
            "WITH RECURSIVE reached(hash) AS (SELECT tip_message_hash FROM threads "
            "UNION SELECT m.parent_hash FROM messages m JOIN reached r ON m.hash = r.hash "
            "WHERE m.parent_hash IS NOT NULL) "
            "SELECT hash AS k FROM messages WHERE hash NOT IN (SELECT hash FROM reached WHERE hash IS NOT NULL) "
            "ORDER BY rowid LIMIT 1"
        ).fetchone()
        if row is not None:
            raise _bad(source, f"messages row {row['k']}", "no thread reaches it (its thread is gone)")


def _merge(older: ImportedSession, thread: ImportedSession, legacy: set[str]) -> None:
    """Add to ``older`` (a conversation read from the responses tables) the turns of the
    thread with the same id (llm 0.3x continued it: a thread's id is its conversation's id).

    The thread holds the whole conversation: the turns llm rebuilt from the responses rows
    (``legacy``: no ``turns`` row made them, so they are the older turns at the same place)
    and the turns logged since (a ``turns`` row whose id is the response id, in both tables
    while llm wrote both). The older tables' reading is kept for the turns they have (same
    keys as before the upgrade); the new turns follow.
    """
    keys = {t.key for t in older.turns}
    for position, turn in enumerate(thread.turns):
        if turn.key in keys or (turn.key in legacy and position < len(older.turns)):
            continue
        older.turns.append(turn)
    older.warnings += thread.warnings
    for reason, n in thread.skipped.items():
        count_skipped(older.skipped, reason, n)
    older.model = older.model or thread.model


def _fragments(conn: sqlite3.Connection, tables: set[str], table: str, response_id: str, source: str) -> list[str]:
    if table not in tables or "fragments" not in tables:
        return []
    rows = conn.execute(
        f"SELECT f.id, f.content FROM [{table}] pf JOIN fragments f ON f.id = pf.fragment_id "
        "WHERE pf.response_id = ? ORDER BY pf.[order]",
        (response_id,),
    )
    return [str(_text_row(row, source, f"fragments row {row['id']}")["content"] or "") for row in rows]


def _attachment_line(row: sqlite3.Row) -> str:
    where = row["path"] or row["url"] or row["id"]
    return f"[attachment: {row['type'] or 'file'} {where}]"


def _as_attachment(row: sqlite3.Row) -> Attachment | None:
    """An llm attachment row as a chatflow attachment: its bytes from the ``content`` column,
    else from the file at its ``path`` (llm reads it there); None when there are none (a URL,
    a file gone) or they are not a type chatflow sends (the row then stays a text line)."""
    keys = row.keys()
    data = row["content"] if "content" in keys else None
    path = row["path"] if "path" in keys else None
    if data is None and path:
        try:
            with open(path, "rb") as handle:
                data = handle.read(MAX_IMAGE_BYTES + 1)
        except OSError:
            return None
    if not data:
        return None
    try:
        return attachment_from_bytes(bytes(data), os.path.basename(path) if path else None)
    except AttachmentError:
        return None


def _prompt_attachments(conn: sqlite3.Connection, tables: set[str],
                        response_id: str) -> tuple[list[str], list[Attachment]]:
    """A prompt's attachments: those chatflow can keep as attachments, and a text line for each other."""
    if not {"prompt_attachments", "attachments"} <= tables:
        return [], []
    rows = conn.execute(
        "SELECT a.* FROM prompt_attachments pa JOIN attachments a ON a.id = pa.attachment_id "
        "WHERE pa.response_id = ? ORDER BY pa.[order]",
        (response_id,),
    )
    lines: list[str] = []
    kept: list[Attachment] = []
    for row in rows:
        attachment = _as_attachment(row)
        if attachment is None:
            lines.append(_attachment_line(row))
        else:
            kept.append(attachment)
    return lines, kept


def _article(word: str) -> str:
    """``an`` before a vowel (``an assistant``), else ``a``."""
    return "an" if word[:1].lower() in "aeiou" else "a"


def _join(*parts: str) -> str:
    return "\n".join(p for p in parts if p)


def _bad(source: str, where: str, problem: str) -> ImportFormatError:
    return ImportFormatError(f"{source}: {where}: {problem}", source=source, location=where)


def _text_row(row: sqlite3.Row, source: str, where: str) -> sqlite3.Row:
    """``row`` when none of its columns holds a BLOB (llm writes text, numbers or NULL in
    every column this reader takes).

    Raises:
        ImportFormatError: naming ``where`` (``responses row 01h…``) and the column.
    """
    for name in row.keys():  # noqa: SIM118 (sqlite3.Row has no __contains__ for names)
        if isinstance(row[name], bytes):
            raise _bad(source, where, f"{name} is not text (a BLOB of {len(row[name])} bytes)")
    return row


def _time(value: Any, source: str, where: str) -> float | None:
    try:
        return parse_time(value)
    except ImportFormatError as exc:
        raise _bad(source, where, f"datetime_utc is {exc}") from None


def _usage(row: sqlite3.Row, into: dict[str, Any], source: str, where: str) -> None:
    """Add the row's ``input_tokens``/``output_tokens`` to ``into``. llm writes the counts
    its model plugin reports, an integer or NULL (NULL: unknown, left out).

    Raises:
        ImportFormatError: a count that is text, negative or fractional, naming the row.
    """
    for key in ("input_tokens", "output_tokens"):
        value = row[key] if key in row.keys() else None  # noqa: SIM118
        if value is None:
            continue
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise _bad(source, where, f"{key} is not a token count: {str(value)[:40]!r}")
        into[key] = into.get(key, 0) + value


def _arguments(value: Any, source: str, where: str, warnings: list[str]) -> str:
    """A tool call's arguments as JSON text. llm parses what the model sent and keeps what
    does not parse as ``{"_raw": "<the text>"}``; it writes the result as JSON (a column of
    JSON text in 0.2x, a JSON value in the part's payload in 0.3x), so JSON that is not an
    object (a model may send ``[1, 2]``) is kept as it is, with a warning, and
    ``{"_raw": ...}`` is kept as it is.

    Raises:
        ImportFormatError: text that is not JSON (llm never writes it), naming the row.
    """
    if value is None:
        return "{}"
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            raise _bad(source, where, f"tool call arguments are not JSON: {value[:40]!r}") from None
        text = value
    else:
        parsed, text = value, json.dumps(value, ensure_ascii=False)
    if not isinstance(parsed, dict):
        warnings.append(f"{where}: tool call arguments are a JSON {type(parsed).__name__}, not an object; "
                        "kept as they are")
    return text


def _close_calls(turn: ImportedTurn | None, open_calls: dict[str, ToolCall]) -> None:
    """Answer the calls still open before the model's next reply in the same turn with
    ``NO_RESULT`` (marked as an error): llm logged no result for them, and a reply never
    follows unanswered calls in chatflow's history."""
    if turn is not None:
        for call in open_calls.values():
            _add(turn, Message.tool(call.id, NO_RESULT, name=call.name, is_error=True), None)
    open_calls.clear()


def _add(turn: ImportedTurn, message: Message, at: float | None) -> None:
    """Append ``message`` to ``turn`` with its time in the source (None: the one before it)."""
    while len(turn.times) < len(turn.messages):
        turn.times.append(None)
    turn.messages.append(message)
    turn.times.append(at)


def _end_turn(turn: ImportedTurn | None, open_calls: dict[str, ToolCall]) -> None:
    """End ``turn``: when tool calls of it are still unanswered (llm stopped the tool loop, or
    was stopped, before it logged a result), it is closed as chatflow closes an interrupted
    turn (``outcome`` ``"interrupted"``: the import adds the synthetic results), never as
    if it had completed."""
    if turn is not None and open_calls:
        turn.outcome = "interrupted"
    open_calls.clear()


def _cut_reason(response_json: Any) -> str | None:
    """``"length"`` or ``"content_filter"`` when the response JSON llm stored says the reply was
    cut, else None. llm stores what its model plugin got: the OpenAI plugin a
    ``finish_reason`` (at the top of a streamed reply's JSON, in ``choices[0]`` of one that
    was not streamed), Anthropic's a ``stop_reason`` (``max_tokens``), Gemini's a
    ``finishReason`` in ``candidates[0]`` (``MAX_TOKENS``). JSON that does not parse or says
    nothing of it is a reply that was not cut."""
    if not isinstance(response_json, str):
        return None
    try:
        data = json.loads(response_json)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    found: Any = data.get("finish_reason") or data.get("stop_reason")
    for key, name in (("choices", "finish_reason"), ("candidates", "finishReason")):
        first = data.get(key)
        if not found and isinstance(first, list) and first and isinstance(first[0], dict):
            found = first[0].get(name)
    reason = normalize_finish_reason(found.lower() if isinstance(found, str) else None)
    return reason if reason in TRUNCATING_FINISH_REASONS.values() else None


#: The columns of llm's oldest table generation (``log``, renamed ``logs``: llm 0.4 and the
#: first 0.5 builds; llm 0.5 moved to ``responses`` and kept the old table when it held rows).
_OLDEST = ("logs", "log")


def _oldest_table(conn: sqlite3.Connection, tables: set[str]) -> str | None:
    """The name of the oldest generation's table holding a prompt and a response, if any."""
    for name in _OLDEST:
        if name in tables and {"id", "prompt", "response"} <= _columns(conn, name):
            return name
    return None


def _read_oldest(conn: sqlite3.Connection, table: str, source: str) -> list[ImportedSession]:
    """The conversations of llm's oldest table (``logs``, or ``log`` before llm renamed it):
    one row a prompt and its reply; a row continuing a conversation names its first row in
    ``chat_id``. Each conversation is a session ``llm-log-<first row id>`` (source identity
    ``llm:log:<id>``); its time is ``datetime_utc`` (``timestamp_utc`` or ``timestamp`` in
    older builds)."""
    columns = _columns(conn, table)
    time_col = next((c for c in ("datetime_utc", "timestamp_utc", "timestamp") if c in columns), None)
    chat = "chat_id" if "chat_id" in columns else "NULL"
    extra = "".join(f", [{c}]" for c in ("system", "model", "response_json") if c in columns)
    when = f", [{time_col}] AS at" if time_col else ", NULL AS at"
    rows = conn.execute(f"SELECT id, prompt, response, {chat} AS chat_id{extra}{when} FROM [{table}] "
                        "ORDER BY id").fetchall()
    by_chat: dict[str, list[sqlite3.Row]] = {}
    for row in rows:
        by_chat.setdefault(str(row["chat_id"] if row["chat_id"] is not None else row["id"]), []).append(row)
    sessions = []
    for chat_id, chat_rows in by_chat.items():
        session = ImportedSession(source="llm", source_id=f"llm:log:{chat_id}", session_id=f"llm-log-{chat_id}",
                                  metadata={"llm_id": chat_id, "llm_table": table})
        for row in chat_rows:
            where = f"{table} row {row['id']}"
            _text_row(row, source, where)
            at = _time(row["at"], source, where)
            if session.created_at is None:
                session.created_at = at
            system = row["system"] if "system" in columns else None
            if system and not session.system:
                session.system.append(str(system))
            elif system and system not in session.system:
                session.warnings.append(f"{where}: a later system prompt differs from the first; the first is kept")
            cut = _cut_reason(row["response_json"] if "response_json" in columns else None)
            turn = ImportedTurn(key=f"{table}:{row['id']}", messages=[Message.user(str(row["prompt"] or ""))],
                                created_at=at, location=where, finish_reason=cut)
            if row["response"]:
                turn.messages.append(Message.model(str(row["response"]), finish_reason=cut))
            model = row["model"] if "model" in columns else None
            if model:
                turn.model = str(model)
                session.model = session.model or str(model)
            session.turns.append(turn)
        sessions.append(session)
    return sessions


def _read_responses(conn: sqlite3.Connection, tables: set[str], source: str) -> list[ImportedSession]:
    columns = _columns(conn, "responses")
    reasoning_col = ", reasoning" if "reasoning" in columns else ""
    token_cols = ", input_tokens, output_tokens" if "input_tokens" in columns else ""
    resolved_col = ", resolved_model" if "resolved_model" in columns else ""
    json_col = ", response_json" if "response_json" in columns else ""
    has_tools = {"tool_calls", "tool_results"} <= tables
    names = {row["id"]: row["name"] for row in conn.execute("SELECT id, name FROM conversations")}
    rows = conn.execute(
        f"SELECT rowid, id, model, prompt, system, response, conversation_id, datetime_utc{reasoning_col}"
        f"{token_cols}{resolved_col}{json_col} FROM responses ORDER BY datetime_utc, rowid"
    ).fetchall()
    by_conversation: dict[str, list[sqlite3.Row]] = {}
    for row in rows:
        by_conversation.setdefault(row["conversation_id"] or row["id"], []).append(row)
    sessions = []
    for conv_id, responses in by_conversation.items():
        session = ImportedSession(source="llm", source_id=f"llm:{conv_id}", session_id=str(conv_id),
                                  metadata={"llm_id": conv_id})
        if names.get(conv_id):
            session.metadata["llm_name"] = names[conv_id]
        turn: ImportedTurn | None = None
        open_calls: dict[str, ToolCall] = {}
        for row in responses:
            where = f"responses row {row['id']}"
            _text_row(row, source, where)
            at = _time(row["datetime_utc"], source, where)
            if session.created_at is None:
                session.created_at = at
            system = _join(*_fragments(conn, tables, "system_fragments", row["id"], source), row["system"] or "")
            if system and system not in session.system:
                if session.system:
                    session.warnings.append(f"{where}: a later system prompt differs from the first; the first is kept")
                else:
                    session.system.append(system)
            results = []
            if has_tools:
                results = conn.execute(
                    "SELECT rowid, * FROM tool_results WHERE response_id = ? ORDER BY id", (row["id"],)
                ).fetchall()
            if turn is not None:
                for result in results:
                    _text_row(result, source, f"tool_results row {result['id']}")
                    call = open_calls.pop(result["tool_call_id"] or "", None)
                    if call is None:
                        session.warnings.append(f"tool_results row {result['id']}: answers no open tool call; skipped")
                        count_skipped(session.skipped, SKIP_ORPHAN_RESULT)
                        continue
                    error = result["exception"] if "exception" in result.keys() else None
                    _add(turn, Message.tool(call.id, str(result["output"] or error or ""), name=call.name,
                                            is_error=bool(error)), at)
            lines, attached = _prompt_attachments(conn, tables, row["id"])
            prompt = _join(*_fragments(conn, tables, "prompt_fragments", row["id"], source), row["prompt"] or "",
                           *lines)
            if prompt or attached:
                _end_turn(turn, open_calls)
                turn = ImportedTurn(key=str(row["id"]), messages=[Message.user(prompt, attached)], created_at=at,
                                    location=where, times=[at])
                session.turns.append(turn)
            elif turn is None:
                session.warnings.append(f"{where}: a response with no prompt and nothing before it; skipped")
                count_skipped(session.skipped, SKIP_BEFORE_USER)
                continue
            calls: list[ToolCall] = []
            if has_tools:
                for call_row in conn.execute(
                    "SELECT id, name, arguments, tool_call_id FROM tool_calls WHERE response_id = ? ORDER BY id",
                    (row["id"],),
                ):
                    call_where = f"tool_calls row {call_row['id']}"
                    _text_row(call_row, source, call_where)
                    call_id = call_row["tool_call_id"] or f"{row['id']}:{call_row['id']}"
                    calls.append(ToolCall(str(call_id), str(call_row["name"] or "tool"),
                                          _arguments(call_row["arguments"], source, call_where, session.warnings)))
            reasoning = row["reasoning"] if reasoning_col else None
            text = row["response"]
            cut = _cut_reason(row["response_json"] if json_col else None)
            if text or calls or reasoning:
                _close_calls(turn, open_calls)  # a reply never follows unanswered calls in chatflow's history
                _add(turn, Message.model(text or None, calls, reasoning=reasoning or None, finish_reason=cut), at)
            turn.finish_reason = cut  # the turn's last reply says how it ended
            for call in calls:
                open_calls[call.id] = call
            model = (row["resolved_model"] if resolved_col else None) or row["model"]
            if model:
                turn.model = str(model)
                session.model = session.model or str(model)
            if token_cols:
                _usage(row, turn.usage, source, where)
        _end_turn(turn, open_calls)
        if session.turns:
            sessions.append(session)
    return sessions


def _part_text(conn: sqlite3.Connection, tables: set[str], part: sqlite3.Row, payload: dict[str, Any],
               source: str) -> str:
    if part["text"] is not None:
        return str(part["text"])
    if "text" in payload and isinstance(payload["text"], str):
        return payload["text"]
    pieces: list[str] = []
    for ref in payload.get("text_ref") or []:
        if isinstance(ref, dict) and "literal" in ref:
            pieces.append(str(ref["literal"]))
        elif isinstance(ref, dict) and "fragment" in ref and "fragments" in tables:
            found = conn.execute("SELECT id, content FROM fragments WHERE id = ?", (ref["fragment"],)).fetchone()
            if found is None:
                raise _bad(source, f"parts row {part['id']}", f"fragment {ref['fragment']} is missing")
            pieces.append(str(_text_row(found, source, f"fragments row {found['id']}")["content"] or ""))
    return "".join(pieces)


def _part_attachment(conn: sqlite3.Connection, tables: set[str], ref: Any,
                     kept: list[Attachment] | None = None) -> str:
    """The ``[attachment: <type> <path or url>]`` line of an attachment a part refers to: llm
    stores ``{"id": <content hash>}`` in the part and the type, path and url in the
    ``attachments`` table (an inline ``type``/``path``/``url`` is taken as it is). With
    ``kept``, an attachment whose bytes chatflow can keep is appended there instead ("" returned)."""
    ref = ref if isinstance(ref, dict) else {}
    found = None
    if ref.get("id") is not None and "attachments" in tables:
        found = conn.execute("SELECT * FROM attachments WHERE id = ?", (str(ref["id"]),)).fetchone()
    if found is not None:
        attachment = _as_attachment(found) if kept is not None else None
        if attachment is not None and kept is not None:
            kept.append(attachment)
            return ""
        return _attachment_line(found)
    where = ref.get("path") or ref.get("url") or ref.get("id") or ""
    return f"[attachment: {ref.get('type') or 'file'} {where}]".replace(" ]", "]")


def _read_threads(conn: sqlite3.Connection, tables: set[str],
                  source: str) -> list[tuple[ImportedSession, set[str]]]:
    """Each thread as a session, with the keys of its turns no ``turns`` row made (llm
    rebuilt them from the older tables when a conversation was continued after the upgrade).

    A turn's key is the id of the ``turns`` row of its first model call: llm gives that row
    the response's id, the key the same turn has in the older tables. A thread's session
    has its conversation's ``source_id`` (``llm:<id>``), so a conversation keeps its identity
    across the upgrade."""
    sessions = []
    turn_rows: dict[str, sqlite3.Row] = {}
    if "turns" in tables:
        for row in conn.execute("SELECT * FROM turns ORDER BY datetime_utc, rowid"):
            turn_rows.setdefault(row["tip_message_hash"], _text_row(row, source, f"turns row {row['id']}"))
    for thread in conn.execute("SELECT * FROM threads ORDER BY datetime_utc, rowid").fetchall():
        where = f"threads row {thread['id']}"
        _text_row(thread, source, where)
        chain: list[sqlite3.Row] = []
        current = thread["tip_message_hash"]
        seen: set[str] = set()
        warnings: list[str] = []
        skipped: dict[str, int] = {}
        while current:
            if current in seen:
                raise ImportFormatError(f"{source}: {where}: the message chain loops at {current}",
                                        source=source, location=where)
            seen.add(current)
            row = conn.execute("SELECT * FROM messages WHERE hash = ?", (current,)).fetchone()
            if row is None:
                warnings.append(f"{where}: message {current} is missing; the thread starts after it")
                break
            chain.append(_text_row(row, source, f"messages row {row['hash']}"))
            current = row["parent_hash"]
        chain.reverse()
        session = ImportedSession(source="llm", source_id=f"llm:{thread['id']}", session_id=str(thread["id"]),
                                  metadata={"llm_id": thread["id"]}, warnings=warnings, skipped=skipped,
                                  created_at=_time(thread["datetime_utc"], source, where))
        if thread["name"]:
            session.metadata["llm_name"] = thread["name"]
        if thread["forked_from"]:
            session.metadata["llm_forked_from"] = thread["forked_from"]
        turn: ImportedTurn | None = None
        legacy: set[str] = set()  # keys of turns no turns row made (yet)
        open_calls: dict[str, ToolCall] = {}
        # each message's time: that of the model call that sent it or produced it -- the
        # first turns row at or after it on the chain (a prompt or tool results go out with
        # the next call, a reply is its call's tip); None where no call follows (turns llm
        # rebuilt from the older tables)
        call_times: list[float | None] = []
        upcoming: float | None = None
        for message in reversed(chain):
            meta = turn_rows.get(message["hash"])
            if meta is not None:
                upcoming = _time(meta["datetime_utc"], source, f"turns row {meta['id']}")
            call_times.append(upcoming)
        call_times.reverse()
        for index, message in enumerate(chain):
            at = call_times[index]
            parts = conn.execute(
                "SELECT * FROM parts WHERE message_hash = ? ORDER BY position", (message["hash"],)
            ).fetchall()
            texts: list[str] = []
            kept: list[Attachment] = []  # a user message's attachments whose bytes are at hand
            reasoning: list[str] = []
            calls: list[ToolCall] = []
            results: list[Message] = []
            for part in parts:
                _text_row(part, source, f"parts row {part['id']}")
                try:
                    payload = json.loads(part["payload"]) if part["payload"] else {}
                except json.JSONDecodeError:
                    raise ImportFormatError(f"{source}: parts row {part['id']}: payload is not JSON",
                                            source=source, location=f"parts row {part['id']}") from None
                if not isinstance(payload, dict):
                    raise ImportFormatError(f"{source}: parts row {part['id']}: payload is not a JSON object",
                                            source=source, location=f"parts row {part['id']}")
                kind = part["type"]
                if kind == "text":
                    texts.append(_part_text(conn, tables, part, payload, source))
                elif kind == "reasoning":
                    reasoning.append(_part_text(conn, tables, part, payload, source))
                elif kind == "tool_call":
                    call_id = payload.get("tool_call_id") or f"{message['hash']}:{part['position']}"
                    calls.append(ToolCall(str(call_id), str(payload.get("name") or part["tool_name"] or "tool"),
                                          _arguments(payload.get("arguments"), source, f"parts row {part['id']}",
                                                     warnings)))
                elif kind == "tool_result":
                    call = open_calls.pop(str(payload.get("tool_call_id") or ""), None)
                    if call is None:
                        warnings.append(f"parts row {part['id']}: a tool result that answers no open tool call; skipped")
                        count_skipped(skipped, SKIP_ORPHAN_RESULT)
                        continue
                    output = payload.get("output")
                    error = payload.get("exception")
                    text = (output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
                            if output is not None else str(error or ""))
                    attached = [_part_attachment(conn, tables, a) for a in payload.get("attachments") or []]
                    results.append(Message.tool(call.id, _join(text, *attached), name=call.name, is_error=bool(error)))
                elif kind == "attachment":
                    texts.append(_part_attachment(conn, tables, payload.get("attachment") or payload,
                                                  kept if message["role"] == "user" else None))
            role = message["role"]
            text = "\n".join(t for t in texts if t)
            if role == "system":
                if text and not session.system:
                    session.system.append(text)
                continue
            if role == "user" and (text or kept):
                _end_turn(turn, open_calls)
                turn = ImportedTurn(key=str(message["hash"]), messages=[Message.user(text, kept)],
                                    location=f"messages row {message['hash']}", times=[at])
                legacy.add(turn.key)
                session.turns.append(turn)
            elif turn is None:
                warnings.append(f"messages row {message['hash']}: {_article(role)} {role} message "
                                "before the first prompt; skipped")
                count_skipped(skipped, SKIP_BEFORE_USER)
                continue
            for result in results:
                _add(turn, result, at)
            if role == "assistant" and (text or calls or reasoning):
                _close_calls(turn, open_calls)
                _add(turn, Message.model(text or None, calls, reasoning="".join(reasoning) or None), at)
                for call in calls:
                    open_calls[call.id] = call
            meta = turn_rows.get(message["hash"])
            if meta is not None:
                if turn.key in legacy:  # the turn's first model call names it
                    legacy.discard(turn.key)
                    turn.key = str(meta["id"])
                model = meta["resolved_model"] or meta["model"]
                if model:
                    turn.model = str(model)
                    session.model = session.model or str(model)
                if turn.created_at is None:
                    turn.created_at = _time(meta["datetime_utc"], source, f"turns row {meta['id']}")
                _usage(meta, turn.usage, source, f"turns row {meta['id']}")
                cut = _cut_reason(meta["response_json"] if "response_json" in meta.keys() else None)  # noqa: SIM118
                last = turn.messages[-1]
                if cut and role == "assistant" and last.role is Role.MODEL:
                    turn.messages[-1] = replace(last, finish_reason=cut)
                turn.finish_reason = cut  # the turn's last model call says how it ended
        _end_turn(turn, open_calls)
        # the conversation began with its first message, not when llm made the thread row
        # (a moment before or after it): the first model call's time
        started = [t.created_at for t in session.turns if t.created_at is not None]
        if started:
            session.created_at = min(started)
        if session.turns:
            sessions.append((session, legacy))
    return sessions
