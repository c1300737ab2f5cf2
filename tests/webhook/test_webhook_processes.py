"""A webhook bot under uvicorn (2 and 4 worker processes, one SQLite file), driven over HTTP.

Bursts per customer, duplicates (some at the same moment), redelivery of every failed
delivery; then the same with 10 SIGKILLs of workers at random moments. Every acknowledged
message must be answered exactly once (one completed turn; one model call without kills),
duplicates never processed, every window valid and holding each message once, ``seq``
gap-free, no session left running, no claim left in progress. Run with the seed's handler
as written and with the README's patterns. Arrival order has its own test: turns that wait
for a busy session start in the order they reached the store, across worker processes.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.fakeserver import FakeServer
from tests.helpers.wait import wait_until

from .harness import WebhookServer, check_store, deliver, make_plan, model_calls

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

STYLES = ["seed", "claim", "message_id", "idempotency"]


def _run(tmp_path: Path, style: str, workers: int, kills: int) -> None:
    db = tmp_path / "bot.db"
    customers, per_customer = (30, 4) if kills == 0 else (40, 4)
    plan = make_plan(customers, per_customer, spread=2.0 if kills == 0 else 6.0)
    with FakeServer() as model:
        model.reply_delay = 0.02
        with WebhookServer(db, model.url, style, workers) as server:
            rng = random.Random(1919)
            stop = threading.Event()

            def killer() -> None:
                done = 0
                while done < kills and not stop.wait(rng.uniform(0.25, 0.5)):
                    if server.kill_a_worker(rng) is not None:
                        done += 1

            thread = threading.Thread(target=killer, daemon=True)
            thread.start()
            asyncio.run(deliver(server.url, plan))
            stop.set()
            thread.join()
            assert len(server.kills) == kills
        calls = model_calls(model.requests)

    unacked = [d.msg_id for d in plan if d.acked_at is None]
    assert unacked == [], f"deliveries never acknowledged: {unacked}"
    report = check_store(db, plan)
    assert report.problems == []
    texts = sorted({d.text for d in plan})
    wrong = {t: report.completed[t] for t in texts if report.completed[t] != 1}
    assert wrong == {}, f"messages not answered exactly once: {wrong}"
    for text in texts:
        if kills == 0:
            assert calls[text] == 1, f"{text!r}: {calls[text]} model calls"
        else:  # an attempt killed while the model answered is asked again, never more
            assert 1 <= calls[text] <= 1 + report.interrupted[text] + (1 if report.interrupted[text] else 0), text
    if kills == 0:
        assert all(d.statuses == [200] for d in plan), "no delivery fails without kills"


@pytest.mark.slow
@pytest.mark.ci_long
@pytest.mark.parametrize("workers", [2, 4])
@pytest.mark.parametrize("style", STYLES)
def test_bursts_and_duplicates(tmp_path: Path, style: str, workers: int) -> None:
    _run(tmp_path, style, workers, kills=0)


def _kills_case(style: str, workers: int) -> object:
    """The README's ``message_id`` handler with 2 workers runs by default; the others in CI's
    ci_long pass."""
    default = (style, workers) == ("message_id", 2)
    return pytest.param(style, workers, id=f"{style}-{workers}", marks=() if default else pytest.mark.ci_long)


@pytest.mark.xdist_group("load")  # many processes: one such test at a time
@pytest.mark.slow
@pytest.mark.parametrize(("style", "workers"), [_kills_case(s, w) for s in STYLES for w in (2, 4)])
def test_bursts_duplicates_and_ten_worker_kills(tmp_path: Path, style: str, workers: int) -> None:
    _run(tmp_path, style, workers, kills=10)


@pytest.mark.xdist_group("load")  # many processes: one such test at a time
def test_the_documented_webhook_handler_with_two_workers_answers_a_short_burst(tmp_path: Path) -> None:
    """The seed's handler as written, 2 workers, a short burst (the fast suite's guard)."""
    _run(tmp_path, "seed", 2, kills=0)


def _queued(db: Path, session_id: str) -> int:
    import sqlite3

    conn = sqlite3.connect(db)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM chatflow_turn_queue WHERE session_id = ?",
                                (session_id,)).fetchone()[0])
    finally:
        conn.close()


def _status(db: Path, session_id: str) -> str | None:
    import sqlite3

    conn = sqlite3.connect(db)
    try:
        row = conn.execute("SELECT status FROM chatflow_sessions WHERE session_id = ?", (session_id,)).fetchone()
        return None if row is None else str(row[0])
    finally:
        conn.close()


def _until(check: Callable[[], object], timeout: float = 30.0) -> None:
    wait_until(check, timeout, interval=0.01)


@pytest.mark.xdist_group("load")  # many processes: one such test at a time
@pytest.mark.parametrize("style", ["seed", "message_id"])
def test_turns_waiting_for_a_busy_session_start_in_arrival_order(tmp_path: Path, style: str) -> None:
    """The seed's handler: a customer's second to fifth messages arrive, one after the other,
    while the first is being answered (each reaching whichever of 2 workers); each waits its
    turn instead of failing, and they are answered in the order they arrived."""
    import concurrent.futures
    import threading

    from tests.helpers.fakeserver import Reply

    from .harness import post_json_sync

    db = tmp_path / "bot.db"
    gate = threading.Event()
    with FakeServer() as model:
        model.add(Reply(events=FakeServer.make_text("first answer").events, gate=gate))
        with WebhookServer(db, model.url, style, workers=2) as server:

            def post(k: int) -> tuple[int, object]:
                return post_json_sync(server.url, {"phone": "+15550199", "text": f"message {k}", "id": f"m{k}"})

            with concurrent.futures.ThreadPoolExecutor(5) as pool:
                first = pool.submit(post, 0)
                _until(lambda: _status(db, "+15550199") == "running")
                later = []
                for k in range(1, 5):
                    later.append(pool.submit(post, k))
                    _until(lambda k=k: _queued(db, "+15550199") == k)  # arrived: waiting in the queue
                gate.set()
                answers = [f.result() for f in [first, *later]]
    assert [status for status, _ in answers] == [200] * 5
    assert [body["content"] for _, body in answers] == ["first answer"] + [f"ok: message {k}" for k in range(1, 5)]  # type: ignore[index]
    report = check_store(db, [])
    assert report.problems == []
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    store = SQLiteSessionStore(db)
    try:
        users = [e.payload["message"]["content"] for e in store.events("+15550199") if e.type == "message.user"]
    finally:
        store.close()
    assert users == [f"message {k}" for k in range(5)]
