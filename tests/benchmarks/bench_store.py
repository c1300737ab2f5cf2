"""Benchmark of the SQLite session store (issue 3, "Speed"). Run: ``python tests/benchmarks/bench_store.py``.

1. Loading the context window (max_turns 40) of a 10,000-turn session (40,000 messages)
   against a 100-turn session: the window query is indexed, so both take about the same.
2. Appending one 4-message turn durably (``store.save``) against the OpenAI Agents SDK's
   ``SQLiteSession.add_items`` with the same 4 items on a file database
   (``pip install openai-agents``; skipped when missing).

Durability: chatflow runs WAL with ``synchronous=NORMAL`` (a commit survives a process
crash at once, and power loss once checkpointed). The SDK leaves SQLite's default
(``FULL``: an fsync per commit). Both figures are printed for chatflow, so the
comparison is like for like.

Not collected by pytest (not named ``test_*``): speed targets are measured, not asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    from tests.benchmarks._args import existing_dir, positive_int
except ModuleNotFoundError:  # run as a script: its own directory is on sys.path
    from _args import existing_dir, positive_int  # type: ignore[no-redef]

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.messages import Message, ToolCall
from chatflow_cli.core.sqlite_store import SQLiteSessionStore

AGENT = Agent(name="Bench", instructions="")


def turn_messages(n: int) -> list[Message]:
    """One turn of 4 messages: user, a tool call, its result, the answer."""
    return [
        Message.user(f"What is the weather in city {n}?"),
        Message.model(None, [ToolCall(f"call_{n}", "get_weather", f'{{"city": "city {n}"}}')]),
        Message.tool(f"call_{n}", f'{{"city": "city {n}", "celsius": {n % 35}}}', name="get_weather"),
        Message.model(f"It is {n % 35} degrees in city {n}."),
    ]


def fill(store: SQLiteSessionStore, session_id: str, turns: int) -> None:
    ctx = store.get_or_create(session_id, AGENT, max_turns=40)
    ctx.add_message(Message.system("Be brief."))
    for start in range(1, turns + 1, 1000):  # in chunks of 1,000 turns, one transaction each
        for n in range(start, min(turns, start + 999) + 1):
            for msg in turn_messages(n):
                ctx.add_message(msg)
        ctx._prune_history()
        store.save(ctx)


def timed(fn: Callable[[], Any], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def ms(samples: list[float]) -> str:
    return f"median {statistics.median(samples) * 1e3:7.3f} ms   p90 {sorted(samples)[int(len(samples) * 0.9)] * 1e3:7.3f} ms"


def bench_window(directory: Path, repeat: int) -> None:
    store = SQLiteSessionStore(directory / "window.db")
    store.set_agent_resolver(lambda name: AGENT)
    t0 = time.perf_counter()
    fill(store, "big", 10_000)
    fill(store, "small", 100)
    print(f"setup: wrote 10,100 turns (40,402 messages) in {time.perf_counter() - t0:.1f} s")
    for sid in ("big", "small"):
        ctx = store.get(sid)
        assert ctx is not None and len(ctx.history) == 1 + 40 * 4, len(ctx.history)
    samples: dict[str, list[float]] = {"big": [], "small": []}
    for _ in range(repeat):  # interleaved, so both see the same machine load
        for sid in ("big", "small"):
            t0 = time.perf_counter()
            store.get(sid)
            samples[sid].append(time.perf_counter() - t0)
    conn = store._connection()
    sql = (
        "SELECT turn, message_json FROM chatflow_messages WHERE session_id = ? AND turn >= ? "
        "AND removed_at_seq IS NULL ORDER BY turn, position"
    )
    query = {
        sid: timed(lambda sid=sid, first=first: conn.execute(sql, (sid, first)).fetchall(), repeat)
        for sid, first in (("big", 9_961), ("small", 61))
    }
    print("\n1. load the context window (max_turns 40 -> 161 messages), store.get()")
    print(f"   10,000-turn session (40,000 messages): {ms(samples['big'])}")
    print(f"   100-turn session    (   400 messages): {ms(samples['small'])}")
    print(f"   ratio big/small: {statistics.median(samples['big']) / statistics.median(samples['small']):.2f}")
    print(f"   the indexed window query alone: big {ms(query['big'])}; small {ms(query['small'])}")
    store.close()


def bench_append(directory: Path, repeat: int) -> None:
    """Every variant appends turn n in the same iteration, in rotating order, to share machine noise."""
    print("\n2. append one 4-message turn durably (file database)")
    try:
        from agents import SQLiteSession
    except ImportError:
        print("   (openai-agents not installed: pip install openai-agents to compare)")
        SQLiteSession = None

    async def run() -> dict[str, list[float]]:
        stores: dict[str, SQLiteSessionStore] = {}
        contexts = {}
        for sync in ("NORMAL", "FULL"):
            store = SQLiteSessionStore(directory / f"append-{sync}.db")
            store._connection().execute(f"PRAGMA synchronous = {sync}")  # this thread's connection
            stores[sync] = store
            contexts[sync] = store.get_or_create("s", AGENT, max_turns=40)
        pooled = SQLiteSessionStore(directory / "append-async.db")
        contexts["async"] = await pooled.aget_or_create("s", AGENT, max_turns=40)
        sdk = SQLiteSession("s", db_path=directory / "sdk.db") if SQLiteSession is not None else None

        def stage(key: str, n: int) -> None:
            ctx = contexts[key]
            ctx._prune_history()
            for msg in turn_messages(n):
                ctx.add_message(msg)

        async def save_sync(key: str) -> None:
            stores[key].save(contexts[key])

        async def save_async() -> None:
            await pooled.asave(contexts["async"])

        labels = {
            "NORMAL": "chatflow store.save, WAL synchronous=NORMAL (default)",
            "FULL": "chatflow store.save, WAL synchronous=FULL",
            "async": "chatflow await store.asave (the store's writer thread, NORMAL)",
            "sdk": "openai-agents await SQLiteSession.add_items (its defaults)",
        }
        samples: dict[str, list[float]] = {key: [] for key in labels}
        for n in range(1, repeat + 1):
            order = ["NORMAL", "FULL", "async", "sdk"]
            order = order[n % 4 :] + order[: n % 4]
            for key in order:
                if key == "sdk":
                    if sdk is None:
                        continue
                    items = [m.to_wire() for m in turn_messages(n)]
                    t0 = time.perf_counter()
                    await sdk.add_items(items)  # type: ignore[arg-type]
                else:
                    stage(key, n)
                    t0 = time.perf_counter()
                    await (save_async() if key == "async" else save_sync(key))
                samples[key].append(time.perf_counter() - t0)
        for store in (*stores.values(), pooled):
            store.close()
        if sdk is not None:
            sdk.close()
        return {labels[k]: v for k, v in samples.items() if v}

    results = asyncio.run(run())
    width = max(len(name) for name in results)
    for name, values in results.items():
        print(f"   {name:<{width}}  {ms(values)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=positive_int, default=300, help="samples per figure (default 300)")
    parser.add_argument("--dir", type=existing_dir, help="directory for the databases (default: a temporary one)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        print(f"python {sys.version.split()[0]}, sqlite {__import__('sqlite3').sqlite_version}, files in {tmp}")
        bench_window(Path(tmp), args.repeat)
        bench_append(Path(tmp), args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
