"""What the REPL's parts share: the state :class:`~chatflow_cli.repl.app.Repl` holds, declared once.

The REPL is one object built from mixins (the prompt, the terminal's modes, the slash
commands, turn running), each in its own module. Each mixin subclasses :class:`ReplHost`,
which declares the attributes :class:`~chatflow_cli.repl.app.Repl` sets in ``__init__``
and the methods one part calls on another, so every part is type-checked on its own.
The declarations are annotations only: nothing here runs or holds a value.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO

if TYPE_CHECKING:  # pragma: no cover
    import asyncio

    from prompt_toolkit import PromptSession
    from prompt_toolkit.input import Input
    from prompt_toolkit.key_binding import KeyPress
    from prompt_toolkit.output import Output
    from rich.console import Console

    from ..core.attachments import Attachment
    from ..core.memory.protocol import SessionStoreProtocol
    from ..core.messages import Message
    from ..core.model import ModelClient
    from ..core.runner import Runner

__all__ = ["Endpoint", "ReplHost", "TurnLines"]

#: ``(model, base URL)`` a session talks to, as stored with it (either may be unknown).
Endpoint = tuple[str | None, str | None]


class TurnLines(Protocol):
    """A turn on screen, as the other parts see it: somewhere to print a line above its
    live reply (the turn's view, :mod:`~chatflow_cli.repl.turn`)."""

    def line(self, text: Any, *, status: str | None = None) -> None:
        """Print ``text`` (a string or Rich renderable) into the scrollback above the live
        reply; ``status``: the spinner text shown after it (None: none)."""
        ...


class ReplHost:
    """The attributes and cross-part methods of :class:`~chatflow_cli.repl.app.Repl`."""

    # set by Repl.__init__ ---------------------------------------------------------------
    runner: Runner
    store: SessionStoreProtocol
    session_id: str
    console: Console
    input: Input
    output: Output
    history_path: Path | None
    #: ``max_turns`` and the system message of a session the REPL creates
    max_turns: int | None
    system: str | None
    #: ``chatflow`` and the global options that reopen this store (``--db``, ``--config``)
    resume_prefix: list[str]
    #: the (model, base URL) this run talks to (``default_endpoint``: the flags' and config's,
    #: what ``/new`` goes back to)
    endpoint: Endpoint
    _default_endpoint: Endpoint | Callable[[], Endpoint]
    #: makes a model client for another base URL (None: the endpoint is not switched)
    _client_for: Callable[[str], ModelClient] | None
    done: bool
    #: the terminal went away (SIGHUP): finish the turn quietly and leave
    hung_up: bool
    #: SIGTERM: finish the turn as Ctrl-C does, say so and leave (exit 143)
    terminated: bool
    #: stops the running turn, if any
    _turn_interrupt: Callable[[], None] | None
    _devnull: TextIO | None
    #: the message of the last turn that failed, kept for ``/retry``
    failed_message: str | None
    #: files ``/attach`` read, sent with the next message
    attachments: list[Attachment]
    #: the files of the message that failed, for ``/retry`` only (a new message never takes them)
    failed_attachments: list[Attachment]
    last_usage_tokens: int | None
    _prefill: str
    #: key presses typed while a turn ran
    _typeahead: list[KeyPress]
    #: an interrupted turn still being stored
    _closing: threading.Thread | None
    _notes: collections.deque[logging.LogRecord]
    _ids_cache: tuple[float, list[str]]
    # what the prompt and toolbar show, refreshed after each turn and command -----------
    agent_name: str
    turn: int
    window_turns: int
    _history: tuple[Message, ...]
    session_max_turns: int
    exists: bool
    prompt_session: PromptSession[str]
    _ask_session: PromptSession[str]

    if TYPE_CHECKING:  # the methods one part calls on another (each defined by one part)
        @property
        def model_name(self) -> str | None: ...

        @property
        def default_endpoint(self) -> Endpoint: ...

        def say(self, text: str, style: str = "dim") -> None: ...

        def error(self, text: str) -> None: ...

        def recap(self) -> None: ...

        def _awaiting(self) -> frozenset[str]: ...

        def _refresh_info(self) -> None: ...

        def _session_ids(self) -> list[str]: ...

        def _failed_in_log(self) -> Message | None: ...

        def _print_notes(self, view: TurnLines | None = None) -> None: ...

        def _cooked_terminal(self) -> contextlib.AbstractContextManager[None]: ...

        async def send(self, text: str, *, retry: bool = False) -> None: ...

        def drop_queued_files(self, why: str, *, failed: bool = True) -> None: ...

        async def _wait_closing(self) -> bool: ...

        def _watch_keys(self, on_interrupt: Callable[[], None]) -> contextlib.AbstractContextManager[None]: ...

        def _sigint(self, loop: asyncio.AbstractEventLoop,
                    on_interrupt: Callable[[], None]) -> contextlib.AbstractContextManager[None]: ...
