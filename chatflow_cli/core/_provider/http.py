"""The ``http`` transport of :class:`~chatflow_cli.core.model.ModelClient`: a streamed Chat
Completions request sent with ``httpx2``, the HTTP library the ``openai`` package is built on,
without importing ``openai`` (whose type tree costs about half a second to import).

It follows the rules of ``openai``'s own client, so both transports behave alike:

* Retries: up to ``max_retries`` more attempts after HTTP 408, 409, 429 or 5xx, a timeout, or
  a connection error (refused, reset, TLS). An ``x-should-retry: true``/``false`` header
  decides for the server; a ``Retry-After`` longer than 120 s is not waited for (no retry).
  The wait before retry ``n`` (0-based) is the server's ``retry-after-ms`` / ``Retry-After``
  (seconds or an HTTP date) when it is between 0 and 120 s, else ``0.5 * 2**n`` seconds
  capped at 8 s, less a random 0-25 % (:mod:`.retry`). The wait ends at once when the
  request is cancelled; a cancelled request is never retried.
* Timeouts: ``timeout`` seconds for each read (between two chunks of a stream too) and for
  a write, at most 10 s of it to connect.
* Headers: ``Authorization: Bearer <key>``, ``Accept``/``Content-Type: application/json``,
  ``OpenAI-Organization`` / ``OpenAI-Project`` from ``OPENAI_ORG_ID`` / ``OPENAI_PROJECT_ID``
  when set (as ``openai`` sends them); redirects are followed; proxies from the environment.
* Server-sent events: httpx2's own decoder; ``data: [DONE]`` ends the stream; a data object
  with an ``"error"`` member is the server reporting a failure mid-stream.

Failures are raised as the exceptions below (never as ``openai`` ones); ``ModelClient.map_error``
turns them into chatflow errors exactly as it turns their ``openai`` counterparts. Nothing here
holds or formats the API key except the request header itself.

Aborting a request from another thread, at any moment (both transports: ``openai``'s client is
built on httpx too). A request that waits for the server's status line is blocked inside httpx,
out of reach of the response object (there is none yet). So the connections chatflow's HTTP
clients make are wrapped (:func:`make_abortable`): on every read and write a connection reports
to the :class:`RequestHandle` of the request running in the current thread, and that handle can
then shut the socket down from any thread, which wakes the blocked read at once.
:meth:`RequestHandle.open` sends the request on a helper thread, so a cancel also ends the wait
while httpx connects or ``openai`` sleeps before a retry.

The wrapping reaches into httpx/httpcore internals and checks each step; where they changed,
:func:`make_abortable` wraps nothing and a cancel still ends the iteration at once (the helper
thread is left), but the socket stays open until the server answers or the timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from typing import Any, Callable, Iterator, Mapping

from .retry import retry_delay_s, should_retry

__all__ = [
    "ConnectFailed",
    "EventStream",
    "HTTPStatusFailure",
    "RequestAborted",
    "RequestHandle",
    "StreamErrorEvent",
    "TimedOut",
    "TransportFailure",
    "make_abortable",
    "make_client",
    "open_stream",
    "request_body",
]

# --------------------------------------------------------------------------------------
# failures (no httpx2 needed to import or catch them)
# --------------------------------------------------------------------------------------
class TransportFailure(Exception):
    """Base of what :func:`open_stream` and :class:`EventStream` raise."""

    message: str = ""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class HTTPStatusFailure(TransportFailure):
    """The server answered 4xx/5xx (after the retries).

    Attributes:
        status_code: the HTTP status.
        body: the error object (the ``"error"`` member of a JSON body, or the JSON body, or
            the body text; ``None`` when empty).
        headers: the response headers (``Retry-After`` is read from them).
        request_id: the ``x-request-id`` header, when sent.
    """

    def __init__(self, status_code: int, body: Any, headers: Any) -> None:
        message = f"Error code: {status_code}"
        error = body.get("error", body) if isinstance(body, Mapping) else None
        detail = error.get("message") if isinstance(error, Mapping) else None
        if isinstance(detail, str) and detail:
            message += f" - {detail}"
        super().__init__(message)
        self.status_code = status_code
        self.body = body.get("error", body) if isinstance(body, Mapping) else body
        self.headers = headers
        self.request_id = headers.get("x-request-id") if headers is not None else None


class TimedOut(TransportFailure):
    """No answer (connect, status line or next chunk) within the timeout."""


class ConnectFailed(TransportFailure):
    """The connection failed or broke (refused, reset, DNS, TLS, closed mid-body); the
    underlying error is the ``__cause__``."""


class StreamErrorEvent(TransportFailure):
    """The server sent an ``{"error": ...}`` event in the middle of the stream.

    Attributes:
        body: the ``"error"`` member.
    """

    def __init__(self, message: str, body: Any) -> None:
        super().__init__(message)
        self.body = body


class RequestAborted(TransportFailure):
    """The request was cancelled by chatflow (never retried; never leaves ModelStream)."""


# --------------------------------------------------------------------------------------
# the client
# --------------------------------------------------------------------------------------
def make_client(timeout: float) -> Any:
    """An ``httpx2.Client`` with openai's defaults (connection limits, redirects) and the
    timeouts described above."""
    import httpx2

    return httpx2.Client(
        timeout=httpx2.Timeout(timeout, connect=min(timeout, 10.0)),
        limits=httpx2.Limits(max_connections=1000, max_keepalive_connections=100),
        follow_redirects=True,
    )


def request_headers(api_key: str) -> dict[str, str]:
    from ... import __version__

    headers = {
        "Accept": "application/json",
        "Content-Type": "application/json",
        "Authorization": f"Bearer {api_key}",
        "User-Agent": f"chatflow/{__version__}",
    }
    organization = os.environ.get("OPENAI_ORG_ID")
    project = os.environ.get("OPENAI_PROJECT_ID")
    if organization:
        headers["OpenAI-Organization"] = organization
    if project:
        headers["OpenAI-Project"] = project
    return headers


def request_body(body: Mapping[str, Any]) -> list[bytes]:
    """``body`` as the UTF-8 JSON of the request, in pieces to be sent one after the other
    (one piece unless the body has an image). An image part's URL given as a
    :class:`~chatflow_cli.core.attachments.DataURL` is written as its bytes, spliced into the
    JSON text where a placeholder string was encoded: the base64 never becomes a str, is
    never scanned by the JSON encoder, and is not even copied into one body (for a 5 MB
    image that was most of the cost of sending it). ``b"".join`` of the pieces is byte for
    byte ``json.dumps`` of the body with each URL as its str.

    Raises:
        TypeError: a value JSON cannot hold (as ``json.dumps``).
    """
    urls: list[Any] = []
    mark = "chatflow-data-url-" + os.urandom(8).hex()

    def placeholder(value: Any) -> str:
        from ..attachments import DataURL

        if type(value) is not DataURL:
            raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
        urls.append(value)
        return mark

    text = json.dumps(body, ensure_ascii=False, default=placeholder).encode("utf-8")
    if not urls:
        return [text]
    pieces = text.split(b'"' + mark.encode("ascii") + b'"')
    if len(pieces) != len(urls) + 1:  # the random mark elsewhere in the body: never in practice
        return [json.dumps(body, ensure_ascii=False, default=str).encode("utf-8")]
    out = [pieces[0]]
    for url, piece in zip(urls, pieces[1:]):
        out += [b'"' + url.prefix, url.base64, b'"' + piece]
    return out


def _error_body(response: Any) -> Any:
    text = response.text.strip()
    try:
        return json.loads(text)
    except ValueError:
        return text


def open_stream(
    client: Any,
    url: str,
    headers: Mapping[str, str],
    body: Mapping[str, Any],
    *,
    max_retries: int,
    stopping: Callable[[], bool] = lambda: False,
    sleep: Callable[[float], bool] | None = None,
    on_retry: Callable[[int, float, int | None], None] | None = None,
) -> "EventStream":
    """POST ``body`` as JSON to ``url`` and return the streamed answer once its headers came.

    Args:
        client: an ``httpx2.Client`` (:func:`make_client`).
        max_retries: retries after the first attempt (see the module docstring).
        stopping: true once the request is cancelled: no retry is started then.
        sleep: waits the given seconds and returns True if cancelled meanwhile (default:
            ``time.sleep``, never cancelled).
        on_retry: called before each retry's wait with (the attempt about to start, 2..;
            the wait in seconds; the failed attempt's HTTP status, or None with no response).

    Raises:
        HTTPStatusFailure, TimedOut, ConnectFailed, RequestAborted.
    """
    pieces = request_body(body)
    content: bytes | list[bytes] = pieces[0]
    if len(pieces) > 1:  # sent as they are, under the length of them all (not chunked)
        content = pieces
        headers = {**headers, "Content-Length": str(sum(len(piece) for piece in pieces))}
    for attempt in range(max_retries + 1):
        remaining = max_retries - attempt
        request = client.build_request("POST", url, headers=headers, content=content)
        failure: TransportFailure | None = None
        response = None
        try:
            with _as_failures():
                response = client.send(request, stream=True)
        except (TimedOut, ConnectFailed) as exc:
            failure = exc
        if failure is not None:
            if remaining > 0 and not stopping() and not _wait(_announced(on_retry, attempt, None, None), sleep):
                continue
            if stopping():
                raise RequestAborted("the request was cancelled")
            raise failure
        assert response is not None
        if response.status_code < 400:
            return EventStream(response)
        if remaining > 0 and should_retry(response.status_code, response.headers):
            response.close()
            if not stopping() and not _wait(_announced(on_retry, attempt, response.status_code, response.headers),
                                             sleep):
                continue
            raise RequestAborted("the request was cancelled")
        try:
            with _as_failures():
                response.read()
        finally:
            response.close()
        raise HTTPStatusFailure(response.status_code, _error_body(response), response.headers)
    raise AssertionError("unreachable: the last attempt returns or raises")  # pragma: no cover


@contextlib.contextmanager
def _as_failures() -> Iterator[None]:
    """Raise ``httpx2``'s errors as this module's, the original as ``__cause__``: a timeout
    (connect, read, write) as :class:`TimedOut`, any other request error or a TLS error as
    :class:`ConnectFailed`. Anything else passes unchanged."""
    import ssl

    import httpx2

    try:
        yield
    except httpx2.TimeoutException as exc:
        raise TimedOut("Request timed out.") from exc
    except (httpx2.RequestError, ssl.SSLError) as exc:
        raise ConnectFailed("Connection error.") from exc


def _announced(on_retry: Callable[[int, float, int | None], None] | None, attempt: int, status: int | None,
               headers: Any) -> float:
    """The wait before retry ``attempt`` (0-based), told to ``on_retry`` first."""
    delay = retry_delay_s(attempt, headers)
    if on_retry is not None:
        try:
            on_retry(attempt + 2, delay, status)
        except Exception:  # noqa: BLE001 - a display problem never breaks the request
            pass
    return delay


def _wait(seconds: float, sleep: Callable[[float], bool] | None) -> bool:
    """Wait before a retry; True when the request was cancelled meanwhile."""
    if sleep is None:
        time.sleep(seconds)
        return False
    return sleep(seconds)


class EventStream:
    """The server-sent events of one answer, as decoded JSON objects (``data: [DONE]`` ends it).

    Attributes:
        response: the ``httpx2.Response`` (headers known, body streaming).

    Raises (while iterating): TimedOut, ConnectFailed, StreamErrorEvent, ``ValueError`` for an
    event whose data is not JSON.
    """

    def __init__(self, response: Any) -> None:
        self.response = response

    def __iter__(self) -> Iterator[Any]:
        import httpx2

        response = self.response
        try:
            with _as_failures():
                yield from self._events(httpx2.EventSource(response, max_event_size=None))
        finally:
            response.close()

    @staticmethod
    def _events(source: Any) -> Iterator[Any]:
        for event in source:
            data = event.data
            if data.startswith("[DONE]"):
                break
            obj = json.loads(data)
            if isinstance(obj, Mapping) and obj.get("error"):
                error = obj["error"]
                message = error.get("message") if isinstance(error, Mapping) else None
                if not isinstance(message, str) or not message:
                    message = "An error occurred during streaming"
                raise StreamErrorEvent(message, error)
            yield obj


# --------------------------------------------------------------------------------------
# aborting a request from another thread (both transports; see the module docstring)
# --------------------------------------------------------------------------------------
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
