"""Every failure of a request, on either transport, as one chatflow error.

:func:`map_error` is the one mapping: an exception of the ``http`` transport (:mod:`.http`)
or of the ``openai`` package is first named as one kind of failure (:func:`_failure`),
and each kind has one message and one chatflow error class (the table in
:mod:`chatflow_cli.core.model`). Messages are one line, at most 240 characters, and never
hold the API key (:func:`redact`).
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import (
    AuthenticationError,
    BadRequestError,
    ChatflowError,
    ModelNotFoundError,
    NetworkError,
    ProviderError,
    ProviderResponseError,
    ProviderTimeoutError,
    RateLimitedError,
)
from .retry import retry_after_s

__all__ = [
    "DEFAULT_RETRY_AFTER_S",
    "NO_KEY_PLACEHOLDER",
    "REDACT_MIN_KEY_LEN",
    "Endpoint",
    "broken_by",
    "cause_text",
    "describe_body",
    "looks_like_html",
    "map_error",
    "mentions_stream_options",
    "one_line",
    "redact",
]

#: Seconds until a retry when a 429/5xx carried no usable ``Retry-After``.
DEFAULT_RETRY_AFTER_S = 30.0
#: API key sent to a server given by base URL alone (local servers need none; openai needs one).
NO_KEY_PLACEHOLDER = "chatflow-no-key"
#: Keys shorter than this are not redacted from messages: a real API key is longer, and
#: replacing a short test key such as ``"k"`` would garble every word containing it
#: ("check" -> "chec[redacted]"). ``Bearer <anything>`` is redacted whatever its length.
REDACT_MIN_KEY_LEN = 8

_WS = re.compile(r"\s+")
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.I | re.S)
_BEARER = re.compile(r"(?i)bearer\s+\S+")
#: Prefixes that repeat what chatflow's own line already says: ``openai``'s "Error code: 400 - "
#: and a provider's "Error: " (chatflow prints ``error:`` and the HTTP status itself).
_REDUNDANT_PREFIX = re.compile(r"^\s*(?:Error code:\s*\d{3}\s*-\s*|Error:\s*)+", re.IGNORECASE)


# --------------------------------------------------------------------------------------
# text of a message
# --------------------------------------------------------------------------------------
def redact(text: str, secret: str | None) -> str:
    """``text`` with the API key (when at least :data:`REDACT_MIN_KEY_LEN` characters) and any
    ``Bearer <token>`` replaced by ``[redacted]``."""
    if secret and secret != NO_KEY_PLACEHOLDER and len(secret) >= REDACT_MIN_KEY_LEN:
        text = text.replace(secret, "[redacted]")
    return _BEARER.sub("Bearer [redacted]", text)


def one_line(text: str, limit: int = 240) -> str:
    """``text`` with every run of white space as one space, cut to ``limit`` characters (``…``)."""
    text = _WS.sub(" ", text).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def looks_like_html(text: str) -> bool:
    """The body is an HTML page (a proxy's or a web server's), not an API answer."""
    head = text.lstrip()[:200].lower()
    return head.startswith("<!doctype html") or head.startswith("<html") or "<html" in head


def describe_body(body: Any, fallback: str = "") -> str:
    """One short phrase for an error body: the provider's message, an HTML page's title, or the
    text, without a leading "Error code: NNN - " or "Error: "; ``fallback`` for an empty body."""
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
        if looks_like_html(body):
            title = _TITLE.search(body)
            return "an HTML page" + (f" ({one_line(title.group(1), 60)})" if title else "")
        return body
    return fallback


def cause_text(exc: BaseException) -> str:
    """The first non-empty text along ``exc``'s causes (five at most), else its class name."""
    cause = exc.__cause__ or exc.__context__
    seen = 0
    while cause is not None and seen < 5:
        text = str(cause)
        if text:
            return text
        cause = cause.__cause__ or cause.__context__
        seen += 1
    return type(exc).__name__


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


def mentions_stream_options(exc: Any) -> bool:
    """A 400/422 answer that objects to ``stream_options`` (servers that do not know it)."""
    status = getattr(exc, "status_code", None)
    if status not in (400, 422):
        return False
    text = f"{getattr(exc, 'message', '')} {json.dumps(getattr(exc, 'body', None), default=str)}"
    return "stream_options" in text or "include_usage" in text


# --------------------------------------------------------------------------------------
# the mapping
# --------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Endpoint:
    """What a message says about the server: its URL (no credentials), the read timeout
    (seconds), how many attempts a request had, and the key to keep out of the text."""

    url: str
    timeout: float
    attempts: int
    api_key: str | None
    transport: str


#: The kinds of failure, each with one message and one error class (see :func:`map_error`).
_STATUS, _TIMEOUT, _CONNECT, _ERROR_EVENT, _INVALID_JSON, _UNREADABLE, _OTHER = (
    "status", "timeout", "connect", "error_event", "invalid_json", "unreadable", "other")


def _failure(exc: BaseException, transport: str) -> tuple[str, Any]:
    """``(kind, detail)`` for an exception of either transport. ``detail`` is the status
    answer's headers for ``status``, the server's words for ``error_event`` and
    ``unreadable``, the exception for ``invalid_json``, the text for ``other``."""
    from . import http

    if isinstance(exc, http.HTTPStatusFailure):
        return _STATUS, exc.headers
    if isinstance(exc, http.TimedOut):
        return _TIMEOUT, None
    if isinstance(exc, http.ConnectFailed):
        return _CONNECT, None
    if isinstance(exc, http.StreamErrorEvent):
        return _ERROR_EVENT, exc.message
    if isinstance(exc, (ValueError, UnicodeDecodeError)):  # json.JSONDecodeError is a ValueError
        return _INVALID_JSON, exc
    if isinstance(exc, http.TransportFailure) or transport == "http":
        return _OTHER, f"{type(exc).__name__}: {exc}"

    import openai

    if isinstance(exc, openai.APIStatusError):
        return _STATUS, getattr(exc.response, "headers", None)
    if isinstance(exc, openai.APITimeoutError):
        return _TIMEOUT, None
    if isinstance(exc, openai.APIConnectionError):
        return _CONNECT, None
    if isinstance(exc, openai.APIResponseValidationError):
        return _UNREADABLE, exc.message
    if isinstance(exc, openai.APIError):
        return _ERROR_EVENT, exc.message
    if isinstance(exc, openai.OpenAIError):
        return _OTHER, str(exc)
    return _OTHER, f"{type(exc).__name__}: {exc}"


def map_error(exc: BaseException, endpoint: Endpoint, *, model: str | None, mid_stream: bool = False) -> ChatflowError:
    """The chatflow error for a failed request (see the table in :mod:`chatflow_cli.core.model`).

    Args:
        exc: what the transport raised: one of :mod:`.http`'s failures, an ``openai``
            exception, or a ``ValueError`` from decoding the stream.
        endpoint: the server, for the message.
        model: the model id asked for (named by a 404), or ``None``.
        mid_stream: the failure came after the reply began: a timeout says so, and a broken
            connection is a :class:`ProviderResponseError`, not a :class:`NetworkError`.

    Returns:
        The error, with ``request_id`` (the server's ``x-request-id``, also named in the
        message; ``None`` when absent), ``error_code`` (the ``code`` of the server's error
        object -- an error answer's or an error event's -- such as ``"context_length_exceeded"``;
        ``None`` when absent) and neither ``__cause__`` nor ``__context__`` (the
        original may echo the key); callers raise it ``from None`` outside their ``except``.
    """
    kind, detail = _failure(exc, endpoint.transport)
    mapped = _error_of(kind, detail, exc, endpoint, model=model, mid_stream=mid_stream)
    code = _error_code(getattr(exc, "body", None)) if kind in (_STATUS, _ERROR_EVENT) else None
    mapped.error_code = code  # type: ignore[attr-defined]
    request_id = getattr(exc, "request_id", None)
    request_id = request_id if isinstance(request_id, str) and request_id else None
    mapped.request_id = request_id  # type: ignore[attr-defined]
    if request_id:
        mapped.message = f"{mapped.message} (request id {redact(request_id, endpoint.api_key)})"
        mapped.args = (mapped.message,)
    mapped.__cause__ = None
    mapped.__context__ = None
    mapped.__suppress_context__ = True
    return mapped


def _error_of(kind: str, detail: Any, exc: BaseException, endpoint: Endpoint, *, model: str | None,
              mid_stream: bool) -> ChatflowError:
    url = endpoint.url

    def line(text: str) -> str:
        return one_line(redact(text, endpoint.api_key))

    if kind == _STATUS:
        return _status_error(exc, detail, endpoint, model=model, line=line)
    if kind == _TIMEOUT:
        where = "in the middle of the reply" if mid_stream else f"after {_attempts(endpoint.attempts)}"
        return ProviderTimeoutError(line(f"no answer from {url} within {endpoint.timeout:g} s ({where})"))
    if kind == _CONNECT:
        if mid_stream:
            return ProviderResponseError(line(f"the stream from {url} broke off mid-reply: {cause_text(exc)}"))
        return NetworkError(line(f"cannot connect to {url} ({cause_text(exc)}) after {_attempts(endpoint.attempts)}"))
    if kind == _ERROR_EVENT:
        return ProviderResponseError(line(f"the server at {url} reported an error: {detail}"))
    if kind == _INVALID_JSON:
        return ProviderResponseError(line(f"the server at {url} sent invalid JSON in the stream: {detail}"))
    if kind == _UNREADABLE:
        return ProviderResponseError(line(f"the server at {url} sent a reply chatflow cannot read: {detail}"))
    return ProviderError(line(f"the request to {url} failed: {detail}"))


def _status_error(exc: Any, headers: Any, endpoint: Endpoint, *, model: str | None,
                  line: Any) -> ChatflowError:
    """An HTTP error answer (``status_code``, ``body``, ``message``), from either transport."""
    url = endpoint.url
    status = exc.status_code
    what = line(describe_body(exc.body, fallback=exc.message or ""))
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
        delay = retry_after_s(headers)
        if delay is not None and not math.isfinite(delay):
            delay = None  # longer than any wait: no time to name
        retry_at = time.time() + (delay if delay is not None else DEFAULT_RETRY_AFTER_S)
        wait = f"; retry in {delay:.0f} s" if delay is not None else ""
        reason = "rate limited" if status == 429 else "server error"
        return RateLimitedError(
            line(f"{reason} at {url} (HTTP {status}) after {_attempts(endpoint.attempts)}{wait}: {what}"),
            retry_at=retry_at,
            status_code=status,
        )
    return ProviderError(line(f"the server at {url} answered HTTP {status}: {what}"), status_code=status)


def broken_by(exc: BaseException, endpoint: Endpoint) -> str | None:
    """How the connection failed after the reply began (closed, reset, timed out), as the
    reason a broken reply carries; ``None`` when ``exc`` is not a transport failure
    (invalid JSON, an error event: those are raised, mapped, instead)."""
    from .http import ConnectFailed, TimedOut

    timeouts: tuple[type[BaseException], ...] = (TimedOut, TimeoutError)
    wrappers: tuple[type[BaseException], ...] = (ConnectFailed,)  # the real error is their cause
    if endpoint.transport == "openai":
        import openai

        timeouts += (openai.APITimeoutError,)
        wrappers += (openai.APIConnectionError,)
    url = endpoint.url
    names = {cls.__name__ for cls in type(exc).__mro__}
    if isinstance(exc, timeouts) or names & {"TimeoutException", "ReadTimeout"}:
        return f"no data from {url} for {endpoint.timeout:g} s mid-reply"
    transport_errors = {"TransportError", "NetworkError", "ProtocolError", "ReadError"}
    if isinstance(exc, (*wrappers, OSError)) or names & transport_errors:
        cause = str(exc) if str(exc) and not isinstance(exc, wrappers) else cause_text(exc)
        return one_line(redact(f"the connection to {url} closed mid-reply: {cause}", endpoint.api_key), 160)
    return None
