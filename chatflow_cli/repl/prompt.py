"""The REPL's prompt: prompt-toolkit sessions, key bindings, history, the prompt and the toolbar.

:class:`PromptView` is mixed into :class:`~chatflow_cli.repl.app.Repl`: it builds the
prompt-toolkit sessions (Enter, Esc-Enter, Tab, Ctrl-R, Ctrl-X Ctrl-E; the history file, mode
0600, that never keeps blank input) and reads from the store what the prompt and the bottom
toolbar show (session, agent, model, turn, context window use, tokens of the last turn).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.errors import ChatflowError
from ..render import safe_text
from .commands import COMMANDS, slash_completions
from .host import ReplHost

if TYPE_CHECKING:  # pragma: no cover
    from prompt_toolkit import PromptSession
    from prompt_toolkit.completion import Completer
    from prompt_toolkit.formatted_text import StyleAndTextTuples
    from prompt_toolkit.key_binding import KeyPressEvent

__all__ = ["PromptView"]


class PromptView(ReplHost):
    """The prompt, its keys and the toolbar of :class:`~chatflow_cli.repl.app.Repl`."""

    def _make_prompt_session(self) -> PromptSession[str]:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.auto_suggest import AutoSuggestFromHistory
        from prompt_toolkit.filters import completion_is_selected, has_completions, is_searching
        from prompt_toolkit.history import FileHistory, InMemoryHistory
        from prompt_toolkit.key_binding import KeyBindings
        from prompt_toolkit.styles import Style

        bindings = KeyBindings()

        @bindings.add("enter", filter=has_completions & completion_is_selected)
        def _take_completion(event: KeyPressEvent) -> None:
            buffer = event.current_buffer
            buffer.complete_state = None
            word = buffer.document.text_before_cursor.split(" ")[0]
            if COMMANDS.get(word, ("", ""))[0] and not buffer.document.text_after_cursor:
                buffer.insert_text(" ")

        @bindings.add("enter", filter=~(has_completions & completion_is_selected) & ~is_searching)
        def _send(event: KeyPressEvent) -> None:
            event.current_buffer.validate_and_handle()

        @bindings.add("enter", filter=is_searching)
        def _accept_search_and_send(event: KeyPressEvent) -> None:
            """Enter in a Ctrl-R search takes the match and sends it, as readline's accept-line does."""
            from prompt_toolkit import search

            search.accept_search()
            event.app.current_buffer.validate_and_handle()

        @bindings.add("c-x", "c-e")
        def _open_editor(event: KeyPressEvent) -> None:
            """Ctrl-X Ctrl-E: edit the message in $VISUAL/$EDITOR; the text comes back to the
            prompt for review (Enter sends), as with /edit — never sent when the editor closes."""
            event.current_buffer.open_in_editor(validate_and_handle=False)

        @bindings.add("escape", "enter")
        def _newline(event: KeyPressEvent) -> None:
            event.current_buffer.insert_text("\n")

        @bindings.add("tab", filter=~has_completions)
        def _complete_now(event: KeyPressEvent) -> None:
            """Tab completes from what is typed *now*: a single match is inserted, several
            insert their common part and open the menu. (prompt-toolkit's own Tab does nothing
            while the completion started by typing is still running, so ``/sw`` Tab typed
            fast would open the menu without inserting ``/switch``.)"""
            from prompt_toolkit.completion import CompleteEvent

            buffer = event.current_buffer
            document = buffer.document
            found = list(buffer.completer.get_completions(document, CompleteEvent(completion_requested=True)))
            if not found:
                return
            if len(found) == 1:
                buffer.cancel_completion()
                buffer.apply_completion(found[0])
                return
            from prompt_toolkit.completion import get_common_complete_suffix

            common = get_common_complete_suffix(document, found)
            if common:
                buffer.insert_text(common)
            buffer.start_completion(select_first=False)

        # The history never keeps a blank or whitespace-only entry: such input is never sent.
        # Nor a /vault or /memory line whose argument is not a plain name (it may hold a value typed there).
        class SkipBlankFileHistory(FileHistory):
            def append_string(self, string: str) -> None:
                if string.strip() and not _may_hold_a_value(string):
                    super().append_string(string)

        class SkipBlankInMemoryHistory(InMemoryHistory):
            def append_string(self, string: str) -> None:
                if string.strip():
                    super().append_string(string)

        history: FileHistory | InMemoryHistory
        if self.history_path is not None:
            _private_file(self.history_path)
            history = SkipBlankFileHistory(str(self.history_path))
        else:
            history = SkipBlankInMemoryHistory()
        style = Style.from_dict(
            {
                "agent": "bold ansicyan",
                "bottom-toolbar": "noreverse bg:#262626 #bcbcbc",
                "bottom-toolbar.key": "bold",
                "bottom-toolbar.sep": "#6c6c6c",
            }
        )
        return PromptSession(
            history=history,
            auto_suggest=AutoSuggestFromHistory(),
            completer=_slash_completer(self),
            complete_while_typing=True,
            key_bindings=bindings,
            multiline=True,
            bottom_toolbar=self._toolbar,
            prompt_continuation=lambda width, line_number, wrap_count: "… ".rjust(width),
            style=style,
            input=self.input,
            output=self.output,
        )

    def _make_ask_session(self) -> PromptSession[str]:
        from prompt_toolkit import PromptSession

        return PromptSession(input=self.input, output=self.output)

    def _prompt_message(self) -> StyleAndTextTuples:
        return [("class:agent", safe_text(self.agent_name)), ("", " › ")]

    def _toolbar(self) -> StyleAndTextTuples:
        """``session │ agent │ model │ turn N │ ctx W/M │ T tok``, fitted to the terminal's width:
        on a narrow terminal the token count goes first, then the model, the agent and the
        turn; the session id is cut last, and ``ctx`` always stays."""
        sep = ("class:bottom-toolbar.sep", " │ ")
        # (text, style, drop order: 0 never, higher drops earlier)
        items: list[tuple[str, str, int]] = [
            (safe_text(self.session_id), "class:bottom-toolbar.key", 0),
            (safe_text(self.agent_name), "", 3),
            (safe_text(self.model_name or "?"), "", 4),
            (f"turn {self.turn}", "", 2),
            (self._context_use(), "", 0),
        ]
        if self.last_usage_tokens is not None:
            items.append((f"{self.last_usage_tokens} tok", "", 5))
        try:
            width = int(self.output.get_size().columns) if self.output is not None else 80
        except Exception:  # noqa: BLE001 - no terminal size: assume 80 columns
            width = 80

        def length(kept: list[tuple[str, str, int]]) -> int:
            return 1 + sum(len(text) for text, _, _ in kept) + 3 * (len(kept) - 1)

        for rank in (5, 4, 3, 2):
            if length(items) <= width - 1:
                break
            items = [item for item in items if item[2] != rank]
        over = length(items) - (width - 1)
        if over > 0:  # cut the session id, keeping its start
            text, style, rank = items[0]
            items[0] = (text[:max(1, len(text) - over - 1)] + "…", style, rank)
        parts: StyleAndTextTuples = [("", " ")]
        for k, (text, style, _rank) in enumerate(items):
            if k:
                parts.append(sep)
            parts.append((style, text))
        return parts

    def _context_use(self) -> str:
        """``ctx 6.1k/8.2k``: the stored window's tokens of the model's context size; with no
        known size, ``ctx W/M``: the window's turns of ``max_turns``."""
        budget = self.runner.budget_for(self.agent_name)
        if budget is None:
            return f"ctx {self.window_turns}/{self.session_max_turns}"
        from ..core.memory.context import split_turns
        from ..core.tokens import select_window, short_count

        systems, _, turns = split_turns(self._history)
        _kept, tokens = select_window(systems, turns, budget.tokens) if turns or systems else (0, 0)
        return f"ctx {short_count(tokens)}/{short_count(budget.context)}"

    @property
    def model_name(self) -> str | None:
        agent = self.runner.agents.get(self.agent_name)
        return (getattr(agent, "model", None) or self.runner.default_model) if agent else self.runner.default_model

    def _refresh_info(self) -> None:
        """Re-read what the toolbar and prompt show from the store (one indexed read)."""
        try:
            session = self.store.get(self.session_id)
        except ChatflowError:
            session = None
        self.exists = session is not None
        if session is None:
            self.agent_name = self.runner.starting_agent.name
            self.turn = self.window_turns = 0
            self._history = ()
            self.session_max_turns = self.max_turns or self.store.default_max_turns
            return
        self.agent_name = getattr(session.active_agent, "name", str(session.active_agent))
        if self.agent_name not in self.runner.agents:  # removed from config.toml: the default agent goes on
            from ..assembly import adopt_starting_agent

            note = adopt_starting_agent(self.store, self.session_id, self.runner)
            if note is not None:
                self.say(note, style="yellow")
                self.agent_name = self.runner.starting_agent.name
        if session.resources:  # a memory store or vault deleted since it was mounted: said once, unmounted
            from ..assembly import gone_notice, unmount_gone

            for _mount, reason in unmount_gone(self.store, self.session_id):
                self.say(gone_notice(self.session_id, reason), style="yellow")
        self.turn = session.turn_count
        self.window_turns = len(session.turns)
        self._history = session.history
        self.session_max_turns = session.max_turns


def _private_file(path: Path) -> None:
    """Create ``path`` if needed and make it readable by its owner only (0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_APPEND | os.O_WRONLY, 0o600)
    os.close(fd)
    os.chmod(path, 0o600)


def _slash_completer(repl: ReplHost) -> Completer:
    """Tab's choices at the prompt (:func:`~chatflow_cli.repl.commands.slash_completions`)."""
    from prompt_toolkit.completion import CompleteEvent, Completer, Completion
    from prompt_toolkit.document import Document

    class SlashCompleter(Completer):
        def get_completions(self, document: Document, complete_event: CompleteEvent) -> Iterator[Completion]:
            for text, start, meta in slash_completions(repl, document.text_before_cursor):
                yield Completion(text, start, display_meta=meta or None)

    return SlashCompleter()


def _may_hold_a_value(line: str) -> bool:
    """True for a ``/vault`` or ``/memory`` line with an argument that is not a plain name
    (``/vault mount work=ghp_...``, a store name that looks like a token; a ``:ro``/``:rw``
    mode is judged without its mode): it is kept out of the history file, as a value never
    reaches a file."""
    words = line.split()
    if not words or words[0].lower() not in ("/vault", "/memory"):
        return False
    from ..core.resources.secrets import NOT_SHOWN, quoted_name

    return any(quoted_name(word.removesuffix(":ro").removesuffix(":rw")) == NOT_SHOWN for word in words[1:])
