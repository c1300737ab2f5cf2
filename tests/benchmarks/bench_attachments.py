"""Benchmark of attachments. Run: ``python tests/benchmarks/bench_attachments.py [--repeat N] [--no-postgres]``.

1. Attaching a 5 MB image as ``chatflow chat -f`` does, each sample in a fresh process (as
   the command runs: a new process's memory is not yet mapped, so every large copy costs its
   page faults): read and check the file (type and size from the header, SHA-256), the user
   message's wire form, and the request body the http transport sends; beside, in the same
   run and alternately, Python's ``base64.b64encode`` of the file read in a fresh process, and
   the coreutils ``base64`` command writing to ``/dev/null`` (a whole process: its start-up
   included). Then the store's insert of the message with the image (SQLite) against the
   same message without it.
2. Loading the window (``get()``) of a session of 100 turns each carrying a distinct 200 kB
   image, beside the same session without images; and ``list_sessions()`` (what ``sessions
   ls`` reads) of 100 sessions whose first message carries an image, beside 100 without;
   on SQLite and on PostgreSQL (a server started as tests/helpers/pgserver.py does, skipped
   with the reason when none can start). The two sides alternate; min and median of
   ``--repeat`` runs each.

The load average is printed at the start and the end: on a busy machine the medians move,
the minimums less. Not collected by pytest (not named ``test_*``): speed targets are
measured, not asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any, Callable

try:
    from tests.benchmarks._args import positive_int
except ModuleNotFoundError:  # run as a script: its own directory is on sys.path
    from _args import positive_int  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from chatflow_cli.core.agents import Agent  # noqa: E402
from chatflow_cli.core.attachments import read_attachment  # noqa: E402
from chatflow_cli.core.memory import Owner  # noqa: E402
from chatflow_cli.core.messages import Message  # noqa: E402

AGENT = Agent(name="Bench", instructions="")


def png(width: int, height: int) -> bytes:
    """A PNG of random pixels (stored, not compressed: the size is about width * height * 3)."""
    rows = b"".join(b"\x00" + os.urandom(width * 3) for _ in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows, 0)) + chunk(b"IEND", b""))


def figures(samples: list[float]) -> str:
    return f"min {min(samples) * 1e3:6.2f} ms, median {statistics.median(samples) * 1e3:6.2f} ms"


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


# -- 1. attaching -----------------------------------------------------------------------------

def child_chatflow(path: str) -> None:
    """In a fresh process: read and check, wire form, request body; prints the seconds of each."""
    from chatflow_cli.core._provider.http import request_body

    start = time.perf_counter()
    attachment = read_attachment(path)
    read = time.perf_counter()
    wire = Message.user("what is in this?", [attachment]).to_wire(data_urls=True)
    wired = time.perf_counter()
    request_body({"model": "m", "messages": [wire], "stream": True})  # the pieces sent
    done = time.perf_counter()
    print(read - start, wired - read, done - wired)


def child_python(path: str) -> None:
    import base64

    start = time.perf_counter()
    base64.b64encode(Path(path).read_bytes())
    print(time.perf_counter() - start)


def child(kind: str, path: str) -> list[float]:
    out = subprocess.run([sys.executable, __file__, "--child", kind, path], check=True, capture_output=True,
                         text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO))).stdout
    return [float(x) for x in out.split()]


def attach(path: Path, repeat: int) -> None:
    size = path.stat().st_size
    ours: list[list[float]] = []
    python: list[float] = []
    command: list[float] = []
    for _ in range(repeat):
        ours.append(child("chatflow", str(path)))
        python.append(child("python", str(path))[0])
        if shutil.which("base64"):
            start = time.perf_counter()
            subprocess.run(["base64", str(path)], stdout=subprocess.DEVNULL, check=True)
            command.append(time.perf_counter() - start)
    print(f"\n1. attach a {size / 1e6:.1f} MB PNG, {repeat} fresh processes each, alternately")
    print(f"   chatflow (read + check + SHA-256, wire form, request body): {figures([sum(s) for s in ours])}")
    for n, label in enumerate(("read_attachment (read, header, SHA-256)", "to_wire (the base64 data URL)",
                               "request_body (the JSON body sent)")):
        print(f"     {label}: {figures([s[n] for s in ours])}")
    print(f"   python base64.b64encode(Path.read_bytes()): {figures(python)}")
    if command:
        print(f"   base64 FILE > /dev/null (the whole process): {figures(command)}")


def insert(directory: Path, path: Path, repeat: int) -> None:
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    attachment = read_attachment(str(path))
    samples: dict[str, list[float]] = {"with the image": [], "without": []}
    for n in range(repeat):
        for label, attached in (("with the image", (attachment,)), ("without", ())):
            db = directory / f"insert-{n}-{len(attached)}.db"
            store = SQLiteSessionStore(str(db))
            store.set_agent_resolver(lambda name: AGENT)
            start = time.perf_counter()
            begun = store.begin_turn("s", default_agent=AGENT, owner=Owner.current(),
                                     user_message=Message.user("what is in this?", attached))
            samples[label].append(time.perf_counter() - start)
            store.release(begun.session)
            store.close()
            db.unlink()
    print("   the store's begin_turn (SQLite, a new session) with the message: "
          + "; ".join(f"{label} {figures(s)}" for label, s in samples.items()))


# -- 2. reading ------------------------------------------------------------------------------

def fill(store: Any, directory: Path, images: bool) -> None:
    """Session "s": 100 turns, each user message with a distinct 200 kB image (or none);
    sessions "l000".."l099": one such turn each."""
    owner = Owner.current()
    picture = directory / "img.png"

    def turn(session_id: str, n: int) -> None:
        attached = ()
        if images:
            picture.write_bytes(png(260, 256))  # about 200 kB, distinct
            attached = (read_attachment(str(picture)),)
        start = store.begin_turn(session_id, default_agent=AGENT, owner=owner,
                                 user_message=Message.user(f"what is in picture {n}?", attached), max_turns=100)
        start.session.add_message(Message.model(f"Picture {n} shows a cat."))
        start.session.complete_turn(f"Picture {n} shows a cat.")
        store.save(start.session)
        store.release(start.session)

    for n in range(100):
        turn("s", n)
    for n in range(100):
        turn(f"l{n:03}", n)


def reads(stores: dict[str, Any], repeat: int, title: str) -> None:
    measured: dict[str, dict[str, list[float]]] = {name: {"window": [], "list": []} for name in stores}
    for name, store in stores.items():  # warm: the page cache, the connection
        store.get("s")
        store.list_sessions()
    for _ in range(repeat):  # alternately, so both see the same machine
        for name, store in stores.items():
            start = time.perf_counter()
            store.get("s")
            measured[name]["window"].append(time.perf_counter() - start)
            start = time.perf_counter()
            store.list_sessions()
            measured[name]["list"].append(time.perf_counter() - start)
    print(f"\n2. {title}, {repeat} runs each, alternately")
    for name in stores:
        print(f"   {name}: window load {figures(measured[name]['window'])}; "
              f"list_sessions (101 sessions) {figures(measured[name]['list'])}")
    plain, heavy = measured["without images"], measured["with images"]
    for key, label in (("window", "window load"), ("list", "list_sessions")):
        print(f"   ratio with/without images, {label}: min {min(heavy[key]) / min(plain[key]):.2f}x, median "
              f"{statistics.median(heavy[key]) / statistics.median(plain[key]):.2f}x (target: at most 1.2x)")


def sqlite_reads(directory: Path, repeat: int) -> None:
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    stores = {}
    for name, images in (("without images", False), ("with images", True)):
        store = SQLiteSessionStore(str(directory / f"{name}.db"))
        store.set_agent_resolver(lambda n: AGENT if n == AGENT.name else None)
        fill(store, directory, images)
        stores[name] = store
    size = (directory / "with images.db").stat().st_size
    reads(stores, repeat, f"SQLite (the file with images: {size / 1e6:.1f} MB)")
    for store in stores.values():
        store.close()


def postgres_reads(directory: Path, repeat: int) -> None:
    try:
        from tests.helpers.pgserver import PgServer, PgUnavailable

        server = PgServer().start()
    except (ImportError, PgUnavailable) as exc:
        print(f"\n2. PostgreSQL: skipped, no server: {exc}")
        return
    try:
        from chatflow_cli.core.memory.postgres import PostgresSessionStore

        stores: dict[str, Any] = {}
        for name, images in (("without images", False), ("with images", True)):
            store = PostgresSessionStore(server.dsn(server.create_database()))
            store.set_agent_resolver(lambda n: AGENT if n == AGENT.name else None)
            fill(store, directory, images)
            stores[name] = store
        reads(stores, repeat, "PostgreSQL (a local server, TCP)")
        for store in stores.values():
            store.close()
    finally:
        server.destroy()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=positive_int, default=30, help="samples of each figure")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        run: Callable[[str], None] = {"chatflow": child_chatflow, "python": child_python}[args.child[0]]
        run(args.child[1])
        return 0
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores; at the start: {load()}")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        image = directory / "five.png"
        image.write_bytes(png(1290, 1290))  # about 5 MB
        attach(image, args.repeat)
        insert(directory, image, max(3, args.repeat // 3))
        sqlite_reads(directory, args.repeat)
        if not args.no_postgres:
            postgres_reads(directory, args.repeat)
    print(f"\nat the end: {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
