"""One settable clock for every test that injects time (stores, the streaming renderer).

``FakeClock(now=..., step=...)`` is a callable returning ``now`` (seconds); ``advance(s)``
moves it forward by ``s``, ``tick()`` by ``step``. Tests may also set ``clock.now`` directly.
"""

from __future__ import annotations


class FakeClock:
    """A settable clock: ``clock()`` returns ``now``; nothing moves it but the test."""

    def __init__(self, now: float = 1_700_000_000.0, step: float = 0.0) -> None:
        self.now = now
        self.step = step

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def tick(self) -> None:
        self.now += self.step
