"""The one reading of ``Retry-After`` (core/_provider/retry.py) and what each caller does
with it: the http transport's retry decision and wait, and the ``retry_at`` of the error a
request ends with."""

from __future__ import annotations

import calendar
import math
import time

import pytest

from chatflow_cli.core._provider.errors import DEFAULT_RETRY_AFTER_S, Endpoint, map_error
from chatflow_cli.core._provider.http import HTTPStatusFailure
from chatflow_cli.core._provider.retry import (
    MAX_RETRY_AFTER_S,
    MAX_RETRY_DELAY_S,
    retry_after_s,
    retry_delay_s,
    should_retry,
)
from chatflow_cli.core.errors import RateLimitedError

#: 2026-10-21 07:28:00 UTC, the clock the date cases are read against.
NOW = float(calendar.timegm((2026, 10, 21, 7, 28, 0)))


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "7"}, 7.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"retry-after": "0"}, 0.0),
        ({"retry-after": " 12 "}, 12.0),
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),  # milliseconds first
        ({"retry-after-ms": "soon", "retry-after": "9"}, 9.0),  # not a number: the next header
        ({"retry-after": "Wed, 21 Oct 2026 07:28:30 GMT"}, 30.0),  # an HTTP date, 30 s ahead
        ({"retry-after": "Wed, 21 Oct 2026 07:27:00 GMT"}, None),  # a date in the past: no wait
        ({"retry-after": "-5"}, None),  # negative
        ({"retry-after-ms": "-5", "retry-after": "9"}, None),  # the first number decides, as openai reads it
        ({"retry-after": "nan"}, None),
        ({"retry-after-ms": "NaN"}, None),
        ({"retry-after": "inf"}, None),  # the literal is no wait (openai backs off)
        ({"retry-after": "Infinity"}, None),
        ({"retry-after": "1e400"}, math.inf),  # too large for a float: longer than any limit
        ({"retry-after-ms": "1e400"}, math.inf),
        ({"retry-after": "soon"}, None),  # garbage
        ({"retry-after": ""}, None),
        ({}, None),
        (None, None),
    ],
)
def test_retry_after_reading(headers: dict[str, str] | None, expected: float | None) -> None:
    assert retry_after_s(headers, now=NOW) == expected


def test_retry_after_reads_httpx_headers_whatever_their_case() -> None:
    httpx2 = pytest.importorskip("httpx2")
    assert retry_after_s(httpx2.Headers({"Retry-After": "3"})) == 3.0
    assert retry_after_s(httpx2.Headers({"Retry-After-Ms": "1500"})) == 1.5


def test_a_date_is_measured_from_the_clock() -> None:
    ahead = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 60))
    wait = retry_after_s({"retry-after": ahead})
    assert wait is not None and 55 <= wait <= 60


@pytest.mark.parametrize(
    ("headers", "retried"),
    [
        ({"retry-after": "120"}, True),
        ({"retry-after": "121"}, False),  # longer than MAX_RETRY_AFTER_S: not waited for
        ({"retry-after": "1e400"}, False),
        ({"retry-after": "inf"}, True),  # no wait: backoff, as for no header
        ({"retry-after": "nan"}, True),
        ({"retry-after": "-1"}, True),
        ({"retry-after": "soon"}, True),
        ({"x-should-retry": "false"}, False),
        ({"x-should-retry": "true", "retry-after": "600"}, False),  # the wait limit comes first
    ],
)
def test_should_retry_a_429(headers: dict[str, str], retried: bool) -> None:
    assert MAX_RETRY_AFTER_S == 120.0
    assert should_retry(429, headers) is retried


def test_should_retry_by_status_without_headers() -> None:
    statuses = (400, 401, 404, 408, 409, 422, 429, 500, 503)
    assert [s for s in statuses if should_retry(s, {})] == [408, 409, 429, 500, 503]
    assert should_retry(400, {"x-should-retry": "true"}) is True


@pytest.mark.parametrize("value", ["0", "-3", "nan", "inf", "soon", "121", "1e400"])
def test_the_wait_is_the_backoff_when_retry_after_gives_none_in_range(value: str) -> None:
    waits = [retry_delay_s(retry, {"retry-after": value}) for retry in (0, 1, 5)]
    assert 0.375 <= waits[0] <= 0.5 and 0.75 <= waits[1] <= 1.0 and 6.0 <= waits[2] <= MAX_RETRY_DELAY_S


def test_the_wait_is_retry_after_when_in_range() -> None:
    assert retry_delay_s(0, {"retry-after": "3"}) == 3.0
    assert retry_delay_s(4, {"retry-after-ms": "120000"}) == 120.0


ENDPOINT = Endpoint("http://127.0.0.1:9/v1", 60.0, 3, None, "http")


@pytest.mark.parametrize(
    ("headers", "wait", "phrase"),
    [
        ({"retry-after": "5"}, 5.0, "; retry in 5 s:"),
        ({"retry-after": "0"}, 0.0, "; retry in 0 s:"),
        ({"retry-after": "-5"}, DEFAULT_RETRY_AFTER_S, None),
        ({"retry-after": "nan"}, DEFAULT_RETRY_AFTER_S, None),
        ({"retry-after": "1e400"}, DEFAULT_RETRY_AFTER_S, None),  # no time can be named
        ({"retry-after": "soon"}, DEFAULT_RETRY_AFTER_S, None),
        ({}, DEFAULT_RETRY_AFTER_S, None),
    ],
)
def test_retry_at_of_the_final_error(headers: dict[str, str], wait: float, phrase: str | None) -> None:
    before = time.time()
    error = map_error(HTTPStatusFailure(429, {"error": {"message": "slow down"}}, headers), ENDPOINT, model="m")
    assert isinstance(error, RateLimitedError) and error.status_code == 429
    assert error.retry_at is not None and before + wait <= error.retry_at <= time.time() + wait
    if phrase is None:
        assert "retry in" not in error.message
    else:
        assert phrase in error.message
    assert error.message.startswith("rate limited at http://127.0.0.1:9/v1 (HTTP 429) after 3 attempts")
