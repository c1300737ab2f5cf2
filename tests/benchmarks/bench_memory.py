"""Benchmark (issue 26): memory stores beside what they sit next to.

Run from the repository root (not collected by pytest)::

    python -m tests.benchmarks.bench_memory                 # 200 turns a side, 10,000 documents
    python -m tests.benchmarks.bench_memory --turns 40 --documents 1000 --runs 3   # a quick check

``tool``: time per turn of a Runner on a SQLite file whose turn makes one tool call (two model
requests, the fake server in its own process, no delay), four sides run in rounds A B C D,
in the same process and run: a plain Python ``@tool`` returning the same text ``memory_view``
shows (so both sides' context windows grow alike), ``memory_view`` of a document,
``memory_str_replace`` (a versioned write: the store's seq, the document, its history and
its full-text words, one transaction), ``memory_create``. Reported: each side's median
ms/turn and the memory sides' extra time over the plain tool: the difference of the medians,
and the median of each round's difference (steadier under load: both turns of a pair ran
moments apart; each round starts with the next side). Target: at most 2 ms.

``search``: the same generated text (bench_search.py's vocabulary and Zipf-like weights)
written as 10,000 memory documents (one store, each a turn's user and model text) and as
10,000 turns (1,000 sessions of 10 turns) in one SQLite file; for a frequent word, a rare
word and a phrase, the first page (20 hits) of ``store.search_memory`` beside
``store.search``, median of ``--runs``, the two sides run in turn (target: memory at most the
sessions' time).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    from tests.benchmarks._args import positive_int
    from tests.benchmarks.bench_runner import server_process
    from tests.benchmarks.bench_search import TURNS, _phrase, _texts, _word_at
except ModuleNotFoundError:  # run as a script: its own directory is on sys.path
    from _args import positive_int  # type: ignore[no-redef]
    from bench_runner import server_process  # type: ignore[no-redef]
    from bench_search import TURNS, _phrase, _texts, _word_at  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

SIDES = ("plain tool", "memory_view", "memory_str_replace", "memory_create")


def _calls(side: str, i: int) -> tuple[str, dict[str, Any]]:
    if side == "plain tool":
        return "get_weather", {"city": f"City{i}"}
    if side == "memory_view":
        return "memory_view", {"path": "weather.md"}
    if side == "memory_str_replace":
        return "memory_str_replace", {"path": "weather.md", "old_str": f"tally {i}\n", "new_str": f"tally {i + 1}\n"}
    return "memory_create", {"path": f"cities/city{i}.md", "file_text": f"City{i}: 12C, sunny.\n"}


def _order(i: int) -> tuple[str, ...]:
    """Round ``i``'s sides: each round starts one side further, so no side is always first."""
    k = i % len(SIDES)
    return SIDES[k:] + SIDES[:k]


def bench_tool(turns: int, workdir: Path) -> tuple[dict[str, float], dict[str, float]]:
    from chatflow_cli import Agent, Runner, tool
    from chatflow_cli.core.model import ModelClient
    from chatflow_cli.core.resources import Mount
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    document = "Weather notes.\ntally 0\n" + "A line of notes.\n" * 40
    shown = "\n".join(f"{n:6d}\t{line}" for n, line in enumerate(document.splitlines(), 1))

    @tool
    def get_weather(city: str) -> str:
        """Weather in a city."""
        return f"notes/weather.md (version 1, 42 lines, 705 B):\n{shown}"  # what memory_view shows

    rounds = turns + 2  # one warm-up round
    replies: list[dict[str, Any]] = []
    for i in range(rounds):
        for side in _order(i):
            name, args = _calls(side, i)
            replies.append({"type": "tool_calls", "calls": [[f"call_{side[:6]}_{i}", name, json.dumps(args)]]})
            replies.append({"type": "text", "text": "Done.", "chunks": ["Done."]})
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    with server_process(replies) as url:
        store = SQLiteSessionStore(str(workdir / "memory-tool.db"))
        store.create_memory_store("notes")
        store.write_document("notes", "weather.md", document)
        agent = Agent("Bot", "Be brief.", model="fake-model", tools=[get_weather])
        runner = Runner(agent, store, model_client=ModelClient(url, "bench-key"))
        mounts = [Mount.memory_store("notes")]
        for i in range(rounds):
            for side in _order(i):
                start = time.perf_counter()
                result = runner.run(f"bench-{side.replace(' ', '-')}", f"Round {i}", max_turns=40,
                                    resources=mounts)
                took = time.perf_counter() - start
                if i >= 2:
                    times[side].append(took)
                assert result.content == "Done.", result.content
        history = store.memory_history("notes")
        assert len([v for v in history if v.op == "str_replace"]) == rounds, "a memory write did not happen"
        store.close()
    plain = times["plain tool"]
    return ({side: statistics.median(values) for side, values in times.items()},
            {side: statistics.median(t - p for t, p in zip(values, plain)) for side, values in times.items()})


def bench_search(documents: int, runs: int, workdir: Path) -> list[tuple[str, int, float, int, float]]:
    from chatflow_cli.core.agents import Agent
    from chatflow_cli.core.messages import Message
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    _vocab, history = _texts(max(1, documents // TURNS))
    store = SQLiteSessionStore(str(workdir / "memory-search.db"))
    agent = Agent(name="Assistant", instructions="Helpful", model="m")
    store.create_memory_store("notes")
    batch: dict[str, str] = {}
    for n, turns in enumerate(history):
        ctx = store.get_or_create(f"s{n:05d}", agent)
        for t, (user, model) in enumerate(turns):
            ctx.add_message(Message.user(user))
            ctx.add_message(Message.model(model))
            ctx.complete_turn(model)
            batch[f"notes/s{n:05d}/t{t:02d}.md"] = f"{user}\n{model}"
        store.save(ctx)
        if len(batch) >= 1000:
            store.write_documents("notes", batch)
            batch = {}
    if batch:
        store.write_documents("notes", batch)
    store.search("warmup")  # indexes the messages written (the session search indexes when it searches)
    out = []
    for q in (_word_at(history, 30), _word_at(history, 3000), _phrase(history)):
        sides = [lambda q=q: store.search_memory(q, limit=20), lambda q=q: store.search(q, limit=20)]
        hits = [len(side()) for side in sides]  # and a warm-up
        samples: list[list[float]] = [[], []]
        for run in range(runs):  # interleaved, each side first every other run: both see the same load
            for k in ((0, 1) if run % 2 == 0 else (1, 0)):
                start = time.perf_counter()
                sides[k]()
                samples[k].append(time.perf_counter() - start)
        out.append((q, hits[0], statistics.median(samples[0]), hits[1], statistics.median(samples[1])))
    store.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=positive_int, default=200, help="measured turns a side")
    parser.add_argument("--documents", type=positive_int, default=10_000)
    parser.add_argument("--runs", type=positive_int, default=9)
    parser.add_argument("--only", choices=("tool", "search"))
    args = parser.parse_args(argv)
    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.only != "search":
            per_turn, paired = bench_tool(args.turns, work)
            plain = per_turn["plain tool"]
            print(f"\n{args.turns} turns a side, one tool call each (two model requests), SQLite, fake server")
            for side, value in per_turn.items():
                extra = "" if side == "plain tool" else (
                    f"   extra over the plain tool: {(value - plain) * 1000:+.2f} ms "
                    f"(median of the rounds' differences {paired[side] * 1000:+.2f} ms)")
                print(f"  {side:<20} median {value * 1000:8.2f} ms/turn{extra}")
        if args.only != "tool":
            rows = bench_search(args.documents, args.runs, work)
            print(f"\n{args.documents} memory documents beside {args.documents} turns, SQLite; first page of 20, "
                  f"median of {args.runs}")
            for q, mh, mt, sh, st in rows:
                print(f"  query {q!r:<28} memory {mt * 1000:7.2f} ms ({mh} hits)   sessions {st * 1000:7.2f} ms "
                      f"({sh} hits)   ratio {mt / st:.2f}")
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
