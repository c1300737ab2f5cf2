"""Benchmark: the webhook bot under uvicorn, and the event loop under 200 concurrent runs.

1. Deliveries per second and p50/p99 latency (of each acknowledged HTTP delivery) of the
   webhook test app (tests/webhook/app.py) for each handler style -- the seed's handler as
   written, ``claim_message``, ``run_async(message_id=...)``, ``idempotency_key`` -- at 2 and
   4 uvicorn workers on one SQLite file; customers send bursts, one message in four is
   delivered twice, 32 concurrent clients, the fake model answers at once. Each run is then
   checked like the webhook tests (answered exactly once, no duplicate processed).
2. The longest event-loop stall while 200 ``run_async`` calls run at once (200 sessions,
   a model that answers at once), on the SQLite store and the in-memory store: with the
   shared pool of ``RUN_WORKERS`` threads, and with a pool as large as the number of runs
   (one thread per run, as before the pool). A ticker task sleeps 1 ms at a time; the lag is
   how late it wakes.

Run::

    python tests/benchmarks/bench_webhook.py [--customers 150] [--workers 2 4] [--styles ...]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

try:
    from tests.benchmarks._args import positive_int
except ModuleNotFoundError:  # run as a script: its own directory is on sys.path
    from _args import positive_int  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.helpers.fakeserver import FakeServer  # noqa: E402
from tests.webhook.harness import WebhookServer, check_store, deliver, make_plan, model_calls  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def warm_up(url: str, workers: int) -> None:
    """Until every worker answered once (imports, connections): not measured."""
    from tests.webhook.harness import post_json

    seen: set[int] = set()
    for i in range(200):
        batch = await asyncio.gather(*(post_json(url, {"phone": f"+1999{i}{k}", "text": "warm up", "id": f"warm-{i}-{k}"})
                                       for k in range(workers)))
        seen |= {body["pid"] for status, body in batch if status == 200}
        if len(seen) >= workers:
            return
    raise RuntimeError("the workers did not all answer")


def bench_webhook(style: str, workers: int, customers: int, workdir: Path) -> dict[str, float]:
    db = workdir / f"{style}-{workers}.db"
    plan = make_plan(customers, 4, spread=1.0, gap=0.02)
    with FakeServer() as model, WebhookServer(db, model.url, style, workers) as server:
        asyncio.run(warm_up(server.url, workers))
        elapsed = asyncio.run(deliver(server.url, plan))
        calls = model_calls(model.requests)
    latencies = [lat for d in plan for lat in d.latencies]
    texts = {d.text for d in plan}
    twice = sum(1 for t in texts if calls[t] > 1)
    if style == "agents_sdk":  # its own tables: count model calls only
        wrong = sum(1 for t in texts if calls[t] != 1)
        problems = 0
    else:
        report = check_store(db, plan)
        wrong = sum(1 for t in texts if report.completed[t] != 1)
        problems = len(report.problems)
    return {
        "deliveries": len(plan),
        "per_s": len(plan) / elapsed,
        "p50_ms": 1000 * percentile(latencies, 0.5),
        "p99_ms": 1000 * percentile(latencies, 0.99),
        "processed_twice": twice,
        "not_exactly_once": wrong,
        "problems": problems,
    }


@contextmanager
def model_process() -> Iterator[str]:
    """The fake server in its own process (its threads are not the run's): its base URL."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.fakeserver", "--port", "0"], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def bench_lag(kind: str, pool_size: int | None, runs: int = 200) -> tuple[float, int]:
    """(max event-loop lag in ms, peak thread count) while ``runs`` run_async calls run at once."""
    from chatflow_cli import Agent, Runner, SessionStore, SQLiteSessionStore
    from chatflow_cli.core import cancel as run_cancel
    from chatflow_cli.core.model import ModelClient

    pool = run_cancel.RunPool(pool_size if pool_size is not None else run_cancel.RUN_WORKERS)
    saved, run_cancel.pool = run_cancel.pool, pool
    try:
        with model_process() as url, tempfile.TemporaryDirectory() as tmp:
            store = SQLiteSessionStore(Path(tmp) / "lag.db") if kind == "sqlite" else SessionStore()
            client = ModelClient(url, "bench-key", max_retries=0, timeout=60)
            runner = Runner(Agent("Bot", "Be brief.", model="fake-model"), store, model_client=client)
            runner.run("warm-up", "hello")

            async def main() -> tuple[float, int]:
                worst = 0.0
                peak = threading.active_count()
                done = asyncio.Event()

                async def ticker() -> None:
                    nonlocal worst, peak
                    while not done.is_set():
                        before = time.perf_counter()
                        await asyncio.sleep(0.001)
                        worst = max(worst, time.perf_counter() - before - 0.001)
                        peak = max(peak, threading.active_count())

                tick = asyncio.create_task(ticker())
                await asyncio.sleep(0.05)
                results = await asyncio.gather(*(runner.run_async(f"s{i}", f"message {i}") for i in range(runs)))
                done.set()
                await tick
                assert all(r.content == f"ok: message {i}" for i, r in enumerate(results))
                return worst * 1000, peak

            out = asyncio.run(main())
            client.close()
            store.close()
            return out
    finally:
        run_cancel.pool = saved


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--customers", type=positive_int, default=150)
    parser.add_argument("--workers", type=positive_int, nargs="+", default=[2, 4])
    parser.add_argument("--styles", nargs="+", default=["seed", "claim", "message_id", "idempotency", "agents_sdk"])
    parser.add_argument("--lag-only", action="store_true")
    parser.add_argument("--lag-one", nargs=2, metavar=("STORE", "POOL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.lag_one:
        lag, peak = bench_lag(args.lag_one[0], int(args.lag_one[1]))
        print(f"{lag:.1f} {peak}")
        return
    if not args.lag_only:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                import agents  # noqa: F401
            except ImportError:
                print("openai-agents is not installed (the bench extra): no Agents SDK comparison")
                args.styles = [s for s in args.styles if s != "agents_sdk"]
            print("style        workers  deliveries  deliveries/s  p50 ms  p99 ms  twice  not-once  problems")
            for workers in args.workers:
                for style in args.styles:
                    r = bench_webhook(style, workers, args.customers, Path(tmp))
                    print(f"{style:<12} {workers:>7}  {r['deliveries']:>10}  {r['per_s']:>12.1f}  {r['p50_ms']:>6.0f}  "
                          f"{r['p99_ms']:>6.0f}  {r['processed_twice']:>5}  {r['not_exactly_once']:>8}  "
                          f"{r['problems']:>8}", flush=True)
    print("\nevent-loop lag, 200 concurrent run_async (model answers at once), each in a fresh process")
    from chatflow_cli.core.runner import RUN_WORKERS

    for kind in ("sqlite", "memory"):
        for label, size in ((f"shared pool of {RUN_WORKERS}", RUN_WORKERS), ("one thread per run", 200)):
            outs = []
            for _ in range(3):
                done = subprocess.run([sys.executable, __file__, "--lag-one", kind, str(size)], capture_output=True,
                                      text=True, check=True, cwd=REPO)
                lag, peak = done.stdout.split()
                outs.append((float(lag), int(peak)))
            worst = statistics.median(lag for lag, _ in outs)
            peak = max(p for _, p in outs)
            print(f"{kind:<7} {label:<20} max lag {worst:7.1f} ms (median of 3)  peak threads {peak}", flush=True)


if __name__ == "__main__":
    main()
