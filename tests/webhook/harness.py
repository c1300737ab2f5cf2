"""Drive the webhook test app (tests/webhook/app.py) under uvicorn as a messaging platform would.

:class:`WebhookServer` runs ``uvicorn app:app --workers N`` on one SQLite file and can SIGKILL
a worker (uvicorn starts a new one). :func:`make_plan` builds the deliveries: customers
sending bursts of messages, some delivered twice (at once or later). :func:`deliver` posts
them over HTTP with bounded concurrency and delivers again every answer that is not 2xx (or
a connection that failed), as WhatsApp does, until each one is acknowledged.
:func:`check_store` then checks the store against the plan and the model's requests.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.helpers.net import free_port

REPO = Path(__file__).resolve().parents[2]
APP_DIR = Path(__file__).resolve().parent


def _children(pid: int) -> list[int]:
    """Live uvicorn worker processes (multiprocessing children) of ``pid``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode("ascii", "replace")
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[1]) == pid and fields[0] not in ("Z", "X") and b"spawn_main" in cmdline:
            out.append(int(entry))
    return out


class WebhookServer:
    """``uvicorn app:app --workers N`` serving the webhook app on 127.0.0.1."""

    def __init__(self, db: Path, model_url: str, style: str, workers: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/webhook"
        self.workers = workers
        env = dict(os.environ)
        env.update(
            PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
            CHATFLOW_WEBHOOK_DB=str(db),
            CHATFLOW_WEBHOOK_STYLE=style,
            OPENAI_BASE_URL=model_url,
            OPENAI_API_KEY="test-key",
        )
        self.log = db.with_suffix(".uvicorn.log")
        self._log_file = open(self.log, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "app:app", "--app-dir", str(APP_DIR), "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", str(workers), "--log-level", "warning", "--no-access-log"],
            env=env, stdout=self._log_file, stderr=subprocess.STDOUT,
        )
        self.kills: list[int] = []

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until every worker runs and the port accepts connections."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"uvicorn exited: {self.log.read_text(errors='replace')[-2000:]}")
            if len(_children(self.proc.pid)) >= self.workers:
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                        return
                except OSError:
                    pass
            time.sleep(0.05)
        raise TimeoutError(f"uvicorn did not start: {self.log.read_text(errors='replace')[-2000:]}")

    def kill_a_worker(self, rng: random.Random) -> int | None:
        """SIGKILL one live worker chosen at random; its pid, or None when none is up."""
        live = _children(self.proc.pid)
        if not live:
            return None
        pid = rng.choice(live)
        os.kill(pid, signal.SIGKILL)
        self.kills.append(pid)
        return pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in _children(self.proc.pid):
            os.kill(pid, signal.SIGKILL)
        self._log_file.close()

    def __enter__(self) -> WebhookServer:
        try:
            self.wait_ready()
        except BaseException:
            self.stop()  # uvicorn that did not come up is not left behind
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class Delivery:
    phone: str
    text: str
    msg_id: str
    at: float  # seconds after the start
    duplicate: bool = False
    statuses: list[int] = field(default_factory=list)  # 0: the connection failed
    latencies: list[float] = field(default_factory=list)  # of each 2xx answer, seconds
    acked_at: float | None = None


def make_plan(customers: int, per_customer: int, *, spread: float, gap: float = 0.05, dup_every: int = 4,
              seed: int = 19) -> list[Delivery]:
    """Each customer sends a burst of ``per_customer`` messages ``gap`` s apart, starting at a
    random moment within ``spread`` s; every ``dup_every``-th message is delivered twice,
    alternately at the same moment and 0.3 s later."""
    rng = random.Random(seed)
    plan: list[Delivery] = []
    dups = 0
    for c in range(customers):
        phone = f"+1555{c:07d}"
        start = rng.uniform(0, spread)
        for k in range(per_customer):
            delivery = Delivery(phone, f"customer {c} message {k}", f"wamid.{c}.{k}", start + k * gap)
            plan.append(delivery)
            if (c * per_customer + k) % dup_every == dup_every - 1:
                later = 0.0 if dups % 2 == 0 else 0.3
                plan.append(Delivery(phone, delivery.text, delivery.msg_id, delivery.at + later, duplicate=True))
                dups += 1
    plan.sort(key=lambda d: d.at)
    return plan


async def post_json(url: str, payload: Any, timeout: float = 120.0) -> tuple[int, Any]:
    """POST ``payload`` as JSON over one HTTP/1.1 connection; (status, decoded body).
    Raises OSError (or asyncio.TimeoutError, EOFError) when the connection fails."""
    parts = urlsplit(url)
    body = json.dumps(payload).encode()

    async def exchange() -> tuple[int, Any]:
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        try:
            writer.write(
                f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body
            )
            await writer.drain()
            raw = await reader.read()
        finally:
            writer.close()
        head, _, rest = raw.partition(b"\r\n\r\n")
        if not head:
            raise EOFError("no answer")
        status = int(head.split(b" ", 2)[1])
        try:
            return status, json.loads(rest) if rest else None
        except ValueError:
            return status, rest.decode(errors="replace")

    return await asyncio.wait_for(exchange(), timeout)


def post_json_sync(url: str, payload: Any, timeout: float = 120.0) -> tuple[int, Any]:
    """:func:`post_json` from a thread."""
    return asyncio.run(post_json(url, payload, timeout))


async def deliver(url: str, plan: list[Delivery], *, concurrency: int = 32, deadline: float = 180.0) -> float:
    """Post every delivery at its moment, at most ``concurrency`` at once, again after each
    failure (0.1-0.3 s later) until 2xx. Returns the seconds the whole run took."""
    limit = asyncio.Semaphore(concurrency)
    rng = random.Random(7)
    t0 = time.monotonic()

    async def one(d: Delivery) -> None:
        await asyncio.sleep(max(0.0, d.at - (time.monotonic() - t0)))
        while time.monotonic() - t0 < deadline:
            async with limit:
                sent = time.monotonic()
                try:
                    status, _ = await post_json(url, {"phone": d.phone, "text": d.text, "id": d.msg_id})
                except (OSError, EOFError, ValueError, IndexError, asyncio.TimeoutError):
                    status = 0
            d.statuses.append(status)
            if 200 <= status < 300:
                d.latencies.append(time.monotonic() - sent)
                d.acked_at = time.monotonic() - t0
                return
            await asyncio.sleep(rng.uniform(0.1, 0.3))

    await asyncio.gather(*(one(d) for d in plan))
    return time.monotonic() - t0


@dataclass
class StoreReport:
    completed: Counter[str]  # user text -> completed turns
    interrupted: Counter[str]  # user text -> turns interrupted (owner died)
    order: dict[str, list[str]]  # phone -> user texts in completion order
    problems: list[str]


def check_store(db: Path, plan: list[Delivery]) -> StoreReport:
    """Read the store back: completed and interrupted turns per message, completion order per
    customer, and every structural problem (window, duplicated message in a window, seq gaps,
    a session left running, a claim left in progress)."""
    from chatflow_cli.core.messages import Role, history_problems
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    completed: Counter[str] = Counter()
    interrupted: Counter[str] = Counter()
    order: dict[str, list[str]] = defaultdict(list)
    problems: list[str] = []
    from chatflow_cli.core.agents import Agent

    store = SQLiteSessionStore(db)
    store.set_agent_resolver(lambda name: Agent(name=name, instructions=""))  # the check needs no tools
    try:
        for phone in sorted({d.phone for d in plan}):
            try:
                events = store.events(phone)
            except Exception as exc:  # noqa: BLE001 - reported as a problem
                problems.append(f"{phone}: {exc}")
                continue
            seqs = [e.seq for e in events]
            if seqs != list(range(1, len(seqs) + 1)):
                problems.append(f"{phone}: seq not gap-free")
            text_of: dict[int, str] = {}
            for event in events:
                turn = event.payload.get("turn")
                if event.type == "message.user":
                    text_of[turn] = event.payload["message"]["content"]
                elif event.type == "turn.completed":
                    completed[text_of[turn]] += 1
                    order[phone].append(text_of[turn])
                elif event.type == "turn.interrupted" or (event.type == "turn.failed"
                                                          and event.payload.get("error_type") == "TurnOwnerDied"):
                    interrupted[text_of[turn]] += 1  # a recovered turn a retry replaces ends failed
            session = store.get(phone)
            assert session is not None
            window_problems = history_problems(session.history)
            if window_problems:
                problems.append(f"{phone}: invalid window {window_problems}")
            users = [m.content for m in session.history if m.role is Role.USER]
            if len(users) != len(set(users)):
                problems.append(f"{phone}: a message twice in the window {users}")
    finally:
        store.close()
    conn = sqlite3.connect(db)
    try:
        running = conn.execute("SELECT session_id FROM chatflow_sessions WHERE status != 'idle'").fetchall()
        if running:
            problems.append(f"sessions not idle: {running}")
        claims = conn.execute("SELECT message_id FROM chatflow_processed_messages WHERE state != 'completed'").fetchall()
        if claims:
            problems.append(f"claims left in progress: {claims}")
        # a waiter killed in the queue leaves its ticket: the store skips it (its holder is dead)
        # and the session's next turn removes it; a ticket of a live process would be a leak
        live = [row[0] for row in conn.execute("SELECT owner_json FROM chatflow_turn_queue")
                if _alive(json.loads(row[0]).get("pid"))]
        if live:
            problems.append(f"{len(live)} tickets of live processes left in the turn queue")
    finally:
        conn.close()
    return StoreReport(completed, interrupted, dict(order), problems)


def model_calls(requests: list[Any]) -> Counter[str]:
    """Model requests per last user message text (a body that is not a JSON object -- a request
    cut short when its worker was killed -- reached no model and is not counted)."""
    calls: Counter[str] = Counter()
    for body in requests:
        if not isinstance(body, dict):
            continue
        users = [m for m in body.get("messages", []) if m.get("role") == "user"]
        if users:
            calls[users[-1]["content"]] += 1
    return calls


def _alive(pid: object) -> bool:
    """True while process ``pid`` exists and is not a zombie."""
    if not isinstance(pid, int):
        return False
    try:
        stat = open(f"/proc/{pid}/stat", encoding="utf-8").read()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
