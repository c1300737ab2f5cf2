"""One process's view of the local model: the server it uses, and a model client that
survives the server's death (see :mod:`chatflow_cli.core.local`)."""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import Any, Generator, Unpack

from ..errors import BadRequestError, ChatflowError, LocalModelError, NetworkError, ProviderResponseError
from .crash import LocalServerCrashedError, empty_reply_error
from .options import DEFAULT_KEEP_ALIVE, ServerOptions, ServerSettings
from .private import LocalServer
from .warm import SharedLocalServer

__all__ = ["LocalModel", "LocalModelClient"]

log = logging.getLogger("chatflow_cli.core.local")

#: How chatflow's local server words a prompt over the context (``local_server.stream_error``).
_PROMPT_TOKENS = re.compile(r"the prompt has (\d+) tokens")


class LocalModel:
    """The embedded model for one process: a private :class:`LocalServer` when
    ``keep_alive`` is 0, else the warm :class:`SharedLocalServer` of ``data_dir``.

    ``with LocalModel(keep_alive=300, data_dir=d) as local:`` starts or reuses the server;
    leaving the block stops a private server and leaves a warm one running. ``local.client()``
    is a :class:`LocalModelClient`; ``local.model`` the model id to send; ``local.started``
    says whether this process started the server (``False``: reused a warm one).

    Args:
        options, settings: how to run the server (:class:`~chatflow_cli.core.local.ServerOptions`
            or its fields as keywords).
        keep_alive: seconds a warm server stays after its last request; ``0``: a private one.
        data_dir: chatflow's data directory, where a warm server is found (needed when
            ``keep_alive`` > 0).

    Raises:
        ValueError: ``keep_alive`` > 0 without ``data_dir``.
        LocalModelError, LocalServerCrashedError: from :meth:`start`, as the server's ``start``.
    """

    def __init__(self, options: ServerOptions | None = None, *, keep_alive: float = DEFAULT_KEEP_ALIVE,
                 data_dir: str | os.PathLike[str] | None = None, **settings: Unpack[ServerSettings]) -> None:
        if keep_alive > 0:
            if data_dir is None:
                raise ValueError("a warm local server (keep_alive > 0) needs data_dir")
            self.server: Any = SharedLocalServer(options, data_dir=data_dir, keep_alive=keep_alive, **settings)
        else:
            self.server = LocalServer(options, **settings)
        self.keep_alive = keep_alive

    @property
    def model(self) -> str:
        return str(self.server.model)

    @property
    def started(self) -> bool:
        return bool(self.server.started)

    @property
    def n_ctx(self) -> int:
        """The context size (tokens) the model runs with: what the started server reports,
        else the ``n_ctx`` option it was started with."""
        reported = getattr(self.server, "n_ctx", None)
        return reported if isinstance(reported, int) and reported > 0 else int(self.server.options.n_ctx)

    @property
    def base_url(self) -> str:
        return str(self.server.base_url)

    def start(self) -> "LocalModel":
        self.server.start()
        return self

    def close(self) -> None:
        self.server.stop()

    def __enter__(self) -> "LocalModel":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def client(self, *, timeout: float = 60.0, max_retries: int = 2,
               transport: str | None = None) -> "LocalModelClient":
        """A :class:`LocalModelClient` of this server (arguments as ``ModelClient``'s)."""
        return LocalModelClient(self.server, timeout=timeout, max_retries=max_retries, transport=transport)


class LocalModelClient:
    """A :class:`~chatflow_cli.core.model.ModelClient` for a local server that may die.

    Before each request it makes sure the server runs (a private one is restarted; a warm
    one is reused or replaced), so the next message after a crash simply works. When a
    request fails because the server died, the error is a :class:`LocalServerCrashedError`
    naming how, instead of the broken stream or the refused connection it caused.
    ``server``: a started :class:`LocalServer` or :class:`SharedLocalServer`; ``transport``:
    as :class:`~chatflow_cli.core.model.ModelClient`'s.
    """

    #: The embedded model: a turn records no base URL for it (its port changes from run to run).
    local = True
    #: Seconds to wait, after a failed request, for a dying server to be seen dead.
    DEATH_WAIT = 3.0

    def __init__(self, server: Any, *, timeout: float = 60.0, max_retries: int = 2,
                 transport: str | None = None) -> None:
        self.server = server
        self.timeout = timeout
        self.max_retries = max_retries
        self.transport = transport
        self._client: Any = None
        self._endpoint: tuple[str, str | None] | None = None
        self._lock = threading.Lock()

    def _current(self) -> Any:
        with self._lock:
            restarted = self.server.ensure_running()
            if restarted:
                log.debug("local model server: the last one was gone; now pid %s on %s", self.server.pid,
                          self.server.base_url)
            endpoint = (self.server.base_url, self.server.api_key)
            if self._client is None or endpoint != self._endpoint:
                if self._client is not None:
                    self._client.close()
                from ..model import ModelClient

                self._client = ModelClient(endpoint[0], endpoint[1], timeout=self.timeout,
                                           max_retries=self.max_retries, transport=self.transport)
                self._endpoint = endpoint
            return self._client

    @property
    def base_url(self) -> str:
        return str(self.server.base_url)

    @property
    def display_url(self) -> str:
        return self.base_url

    def stream(self, *args: Any, **kwargs: Any) -> "_LocalStream":
        """As :meth:`ModelClient.stream`; errors caused by the server's death become
        :class:`LocalServerCrashedError`."""
        return _LocalStream(self, args, kwargs)

    def complete(self, *args: Any, **kwargs: Any) -> Any:
        from ..model import ModelTurn

        turn = None
        for item in self.stream(*args, **kwargs):
            if isinstance(item, ModelTurn):
                turn = item
        return turn

    def crash_or(self, exc: ChatflowError) -> ChatflowError:
        """``exc``, or the crash of the server that caused it, or, for a request over the
        model's context, the :class:`~chatflow_cli.core.errors.BadRequestError` that says so
        (:meth:`over_context`)."""
        if getattr(exc, "error_code", None) == "context_length_exceeded":
            return self.over_context(exc)
        if not isinstance(exc, (ProviderResponseError, NetworkError)) or isinstance(exc, LocalModelError):
            return exc
        crashed: ChatflowError | None = self.server.wait_death(self.DEATH_WAIT)
        if crashed is None:
            return exc
        crashed.session_id = exc.session_id
        return crashed

    def over_context(self, exc: ChatflowError) -> ChatflowError:
        """The error for a request the server refused as longer than its context (exit 5):
        it names the sizes and what helps -- compaction, or a smaller ``--max-context-tokens``
        so that fewer earlier turns are sent (one message that alone is too long must be
        shortened)."""
        n_ctx = getattr(self.server, "n_ctx", None) or getattr(getattr(self.server, "options", None), "n_ctx", None)
        found = _PROMPT_TOKENS.search(exc.message)
        parts = [f"the request has {int(found.group(1)):,} tokens"] if found else []
        if isinstance(n_ctx, int):
            parts.append(f"the model runs with {n_ctx:,}")
        sizes = f" ({'; '.join(parts)})" if parts else ""
        error = BadRequestError(
            f"the conversation no longer fits the local model's context{sizes}: compact the session "
            "(/compact in the REPL, chatflow sessions compact ID) or set a smaller --max-context-tokens "
            "(max_context_tokens in config.toml) so that fewer earlier turns are sent; a single message "
            "this long must be shortened", session_id=exc.session_id)
        error.error_code = "context_length_exceeded"  # type: ignore[attr-defined]
        return error

    def crash_of(self, turn: Any) -> ChatflowError | None:
        """The crash of the server when ``turn`` (a streamed reply) broke off because it
        died; ``None`` for a reply that finished, was cancelled, or broke off otherwise."""
        from ..stream import ReplyState

        if turn.verdict.state is not ReplyState.BROKEN:
            return None
        death: ChatflowError | None = self.server.wait_death(self.DEATH_WAIT)
        return death

    def damage_of(self, turn: Any) -> ChatflowError | None:
        """For a reply with nothing in it (no text, tool call or reasoning), the error that
        says the model file is damaged when it is (checked only then: it reads the file);
        ``None`` otherwise."""
        if (turn.interrupted or turn.tool_calls or (turn.content or "").strip() or turn.reasoning):
            return None
        try:
            model = self.server.options.model_file()
        except LocalModelError:
            return None
        return empty_reply_error(model)

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


class _LocalStream:
    """A model stream whose errors are checked against the server's death (see LocalModelClient)."""

    def __init__(self, owner: LocalModelClient, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._owner = owner
        self._args = args
        self._kwargs = kwargs
        self._inner: Any = None
        self._cancelled = False
        self._gen = self._run()

    def _run(self) -> Generator[Any, None, None]:
        from ..model import ModelTurn

        for attempt in (1, 2):
            self._inner = self._owner._current().stream(*self._args, **self._kwargs)
            if self._cancelled:
                self._inner.cancel()
            said = False
            try:
                mapped: ChatflowError | None = None
                for item in self._inner:
                    if isinstance(item, ModelTurn) and not self._cancelled:
                        # a reply that broke off (the verdict) because the server died is its crash
                        mapped = self._owner.crash_of(item) or self._owner.damage_of(item)
                        if mapped is not None:
                            break
                    said = said or not isinstance(item, ModelTurn)
                    yield item
                if mapped is None:
                    return
            except ChatflowError as exc:
                mapped = self._owner.crash_or(exc)
                if mapped is exc:
                    raise
            stopped = isinstance(mapped, LocalServerCrashedError) and mapped.returncode == 0
            if attempt == 1 and stopped and not said and not self._cancelled:
                # it stopped itself (idle, replaced) just before this request: a new one gets it
                log.debug("local model server: it stopped before the request; starting another")
                continue
            raise mapped from None

    def __iter__(self) -> "_LocalStream":
        return self

    def __next__(self) -> Any:
        return next(self._gen)

    @property
    def turn(self) -> Any:
        return getattr(self._inner, "turn", None)

    @property
    def accumulator(self) -> Any:
        return getattr(self._inner, "accumulator", None)

    @property
    def cancelled(self) -> bool:
        return self._cancelled or bool(getattr(self._inner, "cancelled", False))

    def partial(self) -> Any:
        if self._inner is None:
            from ..model import ModelTurn

            return ModelTurn(None, interrupted=True)
        return self._inner.partial()

    def cancel(self) -> None:
        self._cancelled = True
        inner = self._inner
        if inner is not None:
            inner.cancel()

    def close(self) -> None:
        inner = self._inner
        if inner is not None:
            inner.close()
        self._gen.close()

    def __enter__(self) -> "_LocalStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
