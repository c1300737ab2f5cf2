"""Command-line start-up and rendering benchmarks (issues 2 and 5). Not collected by pytest.

Run::

    python tests/benchmarks/bench_cli.py [--runs 7]

What it measures, each as the median of ``--runs`` whole-process runs (stdout a pipe):

* ``chatflow --help`` against ``reference_typer_ls.py --help`` (target: at most 1.25x);
* ``chatflow sessions ls`` with 1,000 stored sessions against ``reference_typer_ls.py ls``,
  which opens the same SQLite file, selects 50 rows and prints a ``rich.table.Table``
  (target: at most 1.25x);
* ``chatflow chat "Say hi"`` (a new session each run) against ``--base-url`` of an already
  running fake OpenAI-compatible server (tests/helpers/fakeserver.py in another process), beside a
  10-line script making the same streaming request with the ``openai`` client (target: at
  most 0.8x; tests/benchmarks/report.py runs the two in pairs with the exact same body);
* ``chatflow sessions show`` of a 500-turn session whose turns each hold a tool call and
  its result: time until the first turn is on stdout (target 0.3 s) and until the whole
  output is (target 1 s) -- into a pipe (plain text), and into a pseudo-terminal
  (``--no-pager``: Markdown rendered, colours on), with the process's CPU seconds (steadier
  than wall time on a busy machine).

Child processes get compiled ``.pyc`` files (in a temporary ``PYTHONPYCACHEPREFIX``), as
an installed chatflow has them, even where ``PYTHONDONTWRITEBYTECODE`` is set.

The data lives in a temporary ``CHATFLOW_HOME`` made with the real ``SQLiteSessionStore``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    from tests.benchmarks._args import positive_int
except ModuleNotFoundError:  # run as a script: its own directory is on sys.path
    from _args import positive_int  # type: ignore[no-redef]

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CHATFLOW = [str(Path(sys.executable).with_name("chatflow"))]
if not Path(CHATFLOW[0]).exists():
    CHATFLOW = [sys.executable, "-m", "chatflow_cli"]
REFERENCE = [sys.executable, str(HERE / "reference_typer_ls.py")]

PLAIN_CLIENT = """
import os, sys
from openai import OpenAI
client = OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key="unused")
stream = client.chat.completions.create(model="fake-model", stream=True,
                                        messages=[{"role": "user", "content": "Say hi"}])
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        sys.stdout.write(chunk.choices[0].delta.content)
sys.stdout.write("\\n")
"""


def populate(home: Path, sessions: int = 1000, long_turns: int = 500) -> str:
    """1,000 one-turn sessions and one ``long_turns``-turn session with a tool call per turn."""
    sys.path.insert(0, str(REPO))
    from chatflow_cli.core.agents import Agent
    from chatflow_cli.core.messages import Message, ToolCall
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    store = SQLiteSessionStore(str(home / "chatflow.db"))
    agent = Agent("Assistant", "")
    for i in range(sessions):
        s = store.get_or_create(f"session-{i:04d}", agent)
        s.add_message(Message.user(f"Question number {i}: what is {i} + {i}?"))
        s.add_message(Message.model(f"It is **{2 * i}**.", agent="Assistant"))
        s.complete_turn(f"It is **{2 * i}**.", agent)
        store.save(s)
    long_id = "long-session"
    s = store.get_or_create(long_id, agent, max_turns=40)
    for t in range(1, long_turns + 1):
        call = ToolCall(f"call_{t}", "check_order_status", f'{{"order_id": "{t}", "verbose": true}}')
        s.add_message(Message.user(f"Where is order {t}? Please check the *tracking* too."))
        s.add_message(Message.model(None, [call], agent="Assistant"))
        result = "\n".join(f"step {k}: parcel {t} passed hub {k}" for k in range(12))
        s.add_message(Message.tool(call.id, result, name=call.name))
        answer = f"Order **{t}** is in transit:\n\n- hub {t % 7}\n- arrives `tomorrow`\n\nAnything else?"
        s.add_message(Message.model(answer, agent="Assistant"))
        s.complete_turn(answer, agent)
        if t % 50 == 0:
            store.save(s)
    store.save(s)
    store.close()
    return long_id


def timed(cmd: list[str], env: dict[str, str], runs: int) -> tuple[float, float]:
    """Median wall-clock seconds and median CPU seconds (user + system) of whole-process runs.

    The CPU figure is steadier than wall time on a machine shared with other work.
    """
    import resource

    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        walls.append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
        if proc.returncode != 0:
            raise SystemExit(f"{cmd} failed: {proc.stderr.decode()[-500:]}")
    return statistics.median(walls), statistics.median(cpus)


def first_and_total(cmd: list[str], env: dict[str, str], marker: bytes, *, tty: bool) -> tuple[float, float, int]:
    """Seconds until ``marker`` appears on stdout, until the process ends, and bytes read."""
    if tty:
        import pty

        master, slave = pty.openpty()
        import fcntl
        import struct
        import termios

        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 100, 0, 0))
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=slave, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        os.close(slave)
        reader = master
    else:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                stdin=subprocess.DEVNULL)
        reader = proc.stdout.fileno()  # type: ignore[union-attr]
    chunks: list[bytes] = []
    size = 0
    tail = b""  # the end of what was read so far, to find a marker split across reads
    first = None
    while True:
        try:
            chunk = os.read(reader, 65536)
        except OSError:  # pty closed
            chunk = b""
        if not chunk:
            break
        chunks.append(chunk)  # never `seen += chunk`: quadratic, it slowed the reader itself
        size += len(chunk)
        if first is None:
            tail = (tail + chunk)[-(len(marker) + 65536):]
            if marker in tail:
                first = time.perf_counter() - started
    proc.wait()
    total = time.perf_counter() - started
    if tty:
        os.close(master)
    if proc.returncode != 0 or first is None:
        raise SystemExit(f"{cmd} failed (rc {proc.returncode}); output: {b''.join(chunks)[-300:]!r}")
    return first, total, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=positive_int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="chatflow-bench-") as tmp:
        home = Path(tmp) / "home"
        started = time.perf_counter()
        long_id = populate(home)
        print(f"populated 1,000 sessions + a 500-turn session in {time.perf_counter() - started:.1f} s")
        (Path(tmp) / "empty.toml").write_text("", encoding="utf-8")  # a named config file must exist
        env = dict(os.environ, CHATFLOW_HOME=str(home), CHATFLOW_CONFIG=str(Path(tmp) / "empty.toml"))
        for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "CHATFLOW_MODEL", "NO_COLOR", "COLUMNS",
                     "CHATFLOW_TRANSPORT"):
            env.pop(name, None)
        env["PYTHONPATH"] = str(REPO)
        # Compiled .pyc files, as an installed chatflow has them: with PYTHONDONTWRITEBYTECODE
        # set (as on some dev machines) every run would compile chatflow's modules again.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        # warm the page cache and the .pyc files
        timed([*CHATFLOW, "sessions", "ls"], env, 2)
        timed([*REFERENCE, "ls"], env, 2)

        rows = []
        for label, ours, ref in (
            ("--help", [*CHATFLOW, "--help"], [*REFERENCE, "--help"]),
            ("sessions ls (1,000 sessions)", [*CHATFLOW, "sessions", "ls"], [*REFERENCE, "ls"]),
        ):
            a = timed(ours, env, args.runs)
            b = timed(ref, env, args.runs)
            rows.append((label, a, b))
        print(f"\nmachine: {platform.machine()} {os.cpu_count()} cores, {platform.platform()}, "
              f"Python {platform.python_version()}; medians of {args.runs} runs; "
              f"load average {os.getloadavg()[0]:.2f}")
        print(f"{'benchmark (wall | cpu)':<30}{'chatflow':>18}{'reference':>18}{'ratio':>14}  target")
        for label, (a, ac), (b, bc) in rows:
            print(f"{label:<30}{a:>8.3f}s |{ac:>6.3f}s{b:>9.3f}s |{bc:>6.3f}s{a / b:>6.2f}x |{ac / bc:>5.2f}x  <= 1.25x")

        server = subprocess.Popen([sys.executable, "-m", "tests.helpers.fakeserver", "--port", "0"], cwd=REPO,
                                  stdout=subprocess.PIPE, text=True, env=env)
        try:
            url = server.stdout.readline().strip()  # type: ignore[union-attr]
            chat_env = dict(env, OPENAI_BASE_URL=url)
            timed([*CHATFLOW, "chat", "--base-url", url, "-m", "fake-model", "Say hi"], chat_env, 2)
            ours = timed([*CHATFLOW, "chat", "--base-url", url, "-m", "fake-model", "Say hi"], chat_env, args.runs)
            plain = timed([sys.executable, "-c", PLAIN_CLIENT], chat_env, args.runs)
        finally:
            server.terminate()
            server.wait()
        label = "chat 'Say hi' (fake server)"
        print(f"{label:<30}{ours[0]:>8.3f}s |{ours[1]:>6.3f}s{plain[0]:>9.3f}s |{plain[1]:>6.3f}s"
              f"{ours[0] / plain[0]:>6.2f}x |{ours[1] / plain[1]:>5.2f}x  <= 0.8x (vs the openai client alone)")

        print(f"\nsessions show {long_id} (500 turns, a tool call each): first turn / whole output / cpu")
        import resource

        for mode, tty, extra in (("pipe", False, []), ("terminal (--no-pager)", True, ["--no-pager"])):
            command = [*CHATFLOW, "sessions", "show", long_id, *extra]
            first_and_total(command, env, b"Turn 1", tty=tty)  # warm-up: compiles the rendering modules
            samples = []
            for _ in range(args.runs):
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                first, total, size = first_and_total(command, env, b"Turn 1", tty=tty)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                samples.append((first, total, size, cpu))
            first = statistics.median(s[0] for s in samples)
            total = statistics.median(s[1] for s in samples)
            cpu = statistics.median(s[3] for s in samples)
            size = samples[0][2]
            print(f"  {mode:<24} first {first:.3f}s (target 0.3)  whole {total:.3f}s (target 1.0)  "
                  f"cpu {cpu:.3f}s  {size:,} bytes")


if __name__ == "__main__":
    main()
