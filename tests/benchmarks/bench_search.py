"""Full-text search over a large history: chatflow beside ``llm logs -q`` over the same text.

Run from the repository root (not collected by pytest)::

    python -m tests.benchmarks.bench_search            # 10,000 sessions / 200,000 messages
    python -m tests.benchmarks.bench_search --sessions 500 --runs 3   # a quick check

The same generated history (each session: 10 turns of a user message and a model answer,
words drawn from a 6,000-word vocabulary with a Zipf-like frequency, so some words are in
many messages and some in few) is written twice:

* into a chatflow SQLite file through ``SQLiteSessionStore`` (the store's own writes, so the
  FTS5 index is filled by its triggers as in real use);
* into an llm ``logs.db`` made by llm's own migrations (``llm.migrations.migrate``), one
  ``responses`` row a turn (prompt = the user message, response = the answer) grouped by
  ``conversations``; llm's own triggers fill its ``responses_fts``.

Both files are kept under ``--dir`` (default: a directory in /tmp) and reused when present.
For three queries -- a frequent word, a rare word, a two-word phrase -- it measures the
first page (20 hits), median of ``--runs``:

* in-process: ``store.search(q, limit=20)`` on an open store beside llm's own query function
  (``llm.logs.legacy_log_rows(db, query=q, count=20)``, the SQL ``llm logs -q`` runs for
  these rows);
* whole process: ``chatflow sessions search q`` beside ``llm logs -q q -n 20`` (output into a
  pipe), when the chatflow command exists.

Target: the first page in under 100 ms. The load average is printed with the figures.

``--store postgres`` measures the PostgreSQL store instead (``tsvector`` + GIN): a server is
started from the machine's binaries as tests/helpers/pgserver.py does, the same history is
written through ``PostgresSessionStore`` into a fresh database (not kept: the server is
temporary), and ``chatflow sessions search`` runs with ``CHATFLOW_DB`` set to its URL::

    python -m tests.benchmarks.bench_search --store postgres
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
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

TURNS = 10


def _vocabulary(rng: random.Random, size: int = 6000) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(letters) for _ in range(rng.randint(3, 9))))
    return sorted(words)


def _texts(sessions: int, seed: int = 7) -> tuple[list[str], list[list[tuple[str, str]]]]:
    rng = random.Random(seed)
    vocab = _vocabulary(rng)
    weights = [1.0 / (rank + 1) for rank in range(len(vocab))]
    out = []
    for _ in range(sessions):
        turns = []
        for _ in range(TURNS):
            user = " ".join(rng.choices(vocab, weights, k=rng.randint(6, 18)))
            model = " ".join(rng.choices(vocab, weights, k=rng.randint(20, 60)))
            turns.append((user, model))
        out.append(turns)
    return vocab, out


def build_chatflow(path: Path | str, history: list[list[tuple[str, str]]]) -> None:
    """Write ``history`` through a chatflow store: a SQLite file at ``path``, or the
    PostgreSQL database a ``postgresql://`` URL names."""
    from chatflow_cli.core.agents import Agent
    from chatflow_cli.core.memory import SQLiteSessionStore
    from chatflow_cli.core.messages import Message

    agent = Agent(name="Assistant", instructions="Helpful", model="m")
    if str(path).startswith("postgresql://"):
        from chatflow_cli.core.memory.postgres import PostgresSessionStore

        store: object = PostgresSessionStore(str(path))
    else:
        store = SQLiteSessionStore(path)
    try:
        for n, turns in enumerate(history):
            ctx = store.get_or_create(f"s{n:05d}", agent)
            for user, model in turns:
                ctx.add_message(Message.user(user))
                ctx.add_message(Message.model(model))
                ctx.complete_turn(model)
            store.save(ctx)
    finally:
        store.close()


def build_llm(path: Path, history: list[list[tuple[str, str]]]) -> None:
    import sqlite_utils
    from llm.migrations import migrate

    db = sqlite_utils.Database(path)
    migrate(db)
    conversations = []
    responses = []
    for n, turns in enumerate(history):
        cid = f"c{n:05d}"
        conversations.append({"id": cid, "name": turns[0][0][:40], "model": "m"})
        for t, (user, model) in enumerate(turns):
            responses.append(
                {
                    "id": f"r{n:05d}{t:02d}",
                    "model": "m",
                    "prompt": user,
                    "system": None,
                    "prompt_json": None,
                    "options_json": "{}",
                    "response": model,
                    "response_json": None,
                    "conversation_id": cid,
                    "duration_ms": 1,
                    "datetime_utc": "2026-01-01T00:00:00",
                }
            )
    db["conversations"].insert_all(conversations, batch_size=2000)
    db["responses"].insert_all(responses, batch_size=2000)
    db.conn.close()


def _median_ms(fn, runs: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=positive_int, default=10_000)
    parser.add_argument("--runs", type=positive_int, default=9)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "chatflow-bench-search")
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite",
                        help="the chatflow store measured (postgres: a temporary server, see the docstring)")
    args = parser.parse_args(argv)
    vocab, history = _texts(args.sessions)
    args.dir.mkdir(parents=True, exist_ok=True)
    ours = args.dir / f"chatflow-{args.sessions}" / "chatflow.db"  # a CHATFLOW_HOME
    theirs = args.dir / f"llm-{args.sessions}" / "logs.db"
    server = None
    dsn = None
    if args.store == "postgres":
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from tests.helpers.pgserver import PgServer

        server = PgServer().start()
        dsn = server.dsn(server.create_database())
        start = time.perf_counter()
        build_chatflow(dsn, history)
        print(f"built the PostgreSQL database in {time.perf_counter() - start:.0f} s")
    try:
        _measure(args, history, ours, theirs, dsn)
    finally:
        if server is not None:
            server.stop()


def _measure(args: argparse.Namespace, history: list[list[tuple[str, str]]], ours: Path, theirs: Path,
             dsn: str | None) -> None:
    if dsn is None and not ours.exists():
        ours.parent.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        build_chatflow(ours.with_suffix(".tmp"), history)
        for suffix in ("", "-wal", "-shm"):
            src = Path(str(ours.with_suffix(".tmp")) + suffix)
            if src.exists():
                src.rename(Path(str(ours) + suffix))
        print(f"built {ours} in {time.perf_counter() - start:.0f} s")
    if not theirs.exists():
        theirs.parent.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        build_llm(theirs, history)
        print(f"built {theirs} in {time.perf_counter() - start:.0f} s")
    messages = args.sessions * TURNS * 2
    queries = [_word_at(history, 30), _word_at(history, 3000), _phrase(history)]

    import sqlite_utils
    from llm.logs import legacy_log_rows

    from chatflow_cli.core.memory import SQLiteSessionStore

    if dsn is not None:
        from chatflow_cli.core.memory.postgres import PostgresSessionStore

        store: Any = PostgresSessionStore(dsn)
    else:
        store = SQLiteSessionStore(ours)
    db = sqlite_utils.Database(theirs)
    print(f"load average before: {os.getloadavg()}")
    print(f"{args.sessions} sessions, {messages} messages in {args.store}; first page of 20 hits, "
          f"median of {args.runs} runs")
    print("| query | hits in page | chatflow store.search | llm legacy_log_rows | chatflow process | llm logs -q process |")
    print("|---|---|---|---|---|---|")
    chatflow_bin = shutil.which("chatflow")
    llm_bin = shutil.which("llm")
    env = {**os.environ, "CHATFLOW_HOME": str(ours.parent), "LLM_USER_PATH": str(theirs.parent)}
    if dsn is not None:
        env["CHATFLOW_DB"] = dsn
    for q in queries:
        hits = store.search(q, limit=20)
        ours_ms = _median_ms(lambda q=q: store.search(q, limit=20), args.runs)
        theirs_ms = _median_ms(lambda q=q: legacy_log_rows(db, query=q, count=20), args.runs)
        ours_proc = theirs_proc = float("nan")
        if chatflow_bin and _has_search(chatflow_bin, env):
            ours_proc = _median_ms(
                lambda q=q: subprocess.run([chatflow_bin, "sessions", "search", q], env=env, capture_output=True,
                                           check=True), max(3, args.runs // 3))
        if llm_bin:
            theirs_proc = _median_ms(
                lambda q=q: subprocess.run([llm_bin, "logs", "-q", q, "-n", "20"], env=env, capture_output=True,
                                           check=True), max(3, args.runs // 3))
        print(f"| `{q}` | {len(hits)} | {ours_ms:.1f} ms | {theirs_ms:.1f} ms | {ours_proc:.0f} ms | "
              f"{theirs_proc:.0f} ms |")
    print(f"load average after: {os.getloadavg()}")
    store.close()


def _word_at(history: list[list[tuple[str, str]]], rank: int) -> str:
    counts: dict[str, int] = {}
    for turns in history[:200]:
        for user, model in turns:
            for w in set((user + " " + model).split()):
                counts[w] = counts.get(w, 0) + 1
    ordered = sorted(counts, key=lambda w: (-counts[w], w))
    return ordered[min(rank, len(ordered) - 1)]


def _phrase(history: list[list[tuple[str, str]]]) -> str:
    words = history[len(history) // 2][3][1].split()
    return f'"{words[2]} {words[3]}"'


def _has_search(binary: str, env: dict[str, str]) -> bool:
    r = subprocess.run([binary, "sessions", "search", "--help"], env=env, capture_output=True)
    return r.returncode == 0


if __name__ == "__main__":
    sys.exit(main())
