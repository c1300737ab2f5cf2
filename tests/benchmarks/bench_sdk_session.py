"""Benchmark of ChatflowSession against the Agents SDK's own SQLiteSession, same run, same machine.

Run: ``python tests/benchmarks/bench_sdk_session.py`` (needs ``openai-agents``).

1. ``add_items`` of one 4-item turn (a user message, a function call, its output, the
   assistant's answer) on a file database, each session in its own file.
2. ``get_items()`` of a 160-item window (40 such turns), the history the SDK's Runner reads
   before every turn: as it runs in a Runner loop (the session's cache of its window is
   current: one indexed read checks the log did not move), and cold (the cache dropped, as
   after another process wrote to the session: the window is read and parsed).
3. Eight sessions on one file (a bot serving eight conversations) each adding 10 such turns
   at once with ``asyncio.gather``: the wall time divided by the 80 calls, one sample per
   round (``--repeat`` / 10 rounds, at least 5).

Both sessions are measured in the same loop, alternating which goes first, so machine noise
falls on both; medians and quartiles of ``--repeat`` samples. chatflow runs WAL with
``synchronous=NORMAL``; the SDK's session leaves SQLite's defaults.

Not collected by pytest (not named ``test_*``): speed targets are measured, not asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    from tests.benchmarks._args import existing_dir, positive_int
except ModuleNotFoundError:  # run as a script: its own directory is on sys.path
    from _args import existing_dir, positive_int  # type: ignore[no-redef]

from chatflow_cli.core.sdk_session import ChatflowSession


def turn_items(n: int) -> list[dict[str, Any]]:
    """One turn as the SDK's Runner adds it: user input, a function call, its output, the answer."""
    return [
        {"role": "user", "content": f"What is the weather in city {n}?"},
        {"type": "function_call", "call_id": f"call_{n}", "name": "get_weather",
         "arguments": f'{{"city": "city {n}"}}', "id": f"fc_{n}"},
        {"type": "function_call_output", "call_id": f"call_{n}", "output": f'{{"celsius": {n % 35}}}'},
        {"id": f"msg_{n}", "type": "message", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": f"It is {n % 35} degrees in city {n}.", "annotations": []}]},
    ]


def quartiles(samples: list[float]) -> str:
    q = statistics.quantiles(samples, n=4)
    return f"median {statistics.median(samples) * 1000:.3f} ms (q1 {q[0] * 1000:.3f}, q3 {q[2] * 1000:.3f})"


async def measure(directory: Path, repeat: int) -> dict[str, dict[str, list[float]]]:
    from agents import SQLiteSession

    sessions: dict[str, Any] = {
        "chatflow": ChatflowSession("bench", directory / "chatflow.db"),
        "sdk": SQLiteSession("bench", db_path=directory / "sdk.db"),
    }
    add: dict[str, list[float]] = {k: [] for k in sessions}
    for n in range(1, repeat + 1):
        order = list(sessions) if n % 2 else list(reversed(sessions))
        for key in order:
            items = turn_items(n)
            t0 = time.perf_counter()
            await sessions[key].add_items(items)
            add[key].append(time.perf_counter() - t0)
    for s in sessions.values():
        s.close()
    # a fresh pair holding exactly 40 turns: get_items() returns 160 items
    window = {"chatflow": ChatflowSession("window", directory / "chatflow-window.db"),
              "sdk": SQLiteSession("window", db_path=directory / "sdk-window.db")}
    for s in window.values():
        for n in range(1, 41):
            await s.add_items(turn_items(n))
    get: dict[str, list[float]] = {k: [] for k in window}
    cold: list[float] = []
    for n in range(repeat):
        order = list(window) if n % 2 else list(reversed(window))
        for key in order:
            if key == "chatflow":  # the read path when another writer moved the log: no cache
                window[key]._cache = None
                t0 = time.perf_counter()
                await window[key].get_items()
                cold.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            items = await window[key].get_items()
            get[key].append(time.perf_counter() - t0)
            assert len(items) == 160, len(items)
    for s in window.values():
        s.close()
    return {"add": add, "get": get, "cold": {"chatflow": cold, "sdk": get["sdk"]},
            "concurrent": await measure_concurrent(directory, max(5, repeat // 10))}


async def measure_concurrent(directory: Path, rounds: int, sessions: int = 8, turns: int = 10) -> dict[str, list[float]]:
    """Per-call wall time of ``sessions`` sessions on one file adding ``turns`` turns each at once."""
    from agents import SQLiteSession

    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    store = SQLiteSessionStore(directory / "chatflow-many.db")
    made: dict[str, list[Any]] = {
        "chatflow": [ChatflowSession(f"s{k}", store) for k in range(sessions)],
        "sdk": [SQLiteSession(f"s{k}", db_path=directory / "sdk-many.db") for k in range(sessions)],
    }
    per_call: dict[str, list[float]] = {k: [] for k in made}

    async def adds(session: Any, first: int) -> None:
        for n in range(first, first + turns):
            await session.add_items(turn_items(n))

    for r in range(rounds):
        order = list(made) if r % 2 else list(reversed(made))
        for key in order:
            t0 = time.perf_counter()
            await asyncio.gather(*(adds(s, (r * sessions + k) * turns) for k, s in enumerate(made[key])))
            per_call[key].append((time.perf_counter() - t0) / (sessions * turns))
    for s in made["sdk"]:
        s.close()
    store.close()
    return per_call


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=positive_int, default=300, help="samples per figure (default 300)")
    parser.add_argument("--dir", type=existing_dir, help="directory for the databases (default: a temporary one)")
    args = parser.parse_args(argv)
    try:
        import agents  # noqa: F401
    except ImportError:
        print("openai-agents is not installed: pip install -e '.[agents-sdk]'")
        return 2
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        print(f"python {sys.version.split()[0]}, sqlite {__import__('sqlite3').sqlite_version}, files in {tmp}")
        results = asyncio.run(measure(Path(tmp), args.repeat))
    labels = {"add": "add_items, one 4-item turn", "get": "get_items(), 160-item window",
              "cold": "get_items(), 160-item window, log moved by another writer (no cache)",
              "concurrent": "add_items, 8 sessions on one file at once (wall time per call)"}
    for figure, label in labels.items():
        ours, theirs = results[figure]["chatflow"], results[figure]["sdk"]
        ratio = statistics.median(ours) / statistics.median(theirs)
        print(f"{label}:")
        print(f"   ChatflowSession (SQLite store)    {quartiles(ours)}")
        print(f"   Agents SDK SQLiteSession          {quartiles(theirs)}")
        print(f"   ratio {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
