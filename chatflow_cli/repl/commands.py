"""The REPL's slash commands, apart from the prompt loop.

``/help``, ``/new``, ``/sessions``, ``/switch ID``, ``/show [--full]``, ``/rollback [N]``,
``/retry``, ``/agent [NAME]``, ``/model [NAME]``, ``/metadata [KEY=VALUE]``, ``/search QUERY``,
``/memory``, ``/vault``, ``/fork [N]``, ``/title [TITLE]``, ``/edit``,
``/clear``, ``/exit`` (see :mod:`chatflow_cli.repl`). An unknown command gets a suggestion
when one is close (difflib ratio :data:`_SUGGEST_CUTOFF`) and never reaches the model.
:func:`slash_completions` gives Tab its choices.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import os
import shlex
import subprocess
import tempfile
import threading
from typing import Any

from ..assembly import with_credentials
from ..context import new_session_id, wrap_at_spaces
from ..core.dsn import url_without_userinfo
from ..core.errors import ChatflowError, RunInterrupted, SessionNotFoundError
from ..core.memory import rollback_target
from ..core.messages import Message, Role
from ..render import pretty_json_text, safe_text, sessions_lines
from .host import ReplHost


__all__ = ["COMMANDS", "SlashCommands", "slash_completions"]

#: name -> (arguments, help)
COMMANDS: dict[str, tuple[str, str]] = {
    "/help": ("", "list the commands and keys"),
    "/new": ("", "start a new session"),
    "/sessions": ("", "list recent sessions"),
    "/switch": ("ID", "continue another session"),
    "/show": ("[--full]", "show this session's turns (--full: long tool calls and results unfolded)"),
    "/rollback": ("[N]", "keep turns 1..N (default: drop the last turn); asks first"),
    "/retry": ("", "send the last failed message again (nothing failed: asks to redo the last turn)"),
    "/compact": ("[INSTRUCTIONS]", "summarise every turn but the last into one message (nothing is deleted)"),
    "/agent": ("[NAME]", "list the agents, or make NAME the active agent"),
    "/model": ("[NAME]", "show or change the model"),
    "/metadata": ("[KEY=VALUE]", "show or set the session's metadata"),
    "/memory": ("[mount NAME[:ro] | unmount NAME]", "list the memory stores mounted here, mount or unmount one"),
    "/vault": ("[mount NAME | unmount NAME]", "list the vaults mounted here, mount or unmount one (tools' secrets)"),
    "/search": ("QUERY", "search every session: words, \"a phrase\", OR, NOT, prefix*"),
    "/fork": ("[N]", "copy turns 1..N (default: all) into a new session and continue there"),
    "/title": ("[TITLE]", "show or set this session's title"),
    "/edit": ("", "write the message in $EDITOR (also Ctrl-X Ctrl-E)"),
    "/attach": ("[PATH | clear]", "attach an image or text file to your next message (no PATH: list them)"),
    "/clear": ("", "clear the screen"),
    "/exit": ("", "leave the REPL (also Ctrl-D)"),
}
_ALIASES = {"/quit": "/exit", "/q": "/exit", "/h": "/help", "/?": "/help"}
#: difflib ratio an unknown command needs to get a "did you mean" ("/shwo" vs "/show" is 0.8).
_SUGGEST_CUTOFF = 0.75


class SlashCommands(ReplHost):
    """The REPL's slash commands: ``/help`` … ``/exit``, each a ``cmd_<name>`` method.

    Mixed into :class:`~chatflow_cli.repl.app.Repl`, whose state it uses.
    """

    async def command(self, line: str) -> None:
        """Run a slash command line (``/name args``)."""
        name, _, arg = line.partition(" ")
        name = _ALIASES.get(name.lower(), name.lower())
        arg = arg.strip()
        handler = getattr(self, "cmd_" + name[1:], None) if name in COMMANDS else None
        if handler is None:
            # Only a close match is suggested ("/shwo" -> "/show"); "/" or "/ hello" match nothing.
            close = difflib.get_close_matches(name, [*COMMANDS, *_ALIASES], n=1, cutoff=_SUGGEST_CUTOFF)
            hint = f" — did you mean {_ALIASES.get(close[0], close[0])}?" if close else ""
            self.error(
                f"unknown command {safe_text(name)}{hint} (/help lists them; start a message with // to send a slash)"
            )
            return
        await handler(arg)

    async def cmd_help(self, arg: str) -> None:
        from rich.table import Table

        table = Table(box=None, show_header=False, pad_edge=False)
        table.add_column(style="bold cyan", no_wrap=True)
        table.add_column()
        for name, (args, text) in COMMANDS.items():
            table.add_row(f"{name} {args}".rstrip(), text)
        table.add_row("", "")
        for keys, text in [
            ("Enter", "send"),
            ("Esc Enter / Alt-Enter", "new line"),
            ("Ctrl-C", "stop the reply or tool; at the prompt, clear it"),
            ("Ctrl-R, Up", "search / walk the history"),
            ("Ctrl-X Ctrl-E", "edit in $EDITOR"),
            ("Ctrl-D", "leave"),
        ]:
            table.add_row(keys, text)
        from ..render.unpadded import print_unpadded

        print_unpadded(self.console, table)

    async def cmd_exit(self, arg: str) -> None:
        self.done = True

    async def cmd_clear(self, arg: str) -> None:
        self.console.clear()

    def _enter_endpoint(self, session_id: str | None) -> None:
        """Leave the current session keeping its model and endpoint, then talk to
        ``session_id``'s stored ones (``None``: a new session, the defaults), as resuming it
        with ``chatflow chat -s`` would; a change is announced."""
        current = self.endpoint
        try:
            if self.store.get(self.session_id) is not None and current[0] \
                    and self.store.session_endpoint(self.session_id) != current:
                self.store.set_session_endpoint(self.session_id, current[0], current[1])
            stored = self.store.session_endpoint(session_id) if session_id else (None, None)
        except ChatflowError:
            stored = (None, None)
        model = stored[0] or self.default_endpoint[0]
        url = stored[1] or self.default_endpoint[1]
        if stored[1]:  # kept without its password: the same endpoint given this run brings its credentials
            url = with_credentials(stored[1], current[1], self.default_endpoint[1])
        whose = f"session {session_id}" if session_id else "a new session"
        if url != current[1] and url and current[1] and self._client_for is not None:
            self.runner.model_client = self._client_for(url)
            self.endpoint = (self.endpoint[0], url)
            self.say(f"endpoint: {safe_text(url_without_userinfo(url))} ({whose})")
        if model and model != current[0] and model != "local" and current[0] != "local":
            for agent in self.runner.agents.values():
                if agent.model == current[0]:  # an agent with a model of its own keeps it
                    agent.model = model
            self.runner.default_model = model
            self.endpoint = (model, self.endpoint[1])
            self.say(f"model: {safe_text(model)} ({whose})")

    async def cmd_new(self, arg: str) -> None:
        self.drop_queued_files("a new session begins")
        self._enter_endpoint(None)
        self.session_id = new_session_id()
        self.failed_message = None
        self.last_usage_tokens = None
        self._refresh_info()
        self.say(f"new session {self.session_id}")

    async def cmd_sessions(self, arg: str) -> None:
        summaries = self.store.list_sessions(limit=20)
        if not summaries:
            self.say("no sessions yet")
            return
        for line in sessions_lines(summaries, width=self.console.width, compact=True, current=self.session_id):
            self.console.print(line, soft_wrap=True)

    async def cmd_switch(self, arg: str) -> None:
        if not arg:
            self.error("/switch needs a session id (Tab completes; /sessions lists them)")
            return
        session = self.store.get(arg)
        if session is None:
            close = difflib.get_close_matches(arg, self._session_ids(), n=1)
            self.error(f"no session {safe_text(arg)}" + (f" — did you mean {close[0]}?" if close else ""))
            return
        self.drop_queued_files("you switch sessions")
        self._enter_endpoint(arg)
        self.session_id = arg
        self.failed_message = None
        self.last_usage_tokens = None
        self._refresh_info()
        from ..render import plural

        self.say(f"session {arg}: {plural(self.turn, 'turn')}, agent {self.agent_name}")
        if self.turn:
            self.recap()

    async def cmd_show(self, arg: str) -> None:
        """``/show`` folds long tool arguments and results as ``chatflow sessions show`` does;
        ``/show --full`` (or ``-f``) prints them whole — the REPL's tool lines point here."""
        from ..render import turn_interrupted, turn_renderables
        from ..lookup import InterruptedTurns

        if arg not in ("", "--full", "-f"):
            self.error(f"/show {safe_text(arg)}: the only option is --full")
            return
        if self.store.get(self.session_id) is None:
            self.say("nothing yet: this session has no turns")
            return
        from ..render.unpadded import print_unpadded

        full = bool(arg)
        interrupted = InterruptedTurns(self.store, self.session_id)
        submitted = self.store.submitted_tool_results(self.session_id)
        awaiting = self._awaiting()
        for record in self.store.load_turns(self.session_id):
            print_unpadded(self.console, *turn_renderables(record, markdown=True, full=full, width=self.console.width,
                                                           interrupted=turn_interrupted(record, interrupted),
                                                           submitted=submitted, awaiting=awaiting, repl=True))

    async def cmd_rollback(self, arg: str) -> None:
        if not await self._wait_closing():
            return
        try:
            count = self.store.session_summary(self.session_id).turn_count
        except SessionNotFoundError:  # nothing stored yet
            count = 0
        if count == 0:
            self.say("nothing to roll back")
            return
        try:
            to_turn = int(arg) if arg else None
        except ValueError:
            self.error(f"/rollback {safe_text(arg)}: N is a turn number (0..{count})")
            return
        last = None if to_turn is not None else 1  # no N: drop the last turn
        try:  # what the store will remove, for the question; the store decides again as it writes
            target = rollback_target(count, to_turn=to_turn, last=last)
        except ValueError:
            self.error(f"/rollback {to_turn}: this session has turns 1..{count}; nothing was changed")
            return
        if target == count:
            self.say(f"nothing to remove: turn {count} is the last turn")
            return
        removed = f"turn {count}" if target + 1 == count else f"turns {target + 1}-{count}"
        if target == 0:
            question = f"Remove every turn ({removed}; keep only system messages)?"
        else:
            question = f"Remove {removed} and keep turns 1..{target}?"
        if not await self.confirm(question):
            self.say("nothing was changed")
            return
        events = self.store.rollback(self.session_id, to_turn, last=last)
        done = next(e.payload for e in events if e.type == "rollback")
        gone = done["removed_turns"]  # what went, even if the session changed since the question
        removed = f"turn {gone[0]}" if len(gone) == 1 else f"turns {gone[0]}-{gone[-1]}" if gone else "no turn"
        self._refresh_info()
        self.say(f"rolled back: {removed} removed; the next message is turn {done['to_turn'] + 1}")

    async def cmd_compact(self, arg: str) -> None:
        """Summarise turns 1..N-1 (the newest turn stays as it is), with optional instructions."""
        if not await self._wait_closing():
            return
        from ..core.compaction import compact_session
        from ..core.errors import SessionNotFoundError
        from ..core.tokens import short_count

        try:
            count = self.store.session_summary(self.session_id).turn_count
        except SessionNotFoundError:
            count = 0
        if count < 2:
            self.say("nothing to compact: the newest turn always stays as it is")
            return
        agent = self.runner.agents.get(self.agent_name, self.runner.starting_agent)
        model = self.model_name
        if not model:
            self.error("/compact: no model to write the summary")
            return
        tools = [t.to_wire() for t in agent.all_tools().values()] or None
        self.say(f"compacting turns 1..{count - 1}… (Ctrl-C stops it)")
        cancel = threading.Event()
        loop = asyncio.get_running_loop()
        try:
            # Ctrl-C cancels the request at once, as it stops a streaming reply
            with self._watch_keys(cancel.set), self._sigint(loop, cancel.set):
                done = await asyncio.to_thread(
                    compact_session, self.store, self.session_id, self.runner.model_client, model,
                    through=count - 1, instructions=arg or None, prompt=self.runner.compact_prompt, tools=tools,
                    cancel=cancel)
        except RunInterrupted:
            self._refresh_info()
            self.say("⏹ /compact interrupted: nothing was compacted; the session is ready.", style="yellow")
            return
        except ChatflowError as exc:
            self.error(f"/compact: {exc}")
            return
        self._refresh_info()
        if done.repeated:
            self.say(f"turns 1..{done.through} are already summarised with these instructions; nothing was sent")
            return
        self.say(f"compacted turns 1..{done.through}: the context went from {short_count(done.tokens_before)} to "
                 f"{short_count(done.tokens_after)} tokens (every turn stays in the log)")

    async def cmd_retry(self, arg: str) -> None:
        """Send the last failed message again, or say that nothing failed.

        The failed message comes from this run or, after reopening the session, from the
        event log (a ``turn.failed`` with no completed turn, rollback or interruption after
        it). When nothing failed, ``/retry`` says so and offers to roll back the last turn
        and send its message again for another answer; it asks first, and nothing changes
        on "no".
        """
        if not await self._wait_closing():
            return
        failed: str | None = self.failed_message
        if failed is None and (logged := self._failed_in_log()) is not None:
            failed = logged.content or ""
            self.failed_attachments = list(logged.attachments)  # its files: the database kept their bytes
        if failed is not None:
            self.say("sending the failed message again")
            await self.send(failed, retry=True)
            return
        session = self.store.get(self.session_id)
        turns = session.turns if session is not None else ()
        if not turns:
            self.say("nothing failed: there is nothing to retry")
            return
        last = turns[-1]
        text = last.messages[0].content if last.messages else None
        if not text:
            self.say(f"nothing failed: turn {last.number} completed")
            return
        question = f"Nothing failed: turn {last.number} completed. Roll it back and send its message again for another answer?"
        if not await self.confirm(question):
            self.say("nothing was changed")
            return
        # The store removes the newest turn as it stands when it writes (not a turn number
        # read before the question); a turn another process added meanwhile is the one removed,
        # and its message is the one sent again.
        events = self.store.rollback(self.session_id, last=1)
        gone = next(e.payload for e in events if e.type == "rollback")["removed_turns"]
        number = gone[0] if gone else last.number
        if number != last.number:
            text = self._user_message_of(number, rolled_back=True) or text
        self.say(f"turn {number} rolled back; sending its message again")
        await self.send(text)

    def _user_message_of(self, number: int, *, rolled_back: bool = False) -> str | None:
        """The user message of turn ``number`` (its newest rolled-back copy with ``rolled_back``)."""
        records = self.store.load_turns(self.session_id, first=number, last=number, include_rolled_back=rolled_back)
        for record in reversed(records):
            if record.rolled_back == rolled_back:
                for message in record.messages:
                    if message.role == Role.USER and message.content:
                        return str(message.content)
        return None

    def _failed_in_log(self) -> Message | None:
        """The user message (its text and files) of the session's last turn when that turn
        failed and nothing came after it (a completed, interrupted or rolled-back turn), else None."""
        try:
            if self.store.get(self.session_id) is None:
                return None
            events = self.store.events(self.session_id)
        except ChatflowError:
            return None
        last = next(
            (e for e in reversed(events) if e.type in ("turn.failed", "turn.completed", "turn.interrupted", "rollback")),
            None,
        )
        if last is None or last.type != "turn.failed":
            return None
        number = (last.payload or {}).get("turn")
        records = self.store.load_turns(self.session_id, include_rolled_back=True)
        failed = [r for r in records if r.failed and r.number == number]
        for message in failed[-1].messages if failed else ():
            if message.role == Role.USER and (message.content or message.attachments):
                return message
        return None

    async def cmd_agent(self, arg: str) -> None:
        if not await self._wait_closing():
            return
        agents = self.runner.agents
        if not arg:
            for name in agents:
                mark = "●" if name == self.agent_name else " "
                self.say(f"{mark} {name}", style="bold" if name == self.agent_name else "")
            return
        if arg not in agents:
            close = difflib.get_close_matches(arg, list(agents), n=1)
            self.error(
                f"no agent {safe_text(arg)}"
                + (f" — did you mean {close[0]}?" if close else "")
                + f" (agents: {', '.join(agents)})"
            )
            return
        session = self.store.get_or_create(self.session_id, agents[arg], max_turns=self.max_turns)
        if getattr(session.active_agent, "name", None) != arg:
            session.set_active_agent(agents[arg])
            self.store.save(session)
        self._refresh_info()
        self.say(f"active agent: {arg}")

    async def cmd_model(self, arg: str) -> None:
        if not arg:
            self.say(f"model: {self.model_name}")
            return
        for agent in self.runner.agents.values():
            agent.model = arg
        self.runner.default_model = arg
        self.endpoint = (arg, self.endpoint[1])
        try:  # the session keeps it (a new session gets it with its first message)
            if self.store.get(self.session_id) is not None:
                self.store.set_session_endpoint(self.session_id, arg, self.store.session_endpoint(self.session_id)[1])
        except Exception:  # noqa: BLE001 - the switch still applies to this run
            pass
        self.say(f"model: {arg} (from the next message)")

    async def cmd_metadata(self, arg: str) -> None:
        if not await self._wait_closing():
            return
        if not arg:
            session = self.store.get(self.session_id)
            meta = session.metadata if session is not None else {}
            self.say(safe_text(pretty_json_text(_json(meta))) if meta else "no metadata", style="")
            return
        key, sep, value = arg.partition("=")
        if not sep or not key.strip():
            self.error("/metadata KEY=VALUE")
            return
        starting = self.runner.agents.get(self.agent_name, self.runner.starting_agent)
        session = self.store.get_or_create(self.session_id, starting, max_turns=self.max_turns)
        session.update_metadata({key.strip(): value})
        self.store.save(session)
        self._refresh_info()
        self.say(f"metadata: {safe_text(key.strip())} = {safe_text(value)}")

    async def cmd_memory(self, arg: str) -> None:
        """``/memory``: the mounts and the stores there are; ``mount NAME[:ro]``; ``unmount NAME``."""
        from typing import cast

        from ..core.errors import ChatflowError
        from ..core.resources.mounts import parse_mount
        from ..core.memory.protocol import MemoryStore

        memory = cast(MemoryStore, self.store)

        if not await self._wait_closing():
            return
        verb, _, rest = arg.strip().partition(" ")
        if not verb:
            session = self.store.get(self.session_id)
            mounted = [m for m in (session.resources if session is not None else []) if m.kind == "memory_store"]
            names = [s.name for s in memory.memory_stores()]
            self.say("mounted: " + (", ".join(safe_text(str(m)) for m in mounted) or "none") + "; stores: "
                     + (", ".join(safe_text(n) for n in names) or "none (chatflow memory create NAME)"), style="")
            return
        if verb not in ("mount", "unmount") or not rest.strip():
            self.error("/memory mount NAME[:ro] or /memory unmount NAME")
            return
        try:
            starting = self.runner.agents.get(self.agent_name, self.runner.starting_agent)
            session = self.store.get_or_create(self.session_id, starting, max_turns=self.max_turns)
            if verb == "mount":
                mount = parse_mount(rest.strip())
                memory.memory_store(mount.name)  # it must exist
                changed = session.mount(mount)
                done = f"mounted {safe_text(str(mount))}" if changed else f"{safe_text(str(mount))} is mounted already"
            else:
                changed = session.unmount(rest.strip())
                shown = _shown_name(rest.strip())
                done = f"unmounted {shown}" if changed else f"{shown} is not mounted"
            if changed:
                self.store.save(session)
        except ChatflowError as exc:
            self.error(f"/memory: {exc}")
            return
        self.say(done)

    async def cmd_vault(self, arg: str) -> None:
        """``/vault``: the vaults mounted here and those there are; ``mount NAME``; ``unmount NAME``.

        A vault is mounted read-only (a tool reads its entries); mounting and unmounting are
        ``resource.mounted`` / ``resource.unmounted`` events of the session, as ``/memory``'s.
        """
        from typing import cast

        from ..core.errors import ChatflowError
        from ..core.resources.mounts import parse_mount
        from ..core.resources.vaults import VaultCatalog, no_vault_error

        catalog = cast(VaultCatalog, self.store)

        if not await self._wait_closing():
            return
        verb, _, rest = arg.strip().partition(" ")
        rest = rest.strip()
        if not verb:
            session = self.store.get(self.session_id)
            mounted = [m.name for m in (session.resources if session is not None else []) if m.kind == "vault"]
            names = [v.name for v in catalog.list_vaults()]
            self.say("mounted: " + (", ".join(safe_text(n) for n in mounted) or "none") + "; vaults: "
                     + (", ".join(safe_text(n) for n in names) or "none (chatflow vault create NAME)"), style="")
            return
        if verb not in ("mount", "unmount") or not rest or " " in rest:
            self.error("/vault mount NAME or /vault unmount NAME")
            return
        try:
            starting = self.runner.agents.get(self.agent_name, self.runner.starting_agent)
            if verb == "mount":
                mount = parse_mount(rest, "vault")
                if catalog.get_vault(mount.name) is None:
                    raise no_vault_error(mount.name, ", ".join(v.name for v in catalog.list_vaults()) or "none")
                session = self.store.get_or_create(self.session_id, starting, max_turns=self.max_turns)
                changed = session.mount(mount)
                done = f"mounted vault {mount.name}" if changed else f"vault {mount.name} is mounted already"
            else:
                session = self.store.get_or_create(self.session_id, starting, max_turns=self.max_turns)
                changed = session.unmount(rest, "vault")
                shown = _shown_name(rest)
                done = f"unmounted vault {shown}" if changed else f"vault {shown} is not mounted"
            if changed:
                self.store.save(session)
        except ChatflowError as exc:
            self.error(f"/vault: {exc}")
            return
        self.say(done)

    async def cmd_search(self, arg: str) -> None:
        """The ten best turns of every session for ``arg``, two lines a hit (``/switch ID``
        goes there)."""
        from ..core.errors import UsageError
        from ..render.search import search_hit_lines

        if not arg.strip():
            self.error('/search QUERY: words, "a phrase", word OR word, NOT word, prefix*')
            return
        try:
            hits = self.store.search(arg, limit=10)
        except UsageError as exc:
            self.error(str(exc))
            return
        if not hits:
            self.say(f"no turns match {safe_text(arg)}")
            return
        for line in search_hit_lines(hits, width=self.console.width):
            self.console.print(line, soft_wrap=True)
        self.say("/switch ID goes to a session; there, /fork N branches from turn N")

    async def cmd_fork(self, arg: str) -> None:
        """Copy turns 1..N of this session into a new session and continue in the new one;
        this session is not changed."""
        if not await self._wait_closing():
            return
        if self.store.get(self.session_id) is None:
            self.say("nothing to fork: this session has no turns")
            return
        try:
            at = int(arg) if arg.strip() else None
        except ValueError:
            at = -1
        if at is not None and at < 1:
            last = self.store.session_summary(self.session_id).turn_count
            self.error(f"/fork {safe_text(arg.strip())}: N is a turn number 1..{max(1, last)}; nothing was changed")
            return
        try:
            summary = self.store.fork(self.session_id, at)
        except ValueError as exc:
            self.error(f"/fork: {exc}; nothing was changed")
            return
        if self.endpoint[0]:  # the fork talks to the server and model this session talks to now
            self.store.set_session_endpoint(summary.session_id, self.endpoint[0], self.endpoint[1])
        source = self.session_id
        self._enter_endpoint(summary.session_id)
        self.session_id = summary.session_id
        self.failed_message = None
        self.last_usage_tokens = None
        self._refresh_info()
        turn = summary.forked_from["turn"] if summary.forked_from else summary.turn_count
        self.say(f"forked {source} at turn {turn}: now in {summary.session_id} ({source} is unchanged)")

    async def cmd_title(self, arg: str) -> None:
        """Show the title, or set it (``/title TITLE``)."""
        if self.store.get(self.session_id) is None:
            self.say("this session has no turns yet: send a message first")
            return
        if arg.strip():
            try:
                self.store.set_title(self.session_id, arg)
            except ValueError as exc:
                self.error(f"/title: {exc}")
                return
        title = self.store.session_summary(self.session_id).title
        self.say(f"title: {safe_text(title, one_line=True)}" if title else "no title yet")

    async def cmd_attach(self, arg: str) -> None:
        """Read a file to send with the next message (checked now, as ``chat --attach`` checks
        it); no PATH lists the files waiting, ``clear`` drops them."""
        from ..core.attachments import attachment_line, check_count, read_attachment
        from ..core.errors import AttachmentError

        if arg == "clear":
            self.attachments = []
            self.say("no files attached")
            return
        if not arg:
            if not self.attachments:
                self.say("no files attached: /attach PATH adds one to your next message")
            for attachment in self.attachments:
                self.say(f"attached: {safe_text(attachment_line(attachment), one_line=True)}")
            for attachment in self.failed_attachments:
                self.say(f"kept for /retry: {safe_text(attachment_line(attachment), one_line=True)}")
            return
        try:
            check_count(len(self.attachments) + 1)
            attachment = read_attachment(os.path.expanduser(_unquoted(arg)))
        except AttachmentError as exc:
            self.error(exc.message)
            return
        if attachment.is_image and self.endpoint[0] == "local":  # the embedded model reads text only
            self.error("the local model (SmolLM2) reads text only: it cannot see images; attach text files, "
                       "or switch to a vision model (/model NAME)")
            return
        self.attachments = [*self.attachments, attachment]
        self.say(f"attached: {safe_text(attachment_line(attachment), one_line=True)} (sent with your next message)")

    async def cmd_edit(self, arg: str) -> None:
        text = await self.edit(arg)
        if text is None:
            return
        if text.strip():
            self._prefill = text.rstrip("\n")
            self.say("edited: press Enter to send")

    async def edit(self, initial: str = "") -> str | None:
        """Open ``$VISUAL``/``$EDITOR`` (default ``vi``) on ``initial``; the text written, or None."""
        editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
        try:
            with self._cooked_terminal():
                code, text = await asyncio.to_thread(_run_editor, editor, initial)
        except OSError as exc:
            self.error(f"cannot run the editor {safe_text(editor)!r}: {exc.strerror or exc}")
            return None
        if code != 0:
            self.say(f"the editor exited with status {code}; nothing was changed")
            return None
        return text

    async def confirm(self, question: str) -> bool:
        try:
            # wrapped at spaces like every notice: a narrow terminal never cuts a word
            asked = wrap_at_spaces(f"{question} [y/N]", self.console.width, indent="")
            answer = await self._ask_session.prompt_async(asked + " ")
        except (KeyboardInterrupt, EOFError):
            return False
        return answer.strip().lower() in {"y", "yes"}


def slash_completions(repl: ReplHost, text: str) -> list[tuple[str, int, str]]:
    """Completions for the text before the cursor: ``(text, start offset, help)`` each.

    Slash commands first; then session ids after ``/switch``, agent names after ``/agent``,
    configured model names after ``/model`` and paths after ``/attach``.
    """
    if not text.startswith("/") or "\n" in text:
        return []
    if " " not in text:
        return [
            (name, -len(text), help_text) for name, (_, help_text) in COMMANDS.items() if name.startswith(text.lower())
        ]
    name, _, partial = text.partition(" ")
    choices: list[str] = []
    if name == "/switch":
        choices = repl._session_ids()
    elif name == "/agent":
        choices = list(repl.runner.agents)
    elif name == "/model":
        choices = sorted({a.model for a in repl.runner.agents.values() if a.model})
    elif name == "/attach":
        choices = _paths(partial)
    return [(choice, -len(partial), "") for choice in choices if choice.startswith(partial)]


def _unquoted(arg: str) -> str:
    """The path of ``/attach PATH`` as a shell reads one word: in matching single or double
    quotes, or with its spaces escaped by a backslash; else as typed."""
    if len(arg) >= 2 and arg[0] == arg[-1] and arg[0] in "'\"":
        return arg[1:-1]
    return arg.replace("\\ ", " ")


def _paths(partial: str) -> list[str]:
    """Files and folders (ending in ``/``) whose path starts with ``partial`` (``~`` expanded)."""
    folder, _, start = partial.rpartition("/")
    where = os.path.expanduser(folder + "/" if folder or partial.startswith("/") else ".")
    try:
        names = sorted(os.listdir(where))
    except OSError:
        return []
    prefix = folder + "/" if folder or partial.startswith("/") else ""
    return [prefix + name + ("/" if os.path.isdir(os.path.join(where, name)) else "")
            for name in names if name.startswith(start) and (start.startswith(".") or not name.startswith("."))]


def _run_editor(editor: str, initial: str) -> tuple[int, str]:
    """Run ``editor`` (a command line) on a temporary file holding ``initial``: (exit status, text)."""
    fd, path = tempfile.mkstemp(prefix="chatflow-", suffix=".md")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(initial)
        code = subprocess.call([*shlex.split(editor), path])
        with open(path, encoding="utf-8") as fh:
            return code, fh.read()
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _json(data: Any) -> str:
    import json

    return json.dumps(data, ensure_ascii=False)


def _shown_name(name: str) -> str:
    """``name`` made safe to print when it may be shown (a plain resource name), otherwise the
    placeholder that says it is not shown: a value typed where a name goes is never printed."""
    from ..core.resources.secrets import NOT_SHOWN, quoted_name

    return safe_text(name) if quoted_name(name) != NOT_SHOWN else NOT_SHOWN
