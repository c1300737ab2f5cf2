"""Benchmark: the token-budget context window of a 10,000-turn session against a 100-turn one.

Run: ``python tests/benchmarks/bench_token_window.py``. Each session has a system message,
4-message turns with a tool call (as ``bench_store.py``), ``max_turns`` 40, and a
compaction summary of its turns up to 60 before its end. A sample is what a request costs
before it is sent: ``store.get()`` (the SYSTEM messages, the newest summary, the live turns
after it: indexed queries reading the window's rows with their stored token counts) and
choosing the newest whole turns that fit a 1,500-token budget. The target: the 10,000-turn
session within 1.2x of the 100-turn one.

Not collected by pytest (not named ``test_*``): speed targets are measured, not asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

try:
    from tests.benchmarks._args import positive_int
except ModuleNotFoundError:  # run as a script: its own directory is on sys.path
    from _args import positive_int  # type: ignore[no-redef]

from chatflow_cli.core.memory.context import split_turns
from chatflow_cli.core.memory import Owner
from chatflow_cli.core.messages import Message
from chatflow_cli.core.sqlite_store import SQLiteSessionStore
from chatflow_cli.core.tokens import select_window

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_store import AGENT, fill, ms  # noqa: E402

BUDGET = 1500


def summarise(store: SQLiteSessionStore, session_id: str, through: int) -> None:
    session = store.begin_compaction(session_id, owner=Owner.current())
    store.finish_compaction(session, Message.summary("The user asked about the weather of many cities. " * 8,
                                                     through), {"model": "bench", "tokens_before": 0})


def window(store: SQLiteSessionStore, session_id: str) -> tuple[int, int]:
    ctx = store.get(session_id)
    assert ctx is not None
    systems, _, turns = split_turns(ctx.history)
    return select_window(systems, turns, BUDGET)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=positive_int, default=300, help="samples per figure (default 300)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteSessionStore(Path(tmp) / "window.db")
        store.set_agent_resolver(lambda name: AGENT)
        t0 = time.perf_counter()
        fill(store, "big", 10_000)
        fill(store, "small", 100)
        summarise(store, "big", 9_940)
        summarise(store, "small", 40)
        print(f"python {sys.version.split()[0]}; setup {time.perf_counter() - t0:.1f} s")
        for sid in ("big", "small"):
            kept, tokens = window(store, sid)
            print(f"   {sid}: {kept} whole turns, {tokens} tokens of {BUDGET} (with the summary)")
        samples: dict[str, list[float]] = {"big": [], "small": []}
        for _ in range(args.repeat):  # interleaved, so both see the same machine load
            for sid in ("big", "small"):
                t0 = time.perf_counter()
                window(store, sid)
                samples[sid].append(time.perf_counter() - t0)
        store.close()
    print(f"token-budget window ({BUDGET} tokens, max_turns 40, a summary), store.get() + select_window()")
    print(f"   10,000-turn session: {ms(samples['big'])}")
    print(f"   100-turn session:    {ms(samples['small'])}")
    print(f"   ratio big/small: {statistics.median(samples['big']) / statistics.median(samples['small']):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
