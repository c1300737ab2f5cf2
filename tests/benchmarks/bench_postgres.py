"""Benchmark of the PostgreSQL session store. Run: ``python tests/benchmarks/bench_postgres.py``.

Starts its own PostgreSQL server (``initdb`` into a temporary directory, the server's
default durability: ``fsync`` on, ``synchronous_commit`` on) as tests/helpers/pgserver.py
does, then measures:

1. Appending one 4-message turn (``store.save``, and ``await store.asave``) against the
   OpenAI Agents SDK's ``SQLAlchemySession.add_items`` with the same 4 items on the same
   server, through psycopg's async driver (``postgresql+psycopg://``), interleaved.
2. Loading the context window (max_turns 40) of a 10,000-turn session against a 100-turn one.
3. A fleet: 16 worker processes, 64 sessions (4 per worker, taken in turn), a Runner each,
   the fake model server in its own process answering at once: turns per second, and the
   p50 / p99 latency of ``begin_turn`` + the saves of one turn, beside the same fleet on one
   SQLite file (WAL, ``synchronous=NORMAL``), which serialises its writers.

Needs ``pip install -e '.[postgres,bench]'``. Not collected by pytest: figures, not asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    from tests.benchmarks._args import positive_int
except ModuleNotFoundError:  # run as a script: its own directory is on sys.path
    from _args import positive_int  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from chatflow_cli.core.agents import Agent  # noqa: E402
from tests.benchmarks.bench_store import ms, turn_messages  # noqa: E402

AGENT = Agent(name="Bench", instructions="")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def bench_append(server: Any, repeat: int) -> None:
    from chatflow_cli.core.memory.postgres import PostgresSessionStore

    print("\n1. append one 4-message turn (same PostgreSQL server, same commits for both)")
    dsn = server.dsn(server.create_database())
    sdk_url = dsn.replace("postgresql://", "postgresql+psycopg://", 1)
    try:
        from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession
    except ImportError as exc:
        print(f"   (SQLAlchemySession unavailable: {exc}; pip install -e '.[bench]')")
        SQLAlchemySession = None

    async def run() -> dict[str, list[float]]:
        store = PostgresSessionStore(dsn)
        ctx = store.get_or_create("sync", AGENT, max_turns=40)
        actx = await store.aget_or_create("async", AGENT, max_turns=40)
        sdk = SQLAlchemySession.from_url("sdk", url=sdk_url, create_tables=True) if SQLAlchemySession else None
        if sdk is not None:
            await sdk.add_items([m.to_wire() for m in turn_messages(0)])  # tables made, connection warm
        labels = {
            "sync": "chatflow store.save (PostgresSessionStore)",
            "async": "chatflow await store.asave",
            "sdk": "openai-agents await SQLAlchemySession.add_items",
        }
        samples: dict[str, list[float]] = {k: [] for k in labels}
        for n in range(1, repeat + 1):
            order = ["sync", "async", "sdk"]
            order = order[n % 3 :] + order[: n % 3]
            for key in order:
                if key == "sdk":
                    if sdk is None:
                        continue
                    items = [m.to_wire() for m in turn_messages(n)]
                    t0 = time.perf_counter()
                    await sdk.add_items(items)  # type: ignore[arg-type]
                else:
                    c = ctx if key == "sync" else actx
                    c._prune_history()
                    for msg in turn_messages(n):
                        c.add_message(msg)
                    t0 = time.perf_counter()
                    if key == "sync":
                        store.save(c)
                    else:
                        await store.asave(c)
                samples[key].append(time.perf_counter() - t0)
        store.close()
        if sdk is not None:
            await sdk.engine.dispose()
        return {labels[k]: v for k, v in samples.items() if v}

    results = asyncio.run(run())
    width = max(len(name) for name in results)
    for name, values in results.items():
        print(f"   {name:<{width}}  {ms(values)}")
    names = list(results)
    if len(names) == 3:
        print(f"   ratio chatflow save / SDK add_items: "
              f"{statistics.median(results[names[0]]) / statistics.median(results[names[2]]):.2f}")


def bench_window(server: Any, repeat: int) -> None:
    from chatflow_cli.core.messages import Message
    from chatflow_cli.core.memory.postgres import PostgresSessionStore

    dsn = server.dsn(server.create_database())
    store = PostgresSessionStore(dsn)
    store.set_agent_resolver(lambda name: AGENT)
    t0 = time.perf_counter()
    for sid, turns in (("big", 10_000), ("small", 100)):
        ctx = store.get_or_create(sid, AGENT, max_turns=40)
        ctx.add_message(Message.system("Be brief."))
        for start in range(1, turns + 1, 1000):
            for n in range(start, min(turns, start + 999) + 1):
                for msg in turn_messages(n):
                    ctx.add_message(msg)
            ctx._prune_history()
            store.save(ctx)
    print(f"\n2. load the context window (max_turns 40 -> 161 messages), store.get()  "
          f"[setup {time.perf_counter() - t0:.1f} s]")
    samples: dict[str, list[float]] = {"big": [], "small": []}
    for _ in range(repeat):
        for sid in ("big", "small"):
            t0 = time.perf_counter()
            got = store.get(sid)
            samples[sid].append(time.perf_counter() - t0)
            assert got is not None and len(got.history) == 161
    print(f"   10,000-turn session: {ms(samples['big'])}")
    print(f"   100-turn session:    {ms(samples['small'])}")
    print(f"   ratio big/small: {statistics.median(samples['big']) / statistics.median(samples['small']):.2f}")
    store.close()


WORKER = r'''
import json, sys, time
from chatflow_cli.core.agents import Agent
from chatflow_cli.core.model import ModelClient
from chatflow_cli.core.runner import Runner
kind, where, base_url, w, turns = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
if kind == "postgres":
    from chatflow_cli.core.memory.postgres import PostgresSessionStore
    store = PostgresSessionStore(where)
else:
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore
    store = SQLiteSessionStore(where)
timings = []
begin, save = store.begin_turn, store.save
current = [0.0]
def timed_begin(*a, **k):
    t0 = time.perf_counter()
    try:
        return begin(*a, **k)
    finally:
        current[0] += time.perf_counter() - t0
def timed_save(*a, **k):
    t0 = time.perf_counter()
    try:
        return save(*a, **k)
    finally:
        current[0] += time.perf_counter() - t0
store.begin_turn, store.save = timed_begin, timed_save
runner = Runner(Agent(name="Bench", instructions="", model="fake-model"), store,
                model_client=ModelClient(base_url=base_url, api_key="k"))
runner.run(f"warm-{w}", "warm up")
print("ready", flush=True)
sys.stdin.readline()
errors = 0
for k in range(turns):
    current[0] = 0.0
    try:
        runner.run(f"s-{(w * 4) + (k % 4)}", f"message {k}", wait=60)
        timings.append(current[0])
    except Exception:
        errors += 1
print(json.dumps({"timings": timings, "errors": errors}), flush=True)
store.close()
'''


def bench_fleet(server: Any, workers: int, turns: int, tmp: Path) -> None:
    print(f"\n3. a fleet: {workers} worker processes, {workers * 4} sessions, {turns} turns each, "
          "fake model answering at once")
    fake = subprocess.Popen([sys.executable, "-m", "tests.fakeserver", "--port", "0"], cwd=REPO,
                            stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert fake.stdout is not None
    base_url = fake.stdout.readline().decode().strip()
    try:
        for kind, where in (("postgres", server.dsn(server.create_database())), ("sqlite", str(tmp / "fleet.db"))):
            procs = [
                subprocess.Popen([sys.executable, "-c", WORKER, kind, where, base_url, str(w), str(turns)],
                                 cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 env={**os.environ, "PYTHONPATH": str(REPO)})
                for w in range(workers)
            ]
            for proc in procs:
                assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
            t0 = time.perf_counter()
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write(b"go\n")
                proc.stdin.flush()
            reports = [json.loads(proc.communicate(timeout=1800)[0].decode().strip().splitlines()[-1])
                       for proc in procs]
            wall = time.perf_counter() - t0
            timings = [t for r in reports for t in r["timings"]]
            errors = sum(r["errors"] for r in reports)
            label = "PostgreSQL (one server)" if kind == "postgres" else "SQLite (one file, WAL)"
            print(f"   {label:<24} {len(timings) / wall:7.1f} turns/s   begin_turn+save p50 "
                  f"{statistics.median(timings) * 1e3:7.2f} ms  p99 {_pct(timings, 0.99) * 1e3:8.2f} ms   "
                  f"errors {errors}")
    finally:
        fake.terminate()
        fake.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=positive_int, default=300, help="samples per figure of parts 1 and 2")
    parser.add_argument("--workers", type=positive_int, default=16)
    parser.add_argument("--turns", type=positive_int, default=40, help="turns per fleet worker")
    parser.add_argument("--only", choices=["append", "window", "fleet"], action="append")
    parser.add_argument("--synchronous-commit-off", action="store_true",
                        help="run the server with synchronous_commit=off (fsync still on): a commit survives a "
                             "client crash at once and a server crash after at most 3 x wal_writer_delay, the "
                             "counterpart of the SQLite store's WAL synchronous=NORMAL")
    args = parser.parse_args(argv)
    from tests.helpers.pgserver import PgServer

    settings = {"synchronous_commit": "off"} if args.synchronous_commit_off else {}
    server = PgServer(durable=True, settings=settings).start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            print(f"python {sys.version.split()[0]}, PostgreSQL server in {server.root} (fsync on, "
                  f"synchronous_commit {'off' if settings else 'on'}); "
                  f"load average {os.getloadavg()[0]:.2f}")
            if not args.only or "append" in args.only:
                bench_append(server, args.repeat)
            if not args.only or "window" in args.only:
                bench_window(server, args.repeat)
            if not args.only or "fleet" in args.only:
                bench_fleet(server, args.workers, args.turns, Path(tmp))
            print(f"load average after: {os.getloadavg()[0]:.2f}")
    finally:
        server.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
