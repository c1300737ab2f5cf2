"""Waiting on observable state instead of sleeping.

``wait_until(predicate, timeout=10, what=...)`` polls ``predicate`` until it returns a truthy
value and returns that value; past ``timeout`` seconds it fails the test naming ``what``.
Tests wait on what the program shows (a file, a row's status, a request the fake server got,
text on a screen) so that an assertion that something did NOT happen is made only after the
program has reached the point where it would have happened.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, *, interval: float = 0.02,
               what: str = "the condition") -> T:
    """Poll ``predicate`` every ``interval`` seconds until it is truthy; return its value.

    Raises:
        AssertionError: ``predicate`` stayed falsy for ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
