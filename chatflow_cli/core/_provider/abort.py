"""Aborting a request from another thread, at any moment.

A request that waits for the server's status line is blocked inside httpx, out of reach
of the response object (there is none yet). So the connections chatflow's HTTP clients
make are wrapped (:func:`make_abortable`): on every read and write a connection reports
to the :class:`RequestHandle` of the request running in the current thread, and that
handle can then shut the socket down from any thread, which wakes the blocked read at
once. :meth:`RequestHandle.open` sends the request on a helper thread, so a cancel also
ends the wait while httpx connects or ``openai`` sleeps before a retry.

The wrapping reaches into httpx/httpcore internals and checks each step; where they
changed, :func:`make_abortable` wraps nothing and a cancel still ends the iteration at
once (the helper thread is left), but the socket stays open until the server answers or
the timeout.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

__all__ = ["RequestHandle", "make_abortable"]

#: The :class:`RequestHandle` of the request this thread sends, while it sends it.
_current = threading.local()
_aborted_class: Any = None


class RequestHandle:
    """The abort state of one streamed request: its connection, its response, whether it
    was cancelled (``cancel``) or left by the waiting side, and whether it is over.

    Thread-safe: the request runs on a helper thread, :meth:`shutdown` may come from any.

    Args:
        cancel: set (from any thread) to stop the request.
        transport: ``"openai"`` or ``"http"``: which exception a cancelled I/O raises.

    Attributes:
        response: the response once its headers came (``None`` before).
    """

    def __init__(self, cancel: threading.Event, transport: str) -> None:
        self.cancel = cancel
        self.transport = transport
        self.response: Any = None
        self._lock = threading.Lock()
        self._connection: Any = None  # the connection of the request, while it is ours
        self._done = False  # finished: the connection may serve another request now
        self._abandoned = False  # left by the waiting side (cancel, Ctrl-C) while opening

    def stopping(self) -> bool:
        """The request is cancelled or abandoned: no more I/O, no retry."""
        return self._abandoned or self.cancel.is_set()

    def aborted(self) -> BaseException:
        """The exception a cancelled request's I/O raises. On the ``openai`` transport an
        ``openai.OpenAIError``, which openai re-raises as it is, without retrying (any other
        error would be retried); on the ``http`` transport its own ``RequestAborted``."""
        if self.transport == "http":
            from .http import RequestAborted

            return RequestAborted("the request was cancelled")
        global _aborted_class
        if _aborted_class is None:
            import openai

            class _OpenAIRequestAborted(openai.OpenAIError):  # type: ignore[misc, unused-ignore]
                """The request was cancelled by chatflow (internal; never leaves ModelStream)."""

            _aborted_class = _OpenAIRequestAborted
        aborted: BaseException = _aborted_class("the request was cancelled")
        return aborted

    def attach(self, connection: Any) -> None:
        """Called by the connection the request reads or writes on (helper thread)."""
        with self._lock:
            if self._done:
                return
            self._connection = connection
            if self.stopping():
                _shutdown(connection)

    def shutdown(self) -> None:
        """Shut the request's socket down, which wakes a read blocked on it.

        Closing a response from another thread does not wake a blocked ``recv()``; shutting
        the socket down does. The connection is known from its first read or write, else --
        once the headers came -- from the response's ``network_stream`` extension. Never
        after the request is over: the pool may have given the connection to another since.
        """
        with self._lock:
            if self._done:
                return
            connection = self._connection
            if connection is None and self.response is not None:
                connection = self.response.extensions.get("network_stream")
            _shutdown(connection)

    def release(self) -> None:
        """The request is over: forget its connection, then close the response."""
        with self._lock:
            self._done = True
            self._connection = None
        self.close_response()

    def close_response(self) -> None:
        """Close the response, if any (a dead socket's complaint is ignored)."""
        _close_quietly(self.response)

    def open(self, send: Callable[[], Any]) -> Any:
        """Run ``send()`` (which returns an object with a ``response``) on a helper thread
        and wait for it; ``None`` when the request was cancelled first (it is then aborted,
        never retried).

        The helper thread lets a cancel end the wait at once whatever httpx and openai are
        doing (connecting, waiting for headers, sleeping before a retry); the connection is
        shut down too, so the server sees the request go and the thread ends promptly.

        Raises:
            What ``send`` raised, unless the request was cancelled meanwhile;
            ``KeyboardInterrupt`` while waiting (the request is aborted first).
        """
        result: dict[str, Any] = {}
        finished = threading.Event()

        def run() -> None:
            _current.handle = self
            try:
                opened = send()
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                result["error"] = exc
            else:
                with self._lock:
                    abandoned = self._abandoned
                    if not abandoned:
                        result["stream"] = opened
                if abandoned:
                    _close_quietly(opened.response)
            finally:
                _current.handle = None
                finished.set()

        threading.Thread(target=run, name="chatflow-request", daemon=True).start()
        cancel = self.cancel
        try:
            while not finished.wait(0.05):
                if cancel.is_set():
                    break
        except BaseException:  # Ctrl-C while waiting: abort the request, then let it propagate
            self._abandon(result)
            raise
        if cancel.is_set():
            self._abandon(result)
            return None
        if "error" in result:
            error = result["error"]
            if self.stopping():
                return None
            raise error
        return result["stream"]

    def _abandon(self, result: dict[str, Any]) -> None:
        """Leave the request: its thread closes what it gets from now on; close what it got."""
        with self._lock:
            self._abandoned = True
            opened = result.pop("stream", None)
        self.shutdown()
        if opened is not None:
            _close_quietly(opened.response)


def _close_quietly(response: Any) -> None:
    if response is not None:
        try:
            response.close()
        except Exception:  # noqa: BLE001 - closing a shut-down socket may complain; nothing to do
            pass


def _shutdown(connection: Any) -> None:
    """Shut a connection's socket down (both ways): a read blocked on it in another thread returns."""
    try:
        sock = connection.get_extra_info("socket") if connection is not None else None
        if sock is not None:
            import socket

            # the plain socket method: SSLSocket.shutdown would also drop its TLS object under
            # the reading thread's feet
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except Exception:  # noqa: BLE001 - already closed or never connected: nothing to wake
        pass


class _AbortableConnection:
    """An httpcore network stream that reports to the current thread's request and fails
    fast once that request is cancelled."""

    __slots__ = ("_inner",)

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def _claim(self) -> RequestHandle | None:
        handle: RequestHandle | None = getattr(_current, "handle", None)
        if handle is not None:
            handle.attach(self)
            if handle.stopping():
                raise handle.aborted()
        return handle

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        handle = self._claim()
        try:
            data: bytes = self._inner.read(max_bytes, timeout)
        except Exception:
            if handle is not None and handle.stopping():
                raise handle.aborted() from None
            raise
        if not data and handle is not None and handle.stopping():
            raise handle.aborted()
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        handle = self._claim()
        try:
            self._inner.write(buffer, timeout)
        except Exception:
            if handle is not None and handle.stopping():
                raise handle.aborted() from None
            raise

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, *args: Any, **kwargs: Any) -> "_AbortableConnection":
        return _AbortableConnection(self._inner.start_tls(*args, **kwargs))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _AbortableBackend:
    """Wraps httpcore's network backend so that every connection is an :class:`_AbortableConnection`."""

    __slots__ = ("_inner",)

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def _wrap(self, connection: Any) -> _AbortableConnection:
        wrapped = _AbortableConnection(connection)
        handle: RequestHandle | None = getattr(_current, "handle", None)
        if handle is not None and handle.stopping():  # cancelled while connecting
            connection.close()
            raise handle.aborted()
        return wrapped

    def connect_tcp(self, *args: Any, **kwargs: Any) -> _AbortableConnection:
        return self._wrap(self._inner.connect_tcp(*args, **kwargs))

    def connect_unix_socket(self, *args: Any, **kwargs: Any) -> _AbortableConnection:
        return self._wrap(self._inner.connect_unix_socket(*args, **kwargs))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def make_abortable(http_client: Any) -> bool:
    """Wrap the network backend of every connection pool of an ``httpx`` client (the direct
    transport and any proxy mounts); ``False`` when httpx's internals were not as expected
    (see the module docstring)."""
    transports = [getattr(http_client, "_transport", None), *(getattr(http_client, "_mounts", None) or {}).values()]
    done = False
    for transport in transports:
        pool = getattr(transport, "_pool", None)
        backend = getattr(pool, "_network_backend", None)
        if backend is None or not callable(getattr(backend, "connect_tcp", None)):
            continue
        if pool is not None and not isinstance(backend, _AbortableBackend):
            pool._network_backend = _AbortableBackend(backend)
        done = True
    return done
