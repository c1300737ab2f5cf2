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
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any, Callable, Iterator, Mapping

from .retry import retry_delay_s, should_retry

__all__ = [
    "ConnectFailed",
    "EventStream",
    "HTTPStatusFailure",
    "RequestAborted",
    "StreamErrorEvent",
    "TimedOut",
    "TransportFailure",
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

