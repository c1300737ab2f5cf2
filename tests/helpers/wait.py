"""Waiting on observable state instead of sleeping.

``wait_until(predicate, timeout=20, what=...)`` polls ``predicate`` until it returns a truthy
value and returns that value; past ``timeout`` seconds it fails the test naming ``what``.
Tests wait on what the program shows (a file, a row's status, a request the fake server got,
text on a screen) so that an assertion that something did NOT happen is made only after the
program has reached the point where it would have happened. ``PipeReader`` collects a child
process's output in a thread so a test can wait for a line of it.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from typing import IO, Any, TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float = 20.0, what: str = "the condition", *,
               interval: float = 0.02, proc: subprocess.Popen[Any] | None = None) -> T:
    """Poll ``predicate`` every ``interval`` seconds until it is truthy; return its value.

    With ``proc``, a child process that exits first fails the wait at once, with the end of
    its output (when its pipes were captured).

    Raises:
        AssertionError: ``predicate`` stayed falsy for ``timeout`` seconds, or ``proc`` exited.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"process exited ({proc.returncode}) before {what}: "
                                 f"stdout={(out or '')[-800:]!r} stderr={(err or '')[-800:]!r}")
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


class PipeReader:
    """Everything a child process writes to one pipe, collected by a daemon thread.

    ``reader.data`` is what arrived so far; ``reader.wait_for(b"text")`` waits until it holds
    ``text``. Reading in a thread keeps the child from blocking on a full pipe.
    """

    def __init__(self, pipe: IO[bytes]) -> None:
        self._pipe = pipe
        self._chunks: list[bytes] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while chunk := self._pipe.read1(65536) if hasattr(self._pipe, "read1") else self._pipe.read(65536):
            with self._lock:
                self._chunks.append(chunk)

    @property
    def data(self) -> bytes:
        with self._lock:
            return b"".join(self._chunks)

    def wait_for(self, text: bytes, timeout: float = 30.0) -> bytes:
        """Wait until ``text`` has arrived; return everything read so far."""
        wait_until(lambda: text in self.data, timeout, what=f"{text!r} on the pipe")
        return self.data

    def finish(self, timeout: float = 30.0) -> bytes:
        """Wait for the end of the pipe (the child closed it or exited); return all it wrote."""
        self._thread.join(timeout)
        return self.data
