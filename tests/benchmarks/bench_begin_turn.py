"""Benchmark of ``begin_turn`` on the SQLite store. Run: ``python tests/benchmarks/bench_begin_turn.py``.

A session whose 40-turn window is full (a user message, a tool call, its result and the
answer per turn: 160 messages in the window) starts 640 turns; the time of each
``begin_turn`` (one write transaction: claim the session, append the user message, load the
window) is measured once the window is full, next to a plain ``get()`` (one window load) for
scale. ``begin_turn`` loads the window once, so it costs about one ``get()`` plus the writes.

Not collected by pytest (not named ``test_*``): speed targets are measured, not asserted.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.events import SessionStatus
from chatflow_cli.core.memory import Owner
from chatflow_cli.core.messages import Message, ToolCall
from chatflow_cli.core.sqlite_store import SQLiteSessionStore

AGENT = Agent(name="Bench", instructions="")
TURNS = 640
WARM = 60  # the window is full (40 turns) from turn 41 on


def rest_of_turn(n: int) -> list[Message]:
    return [
        Message.model(None, [ToolCall(f"call_{n}", "get_weather", f'{{"city": "city {n}"}}')]),
        Message.tool(f"call_{n}", f'{{"city": "city {n}", "celsius": {n % 35}}}', name="get_weather"),
        Message.model(f"It is {n % 35} degrees in city {n}."),
    ]


def summary(samples: list[float]) -> str:
    ordered = sorted(samples)
    return (f"median {statistics.median(ordered) * 1e3:.2f} ms, p90 {ordered[int(len(ordered) * 0.9)] * 1e3:.2f} ms "
            f"(n={len(ordered)})")


def main() -> int:
    with tempfile.TemporaryDirectory() as directory:
        store = SQLiteSessionStore(str(Path(directory) / "bench.db"))
        store.set_agent_resolver(lambda name: AGENT if name == AGENT.name else None)
        owner = Owner.current()
        begin: list[float] = []
        get: list[float] = []
        for n in range(1, TURNS + 1):
            t0 = time.perf_counter()
            start = store.begin_turn("bench", default_agent=AGENT, user_message=Message.user(f"city {n}?"),
                                     owner=owner, max_turns=40)
            begin.append(time.perf_counter() - t0)
            ctx = start.session
            for msg in rest_of_turn(n):
                ctx.add_message(msg)
            ctx.complete_turn("done", AGENT)
            ctx.set_status(SessionStatus.IDLE, "turn completed")
            store.save(ctx)
            t0 = time.perf_counter()
            store.get("bench")
            get.append(time.perf_counter() - t0)
        store.close()
    print(f"begin_turn, 40-turn window full (160 messages): {summary(begin[WARM:])}")
    print(f"get() of the same session (one window load):    {summary(get[WARM:])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
