"""Retry rules shared by both transports, and the one reading of ``Retry-After``.

The ``openai`` transport retries inside the ``openai`` package; the ``http`` transport
(:mod:`.http`) follows the same rules with the functions below, and the error a request
ends with (:mod:`.errors`) reads the server's wait with the same :func:`retry_after_s`,
so a retry, its wait and the ``retry_at`` of the final error never disagree.
"""

from __future__ import annotations

import email.utils
import math
import random
import time
from typing import Any

__all__ = [
    "INITIAL_RETRY_DELAY_S",
    "MAX_RETRY_AFTER_S",
    "MAX_RETRY_DELAY_S",
    "retry_after_s",
    "retry_delay_s",
    "should_retry",
]

#: The backoff: the first retry waits about this long (seconds), doubling each time…
INITIAL_RETRY_DELAY_S = 0.5
#: …up to this (seconds).
MAX_RETRY_DELAY_S = 8.0
#: A server's Retry-After longer than this (seconds) is not waited for: the error is raised at once.
MAX_RETRY_AFTER_S = 120.0

_INFINITY_LITERALS = ("inf", "+inf", "infinity", "+infinity")


def retry_after_s(headers: Any, *, now: float | None = None) -> float | None:
    """The wait a failed answer asks for, in seconds, or ``None`` when it asks for none.

    ``retry-after-ms`` (milliseconds) is read first, then ``retry-after`` (seconds, or an
    HTTP date such as ``Wed, 21 Oct 2026 07:28:00 GMT``). The first of the two headers
    whose value is a number decides, as the ``openai`` client reads them; a ``retry-after``
    that is not a number is read as a date.

    Args:
        headers: a mapping with ``get`` (``httpx`` headers are case-insensitive; a plain
            ``dict`` needs lower-case names), or ``None``.
        now: the current time (epoch seconds) a date is measured from; default ``time.time()``.

    Returns:
        ``None`` for no header, a value that is neither a number nor a date, ``NaN``, the
        literal ``inf``, or a wait below zero (a date in the past): no usable wait, the
        backoff applies. ``math.inf`` for a number too large for a float (``1e400``): a wait
        longer than any limit, so the request is not retried. Else the seconds (``0`` and up).
    """
    if headers is None:
        return None
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if number == math.inf and str(value).strip().lower() not in _INFINITY_LITERALS:
            return math.inf  # an overflowing number: too long, not "unspecified"
        return _usable(number / divisor)
    value = headers.get("retry-after")
    try:
        parsed = email.utils.parsedate_tz(value)
        if parsed is None:
            return None
        return _usable(float(email.utils.mktime_tz(parsed)) - (time.time() if now is None else now))
    except (TypeError, ValueError, OverflowError, OSError):
        return None


def _usable(seconds: float) -> float | None:
    """``seconds`` when it is a wait (finite, not negative); else ``None``."""
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def should_retry(status: int, headers: Any) -> bool:
    """Whether an error answer with HTTP ``status`` is retried.

    Not when its ``Retry-After`` is longer than :data:`MAX_RETRY_AFTER_S`; else as an
    ``x-should-retry: true`` / ``false`` header says; else for 408, 409, 429 and 5xx.
    """
    delay = retry_after_s(headers)
    if delay is not None and delay > MAX_RETRY_AFTER_S:
        return False
    verdict = headers.get("x-should-retry") if headers is not None else None
    if verdict == "true":
        return True
    if verdict == "false":
        return False
    return status in (408, 409, 429) or status >= 500


def retry_delay_s(retry: int, headers: Any) -> float:
    """Seconds to wait before retry number ``retry`` (0-based): the answer's ``Retry-After``
    when it is above 0 and at most :data:`MAX_RETRY_AFTER_S`, else ``0.5 * 2**retry``
    capped at :data:`MAX_RETRY_DELAY_S`, less a random 0-25 %."""
    delay = retry_after_s(headers)
    if delay is not None and 0 < delay <= MAX_RETRY_AFTER_S:
        return delay
    backoff = min(INITIAL_RETRY_DELAY_S * 2.0 ** min(retry, 1000), MAX_RETRY_DELAY_S)
    return max(0.0, backoff * (1 - 0.25 * random.random()))
