"""Benchmark (issue 4): time per turn of chatflow's Runner vs the OpenAI Agents SDK's Runner.

Each turn is one tool call (two model requests) against the fake server with no delay,
200 turns in one session:

* chatflow: ``Runner`` on a ``SQLiteSessionStore`` file, ``max_turns=40``;
* SDK: ``agents.Runner.run`` with ``SQLiteSession`` given the same window
  (``SessionSettings(limit=160)``: 40 turns of 4 items), tracing disabled.

Each side gets its own fake server in its own process (so the server's CPU is not charged
to the side being measured), scripted with the same replies. A few warm-up turns on
another session come first (imports, connection pool). Run::

    /tmp/venv/bin/python tests/benchmarks/bench_runner.py [--turns 200] [--profile]

``--profile`` prints the top of a cProfile of the chatflow side. Needs ``openai-agents``
(the ``bench`` extra). Target: chatflow at most half the SDK's time per turn.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
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

WARMUP = 3


def script(turns: int, tag: str) -> list[dict]:
    replies: list[dict] = []
    for i in range(turns):
        replies.append({"type": "tool_calls", "calls": [[f"call_{tag}_{i}", "get_weather",
                                                         json.dumps({"city": f"City{i}"})]]})
        replies.append({"type": "text", "text": f"It is 12C in City{i}.", "chunks": ["It is 12C", f" in City{i}."]})
    return replies


@contextmanager
def server_process(replies: list[dict]) -> Iterator[str]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(replies, fh)
    proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.fakeserver", "--port", "0", "--script", fh.name],
                            cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        os.unlink(fh.name)


def bench_chatflow(turns: int, workdir: Path, profile: bool) -> float:
    from chatflow_cli import Agent, Runner, tool
    from chatflow_cli.core.model import ModelClient
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    @tool
    def get_weather(city: str) -> str:
        """Weather in a city."""
        return f"12C in {city}"

    with server_process(script(turns + WARMUP, "cf")) as url:
        store = SQLiteSessionStore(str(workdir / "chatflow.db"))
        agent = Agent("Bot", "Be brief.", model="fake-model", tools=[get_weather])
        runner = Runner(agent, store, model_client=ModelClient(url, "bench-key"))
        for i in range(WARMUP):
            runner.run("warmup", f"Weather in City{i}?", max_turns=40)
        profiler = None
        if profile:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        start = time.perf_counter()
        for i in range(turns):
            result = runner.run("bench", f"Weather in City{i}?", max_turns=40)
        elapsed = time.perf_counter() - start
        if profiler is not None:
            import pstats

            profiler.disable()
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        assert result.content == f"It is 12C in City{WARMUP + turns - 1}.", result.content
        assert len([m for m in store.get("bench").history if m.role.value != "system"]) == 160
        store.close()
    return elapsed / turns


def bench_sdk(turns: int, workdir: Path) -> float:
    from agents import Agent, OpenAIChatCompletionsModel, Runner, SQLiteSession, function_tool, set_tracing_disabled
    from agents.memory import SessionSettings
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    @function_tool
    def get_weather(city: str) -> str:
        """Weather in a city."""
        return f"12C in {city}"

    async def main(url: str) -> float:
        client = AsyncOpenAI(base_url=url, api_key="bench-key")
        model = OpenAIChatCompletionsModel(model="fake-model", openai_client=client)
        agent = Agent(name="Bot", instructions="Be brief.", model=model, tools=[get_weather])
        db = str(workdir / "sdk.db")
        warm = SQLiteSession("warmup", db, session_settings=SessionSettings(limit=160))
        for i in range(WARMUP):
            await Runner.run(agent, f"Weather in City{i}?", session=warm)
        session = SQLiteSession("bench", db, session_settings=SessionSettings(limit=160))
        start = time.perf_counter()
        for i in range(turns):
            result = await Runner.run(agent, f"Weather in City{i}?", session=session)
        elapsed = time.perf_counter() - start
        assert result.final_output == f"It is 12C in City{WARMUP + turns - 1}.", result.final_output
        await client.close()
        return elapsed / turns

    with server_process(script(turns + WARMUP, "sdk")) as url:
        return asyncio.run(main(url))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=positive_int, default=200)
    parser.add_argument("--profile", action="store_true", help="cProfile the chatflow side")
    parser.add_argument("--only", choices=["chatflow", "sdk"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        results: dict[str, float] = {}
        if args.only != "sdk":
            results["chatflow Runner (SQLiteSessionStore, max_turns=40)"] = bench_chatflow(args.turns, work,
                                                                                          args.profile)
        if args.only != "chatflow":
            results["Agents SDK Runner (SQLiteSession, limit=160)"] = bench_sdk(args.turns, work)
    print(f"\n{args.turns} turns, one tool call each (two model requests), fake server, no delay")
    for name, per_turn in results.items():
        print(f"  {name:<55} {per_turn * 1000:8.2f} ms/turn")
    if len(results) == 2:
        ours, theirs = results.values()
        print(f"  ratio chatflow/SDK: {ours / theirs:.2f} (target <= 0.50)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
