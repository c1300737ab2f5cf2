"""The benchmark report (issue 7): every speed figure of chatflow beside the tool a user would pick instead.

Run from the repository root (not collected by pytest)::

    python -m tests.benchmarks.report            # the real run: several minutes
    python -m tests.benchmarks.report --quick    # few repetitions: checks that it all works
    python tests/benchmarks/report.py --only turn,cli --runs 9 --json report.json

It prints one Markdown table -- figure, chatflow, the alternative measured in the same run,
ratio, target, verdict -- under a line naming the machine (CPU model from /proc/cpuinfo,
cores, Python, load average before and after: the figures are medians of repeated runs, but
a busy machine still moves them). The sections:

``turn`` (issues 2 and 18)
    ``chatflow chat -m M "Say hi"`` (a new session each run, output into a pipe) against an
    already running server, as a whole process, beside a 10-line script that makes the same
    streaming request with the ``openai`` client alone. "The same request" is literal:
    chatflow's request body is captured first (by a fake server) and the script replays it,
    so model, messages, ``max_tokens`` and ``temperature`` (chatflow sends neither unless
    configured) are the same. The two sides run in pairs, A B A B, after one warm-up pair;
    the row gives the medians, the number of pairs and the range of the pairs' ratios. Two
    servers: the fake server in its own process, answering at once (target: at most 0.8x),
    and -- when the ``local`` extra is installed -- a warm llama.cpp server with SmolLM2
    (:class:`chatflow_cli.core.local.LocalServer`), where the model's own time adds to both
    sides (target: at most 1.05x).
``local`` (issue 10)
    ``chatflow chat "Say hi"`` on the local model while its warm server runs, beside the same
    call with ``--base-url`` of an already running llama.cpp server with the same model
    (target: at most 1.15x); and the first call, cold (a fresh data directory: it starts the
    warm server) beside the same with ``local_keep_alive`` 0 (a private server started and
    stopped by the process, the behaviour before the warm server; target: no slower, 1.05x).
``cli`` (issues 2 and 5)
    ``chatflow --help`` and ``chatflow sessions ls`` (1,000 stored sessions) beside the
    reference typer script (tests/benchmarks/reference_typer_ls.py; target 1.25x) and beside
    ``llm --help`` / ``llm logs list -n 20`` (llm's log filled with real logged prompts to a
    fake OpenAI-compatible model); ``sessions show`` of a 500-turn session: first turn and
    whole output (targets 0.3 s and 1 s). Uses tests/benchmarks/bench_cli.py's functions.
``store`` (issue 3)
    tests/benchmarks/bench_store.py: the context window of a 10,000-turn session beside a
    100-turn one (same time: ratio about 1), and appending one 4-message turn beside the
    OpenAI Agents SDK's ``SQLiteSession.add_items`` (target at most 1x).
``sdk``
    tests/benchmarks/bench_sdk_session.py: ``ChatflowSession`` (the Agents SDK ``Session`` on
    chatflow's SQLite store) beside the SDK's own ``SQLiteSession``: ``add_items`` of a
    4-item turn and ``get_items()`` of a 160-item window (targets at most 1x), and the cold
    ``get_items()`` (its window cache dropped, as after another process wrote).
``runner`` (issue 4)
    tests/benchmarks/bench_runner.py: time per turn (one tool call, two requests) of the
    Runner beside the Agents SDK's Runner with ``SQLiteSession`` (target at most 0.5x).
``memory`` (issue 26)
    tests/benchmarks/bench_memory.py: a turn with one memory tool call (view, str_replace,
    create) beside the same turn with a plain Python tool (target: at most 2 ms more), and
    the first page of a search of 10,000 memory documents beside 10,000 session turns
    (target: at most 1x).
``mcp`` (issue 27)
    tests/benchmarks/bench_mcp.py: a call to a running stdio MCP server beside the same tool as
    a Python function (target: at most +5 ms); the REPL's start to its prompt with three
    servers declared beside none (target: no longer), and a one-shot ``chat`` that calls no tool
    with three servers declared (their tools kept from an earlier run) beside none (target:
    close to none).
``render`` (issue 6)
    tests/benchmarks/bench_stream_render.py: a 1,500-line answer streamed into an 80x24
    terminal, beside only reading the same stream (target at most 1.25x);
    tests/benchmarks/bench_repl_paragraph.py: one 190 KB paragraph arriving at once, in the
    REPL in a 100x40 pseudo-terminal beside ``chat`` piped (extra time over a one-word
    answer; target at most 1.5x).
``fakeserver`` (test infrastructure)
    tests/benchmarks/bench_fakeserver.py: what one fake-server request costs, and a 40-turn
    window sent through chatflow's ModelClient beside ``openai``'s typed
    ``chat.completions.create``.

A benchmark that fails prints its error in its row; the others still run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

try:
    from tests.benchmarks._args import positive_int
except ModuleNotFoundError:  # run as a script: its own directory is on sys.path
    from _args import positive_int  # type: ignore[no-redef]

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

PY = sys.executable
CHATFLOW = [str(Path(PY).with_name("chatflow"))] if Path(PY).with_name("chatflow").exists() else [PY, "-m",
                                                                                                 "chatflow_cli"]
LLM = str(Path(PY).with_name("llm")) if Path(PY).with_name("llm").exists() else shutil.which("llm")
SECTIONS = ("turn", "local", "cli", "store", "postgres", "runner", "memory", "mcp", "render", "fakeserver")

#: The 10-line script of issue 2: the same streaming request with the openai client alone.
OPENAI_ALONE = '''\
import json, sys
from openai import OpenAI

url, body_file = sys.argv[1], sys.argv[2]
body = json.load(open(body_file))  # chatflow's own request body: same model, messages, options
client = OpenAI(base_url=url, api_key=body.pop("__key__"))
for chunk in client.chat.completions.create(**body):
    if chunk.choices and chunk.choices[0].delta.content:
        sys.stdout.write(chunk.choices[0].delta.content)
print()
'''


@dataclass
class Row:
    """One line of the report. Times are seconds (``None``: not measured)."""

    section: str
    figure: str
    chatflow: float | None
    alternative_name: str = "-"
    alternative: float | None = None
    target: str = "-"
    max_ratio: float | None = None  #: the ratio the target allows, when it is a ratio
    max_seconds: float | None = None  #: the time the target allows, when it is a time
    note: str = ""
    error: str = ""

    @property
    def ratio(self) -> float | None:
        if self.chatflow is None or not self.alternative:
            return None
        return self.chatflow / self.alternative

    @property
    def verdict(self) -> str:
        if self.error:
            return "error"
        if self.max_ratio is not None and self.ratio is not None:
            return "ok" if self.ratio <= self.max_ratio else "MISSED"
        if self.max_seconds is not None and self.chatflow is not None:
            return "ok" if self.chatflow <= self.max_seconds else "MISSED"
        return "-"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio, "verdict": self.verdict}


@dataclass
class Options:
    quick: bool
    runs: int
    work: Path
    verbose: bool
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "load_average": round(os.getloadavg()[0], 2)}


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1000:.1f} ms" if seconds >= 0.001 else f"{seconds * 1000:.3f} ms"


def clean_env(home: Path | None = None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "CHATFLOW_MODEL", "CHATFLOW_DB", "NO_COLOR", "COLUMNS",
                 "CHATFLOW_DEBUG", "CHATFLOW_TRANSPORT"):
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    # Compiled .pyc files, as an installed chatflow (and openai in site-packages) has them: with
    # PYTHONDONTWRITEBYTECODE set, as on some dev machines, every run would compile chatflow again.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.setdefault("PYTHONPYCACHEPREFIX", str(Path(tempfile.gettempdir()) / "chatflow-report-pycache"))
    if home is not None:
        env["CHATFLOW_HOME"] = str(home)
        empty = home.parent / "empty-config.toml"  # a named config file must exist
        empty.write_text("", encoding="utf-8")
        env["CHATFLOW_CONFIG"] = str(empty)
    env.update(extra)
    return env


def wall(cmd: list[str], env: dict[str, str], *, check: bool = True) -> float:
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    took = time.perf_counter() - started
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])}... failed ({proc.returncode}): {proc.stderr.decode()[-300:]}")
    return took


def alternate(cmds: dict[str, list[str] | Callable[[int], list[str]]], env: dict[str, str], runs: int,
              warmup: int = 1) -> dict[str, float]:
    """Median wall time of each command, the commands run in turn (so they share machine noise)."""
    samples: dict[str, list[float]] = {name: [] for name in cmds}
    for i in range(warmup + runs):
        names = list(cmds)
        names = names[i % len(names):] + names[: i % len(names)]
        for name in names:
            cmd = cmds[name]
            took = wall(cmd(i) if callable(cmd) else cmd, env)
            if i >= warmup:
                samples[name].append(took)
    return {name: statistics.median(values) for name, values in samples.items()}


def run_script(args: list[str], timeout: float, env: dict[str, str] | None = None,
               ok: tuple[int, ...] = (0,)) -> str:
    proc = subprocess.run([PY, *args], cwd=REPO, env=env or clean_env(), capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode not in ok:
        raise RuntimeError(f"{Path(args[0]).name} exited {proc.returncode}: {(proc.stderr or proc.stdout)[-300:]}")
    return proc.stdout


def grab(pattern: str, text: str, what: str) -> float:
    m = re.search(pattern, text, re.M)
    if not m:
        raise RuntimeError(f"could not find {what} in the benchmark's output")
    return float(m.group(1).replace(",", ""))


@contextmanager
def fake_server_process(script: list[dict[str, Any]] | None = None) -> Iterator[str]:
    """``python -m tests.helpers.fakeserver`` in its own process; yields its base URL."""
    args = [PY, "-m", "tests.helpers.fakeserver", "--port", "0"]
    path = None
    if script:
        fd, path = tempfile.mkstemp(suffix=".json")
        with os.fdopen(fd, "w") as fh:
            json.dump(script, fh)
        args += ["--script", path]
    proc = subprocess.Popen(args, cwd=REPO, env=clean_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if path:
            os.unlink(path)


# ---------------------------------------------------------------------------------------
# turn: chatflow chat vs the openai client alone
# ---------------------------------------------------------------------------------------
@contextmanager
def local_model_server() -> Iterator[tuple[str, str, str] | None]:
    """(base URL, model name, description) of a warm llama.cpp server, or ``None`` when the
    ``local`` extra is not installed."""
    try:
        from chatflow_cli.core.local import LocalServer, local_available

        available = local_available()
    except ImportError:
        available = False
    if not available:
        yield None
        return
    # an alias other than "local": ``-m local`` would make chatflow start its own server
    with LocalServer(alias="smollm2-135m-instruct") as server:
        yield server.base_url, server.model, "warm local llama.cpp server, SmolLM2-135M"


def pairs(a: list[str] | Callable[[int], list[str]], b: list[str], env: dict[str, str], runs: int,
          warmup: int = 1) -> tuple[float, float, list[float]]:
    """Run ``a`` then ``b``, ``warmup + runs`` times (A B A B ...): the median wall time of
    each side over the last ``runs`` pairs, and each pair's ratio a/b."""
    times_a: list[float] = []
    times_b: list[float] = []
    for i in range(warmup + runs):
        took_a = wall(a(i) if callable(a) else a, env)
        took_b = wall(b, env)
        if i >= warmup:
            times_a.append(took_a)
            times_b.append(took_b)
    return statistics.median(times_a), statistics.median(times_b), [x / y for x, y in zip(times_a, times_b)]


def turn_row(opts: Options, where: str, url: str, model: str, target: str, max_ratio: float) -> Row:
    """``chatflow chat -m MODEL "Say hi"`` (a new session each run) against the server at
    ``url``, paired with the openai-alone script replaying chatflow's own request body."""
    from tests.helpers.fakeserver import FakeServer

    work = opts.work / f"turn-{len(list(opts.work.glob('turn-*')))}"
    home = work / "home"
    work.mkdir(parents=True)
    script = work / "openai_alone.py"
    script.write_text(OPENAI_ALONE)
    message = "Say hi"
    # 1. chatflow's exact request, captured
    with FakeServer() as capture:
        wall([*CHATFLOW, "chat", "--base-url", capture.url, "-m", model, "-s", "capture", message], clean_env(home))
        body = dict(capture.requests[0])
    body["__key__"] = "chatflow-no-key"
    body_file = work / "body.json"
    body_file.write_text(json.dumps(body))
    # 2. both sides against the same running server, A B A B
    ours, theirs, ratios = pairs(
        lambda i: [*CHATFLOW, "chat", "--base-url", url, "-m", model, message],
        [PY, str(script), url, str(body_file)], clean_env(home), opts.runs)
    sent = {k: v for k, v in body.items() if k in ("max_tokens", "temperature")}
    note = (f"{where}; {len(ratios)} pairs A B A B after 1 warm-up pair, pair ratios "
            f"{min(ratios):.2f}-{max(ratios):.2f}; request options: {sent or 'none beyond model/messages/stream'}")
    return Row("turn", f'chat -m {model} "{message}", new session, whole process', ours,
               "10-line openai script, same request", theirs, target, max_ratio=max_ratio, note=note)


def bench_turn(opts: Options) -> list[Row]:
    rows = []
    with fake_server_process() as url:
        rows.append(turn_row(opts, "fake server in its own process, answering at once", url, "fake-model",
                             "<= 0.8x", 0.8))
    with local_model_server() as local:
        if local is None:
            opts.notes.append("turn: llama_cpp is not installed, so the warm local model row was not measured")
        else:
            url, model, where = local
            rows.append(turn_row(opts, where, url, model, "<= 1.05x", 1.05))
    return rows


# ---------------------------------------------------------------------------------------
# cli: start-up and listing
# ---------------------------------------------------------------------------------------
def fill_llm_logs(user_dir: Path, entries: int) -> None:
    """``entries`` real llm log records: prompts to a fake OpenAI-compatible model, logged by llm."""
    code = f'''
import os, sys
sys.path.insert(0, {str(REPO)!r})
from pathlib import Path
from tests.helpers.fakeserver import FakeServer
user = Path(os.environ["LLM_USER_PATH"])
with FakeServer() as server:
    (user / "extra-openai-models.yaml").write_text(
        f"- model_id: fake\\n  model_name: fake-model\\n  api_base: {{server.url}}\\n")
    import llm, sqlite_utils
    from llm.migrations import migrate
    db = sqlite_utils.Database(user / "logs.db")
    migrate(db)
    model = llm.get_model("fake")
    for i in range({entries}):
        response = model.prompt(f"Question number {{i}}: what is {{i}} + {{i}}?", key="x")
        response.text()
        response.log_to_db(db)
'''
    user_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run([PY, "-c", code], env=clean_env(LLM_USER_PATH=str(user_dir)), check=True, timeout=1800,
                   capture_output=True)


def bench_cli_section(opts: Options) -> list[Row]:
    from tests.benchmarks import bench_cli

    work = opts.work / "cli"
    home = work / "home"
    long_id = bench_cli.populate(home, sessions=1000, long_turns=500)
    env = clean_env(home)
    reference = [PY, str(HERE / "reference_typer_ls.py")]
    cmds: dict[str, list[str]] = {
        "chatflow --help": [*CHATFLOW, "--help"],
        "reference --help": [*reference, "--help"],
        "chatflow ls": [*CHATFLOW, "sessions", "ls"],
        "reference ls": [*reference, "ls"],
    }
    rows: list[Row] = []
    llm_error = ""
    if LLM:
        try:
            llm_home = work / "llm"
            fill_llm_logs(llm_home, 40 if opts.quick else 200)
            env["LLM_USER_PATH"] = str(llm_home)
            cmds["llm --help"] = [LLM, "--help"]
            cmds["llm logs"] = [LLM, "logs", "list", "-n", "20"]
        except Exception as exc:  # noqa: BLE001 - the row says what went wrong
            llm_error = f"llm: {exc}"[:200]
    else:
        llm_error = "llm is not installed (pip install llm)"
    times = alternate(cmds, env, opts.runs)
    rows.append(Row("cli", "chatflow --help", times["chatflow --help"], "reference typer script --help",
                    times["reference --help"], "<= 1.25x", max_ratio=1.25))
    rows.append(Row("cli", "chatflow sessions ls (1,000 sessions)", times["chatflow ls"],
                    "reference typer script ls (50 rows, rich Table)", times["reference ls"], "<= 1.25x",
                    max_ratio=1.25))
    if "llm logs" in times:
        rows.append(Row("cli", "chatflow --help", times["chatflow --help"], "llm --help", times["llm --help"]))
        rows.append(Row("cli", "chatflow sessions ls (1,000 sessions)", times["chatflow ls"],
                        "llm logs list -n 20", times["llm logs"], "about 1/3 (issue 5)", max_ratio=0.40))
    else:
        rows.append(Row("cli", "chatflow sessions ls vs llm logs list -n 20", times["chatflow ls"], error=llm_error))
    for mode, tty, extra in (("pipe", False, []), ("terminal", True, ["--no-pager"])):
        samples = [bench_cli.first_and_total([*CHATFLOW, "sessions", "show", long_id, *extra], env, b"Turn 1", tty=tty)
                   for _ in range(opts.runs)]
        first = statistics.median(s[0] for s in samples)
        whole = statistics.median(s[1] for s in samples)
        rows.append(Row("cli", f"sessions show, 500 turns with tools, into a {mode}: first turn", first,
                        target="<= 0.3 s", max_seconds=0.3))
        rows.append(Row("cli", f"sessions show, 500 turns with tools, into a {mode}: whole output", whole,
                        target="<= 1 s", max_seconds=1.0))
    return rows


# ---------------------------------------------------------------------------------------
# store, runner, render, fake server: the other helpers' benchmarks, run and parsed
# ---------------------------------------------------------------------------------------
def bench_store_section(opts: Options) -> list[Row]:
    out = run_script([str(HERE / "bench_store.py"), "--repeat", str(30 if opts.quick else 300),
                      "--dir", str(opts.work)], timeout=3600)
    big = grab(r"10,000-turn session.*?median\s+([\d.]+) ms", out, "the 10,000-turn window time") / 1000
    small = grab(r"100-turn session.*?median\s+([\d.]+) ms", out, "the 100-turn window time") / 1000
    normal = grab(r"synchronous=NORMAL \(default\)\s+median\s+([\d.]+) ms", out, "the append time") / 1000
    full = grab(r"synchronous=FULL\s+median\s+([\d.]+) ms", out, "the FULL append time") / 1000
    rows = [Row("store", "load context window, 10,000-turn session (max_turns 40)", big,
                "same, 100-turn session (chatflow)", small, "about 1x (indexed)", max_ratio=1.5)]
    m = re.search(r"SQLiteSession\.add_items.*?median\s+([\d.]+) ms", out)
    if m:
        sdk = float(m.group(1)) / 1000
        rows.append(Row("store", "append one 4-message turn (WAL, synchronous=NORMAL)", normal,
                        "Agents SDK SQLiteSession.add_items", sdk, "<= 1x", max_ratio=1.0))
        rows.append(Row("store", "append one 4-message turn (WAL, synchronous=FULL)", full,
                        "Agents SDK SQLiteSession.add_items", sdk, note="like-for-like fsync per commit"))
    else:
        rows.append(Row("store", "append one 4-message turn", normal, error="openai-agents not installed"))
    out = run_script([str(HERE / "bench_token_window.py"), "--repeat", str(30 if opts.quick else 300)], timeout=3600)
    big = grab(r"10,000-turn session:\s+median\s+([\d.]+) ms", out, "the 10,000-turn token window time") / 1000
    small = grab(r"100-turn session:\s+median\s+([\d.]+) ms", out, "the 100-turn token window time") / 1000
    rows.append(Row("store", "token-budget window (1,500 tokens, a summary), 10,000-turn session", big,
                    "same, 100-turn session (chatflow)", small, "<= 1.2x", max_ratio=1.2))
    return rows


def bench_postgres_section(opts: Options) -> list[Row]:
    """bench_postgres.py: its own PostgreSQL server; append vs SQLAlchemySession, window, fleet."""
    turns = 10 if opts.quick else 40
    out = run_script([str(HERE / "bench_postgres.py"), "--repeat", str(30 if opts.quick else 300),
                      "--turns", str(turns)], timeout=7200)
    save = grab(r"chatflow store\.save \(PostgresSessionStore\)\s+median\s+([\d.]+) ms", out, "the save time") / 1000
    big = grab(r"10,000-turn session:\s+median\s+([\d.]+) ms", out, "the 10,000-turn window time") / 1000
    small = grab(r"100-turn session:\s+median\s+([\d.]+) ms", out, "the 100-turn window time") / 1000
    rows = [Row("postgres", "PostgreSQL: load context window, 10,000-turn session", big,
                "same, 100-turn session (chatflow)", small, "<= 1.2x", max_ratio=1.2)]
    m = re.search(r"SQLAlchemySession\.add_items\s+median\s+([\d.]+) ms", out)
    if m:
        rows.append(Row("postgres", "PostgreSQL: append one 4-message turn", save,
                        "Agents SDK SQLAlchemySession.add_items (same server)", float(m.group(1)) / 1000, "<= 1x",
                        max_ratio=1.0))
    else:
        rows.append(Row("postgres", "PostgreSQL: append one 4-message turn", save, error="SQLAlchemySession missing"))
    fleet = re.findall(r"(PostgreSQL|SQLite) \(.*?\)\s+([\d.]+) turns/s\s+begin_turn\+save p50\s+([\d.]+) ms\s+"
                       r"p99\s+([\d.]+) ms", out)
    for kind, rate, p50, p99 in fleet:
        rows.append(Row("postgres", f"fleet of 16 workers, 64 sessions, {kind}: begin_turn+save p50", float(p50) / 1000,
                        note=f"{rate} turns/s, p99 {p99} ms"))
    return rows


def bench_sdk_section(opts: Options) -> list[Row]:
    out = run_script([str(HERE / "bench_sdk_session.py"), "--repeat", str(30 if opts.quick else 300),
                      "--dir", str(opts.work)], timeout=3600, ok=(0, 2))
    if "not installed" in out:
        return [Row("sdk", "Agents SDK session (ChatflowSession)", None, error="openai-agents not installed")]
    rows = []
    for label, figure in (("add_items, one 4-item turn", "ChatflowSession.add_items, one 4-item turn (SQLite)"),
                          ("get_items(), 160-item window:", "ChatflowSession.get_items(), 160-item window (SQLite)"),
                          ("get_items(), 160-item window, log moved",
                           "ChatflowSession.get_items(), 160-item window, cold (another writer moved the log)"),
                          ("add_items, 8 sessions on one file at once",
                           "ChatflowSession.add_items, 8 sessions on one file at once, per call")):
        block = out.split(label, 1)[1]
        ours = grab(r"ChatflowSession \(SQLite store\)\s+median\s+([\d.]+) ms", block, f"{label}: chatflow") / 1000
        theirs = grab(r"SQLiteSession\s+median\s+([\d.]+) ms", block, f"{label}: the SDK") / 1000
        target = "cold" not in figure and "8 sessions" not in figure  # the two figures
        rows.append(Row("sdk", figure, ours, "Agents SDK SQLiteSession, same call", theirs,
                        "<= 1x" if target else "-", max_ratio=1.0 if target else None))
    return rows


def bench_runner_section(opts: Options) -> list[Row]:
    turns = 45 if opts.quick else 200  # bench_runner checks a full 40-turn window: at least 40
    reps = 1 if opts.quick else 3
    ours, theirs = [], []
    for _ in range(reps):
        out = run_script([str(HERE / "bench_runner.py"), "--turns", str(turns)], timeout=3600)
        ours.append(grab(r"chatflow Runner.*?([\d.]+) ms/turn", out, "chatflow's time per turn") / 1000)
        theirs.append(grab(r"Agents SDK Runner.*?([\d.]+) ms/turn", out, "the SDK's time per turn") / 1000)
    return [Row("runner", f"Runner, one tool call per turn ({turns} turns, max_turns 40), per turn",
                statistics.median(ours), "Agents SDK Runner + SQLiteSession(limit=160)", statistics.median(theirs),
                "<= 0.5x", max_ratio=0.5, note=f"median of {reps} run(s)")]


def bench_render_section(opts: Options) -> list[Row]:
    lines = 500 if opts.quick else 1500
    server, render = [], []
    for _ in range(1 if opts.quick else 3):
        # it exits 1 when it misses one of its own targets: the figures are still reported
        out = run_script([str(HERE / "bench_stream_render.py"), "--lines", str(lines)], timeout=3600, ok=(0, 1))
        server.append(grab(r"server streaming time: ([\d.]+) s", out, "the streaming time"))
        render.append(grab(r"with rendering: ([\d.]+) s", out, "the rendering time"))
    rows = [Row("render", f"stream a {lines:,}-line Markdown answer into 80x24 (MarkdownStream)",
                statistics.median(render), "reading the same stream, no rendering", statistics.median(server),
                "<= 1.25x", max_ratio=1.25)]
    out = run_script([str(HERE / "bench_repl_paragraph.py"), "--runs", "1" if opts.quick else "3"], timeout=3600,
                     ok=(0, 1))
    rows.append(Row("render", "REPL: one 190 KB paragraph arriving at once, 100x40 pty, extra time over a one-word answer",
                    grab(r"extra time: REPL ([\d.]+) s", out, "the REPL's extra time"),
                    "`chat` piped, same answer, extra time", grab(r"piped ([\d.]+) s, ratio", out, "the piped time"),
                    "<= 1.5x", max_ratio=1.5))
    return rows


def bench_fakeserver_section(opts: Options) -> list[Row]:
    out = run_script([str(HERE / "bench_fakeserver.py"), "--requests", str(40 if opts.quick else 300)],
                     timeout=3600)

    def row_ms(where: str, client: str, kind: str) -> float:
        pattern = rf"^{where}\s+{re.escape(client)}\s+{re.escape(kind)}\s+([\d.]+)"
        return grab(pattern, out, f"{where}/{client}/{kind}") / 1000

    rows = [Row("fakeserver", "one streamed request to the fake server (server in a thread), ModelClient",
                row_ms("thread", "ModelClient", "streaming"), "http.client, minimal",
                row_ms("thread", "http.client", "streaming"), note="test infrastructure")]
    m = re.search(r"^thread\s+ModelClient\s+(\d+) messages\s+([\d.]+)", out, re.M)
    n = re.search(r"^thread\s+openai typed\s+(\d+) messages\s+([\d.]+)", out, re.M)
    if m and n:
        rows.append(Row("fakeserver", f"a 40-turn window ({m.group(1)} messages) streamed, ModelClient",
                        float(m.group(2)) / 1000, "openai typed chat.completions.create", float(n.group(2)) / 1000))
    return rows


def bench_local_section(opts: Options) -> list[Row]:
    from chatflow_cli.core.local import LocalServer, local_available

    message = "Say hi"
    if not local_available():
        return [Row("local", f'chat "{message}" on the local model', None, error="the local extra is not installed")]
    work = opts.work / "local"
    work.mkdir(parents=True)
    env = clean_env(work / "home")
    with LocalServer(alias="smollm2-135m-instruct") as running:
        wall([*CHATFLOW, "chat", "-s", "warm-up", message], env)  # starts the warm server
        times = alternate({
            "warm": lambda i: [*CHATFLOW, "chat", "-s", f"warm-{i}", message],
            "base-url": lambda i: [*CHATFLOW, "chat", "--base-url", running.base_url, "-m", running.model,
                                   "-s", f"url-{i}", message],
        }, env, opts.runs)
    wall([*CHATFLOW, "local", "stop"], env)
    cold: dict[str, list[float]] = {"private": [], "warm-start": []}
    for i in range(max(3, opts.runs // 3)):
        for kind in (("private", "warm-start") if i % 2 == 0 else ("warm-start", "private")):
            home = work / f"cold-{kind}-{i}"
            extra = {"CHATFLOW_LOCAL_KEEP_ALIVE": "0"} if kind == "private" else {}
            cold[kind].append(wall([*CHATFLOW, "chat", message], clean_env(home, **extra)))
            wall([*CHATFLOW, "local", "stop"], clean_env(home))
    return [
        Row("local", f'chat "{message}" on the local model, warm server, whole process', times["warm"],
            "same call, --base-url of a running llama.cpp server", times["base-url"], "<= 1.15x", max_ratio=1.15),
        Row("local", f'chat "{message}" on the local model, first call (cold: starts the warm server)',
            statistics.median(cold["warm-start"]), "same, local_keep_alive 0 (a private server)",
            statistics.median(cold["private"]), "<= 1.05x (no slower)", max_ratio=1.05),
    ]


def bench_memory_section(opts: Options) -> list[Row]:
    """bench_memory.py: a memory tool call beside a plain tool, memory search beside session search."""
    out = run_script([str(HERE / "bench_memory.py"), "--turns", "40" if opts.quick else "200",
                      "--documents", "1000" if opts.quick else "10000", "--runs", "3" if opts.quick else "9"],
                     timeout=3600)
    plain = grab(r"plain tool\s+median\s+([\d.]+) ms", out, "the plain tool's time") / 1000
    rows = []
    for side in ("memory_view", "memory_str_replace", "memory_create"):
        took = grab(side + r"\s+median\s+([\d.]+) ms", out, f"{side}'s time") / 1000
        rows.append(Row("memory", f"turn with one {side} call (SQLite), per turn", took,
                        "same turn with a plain Python tool", plain, "<= +2 ms", max_seconds=plain + 0.002))
    for query, memory, sessions in re.findall(r"query '(.*?)'\s+memory\s+([\d.]+) ms.*?sessions\s+([\d.]+) ms", out):
        rows.append(Row("memory", f"search memory documents for {query!r} (first page)", float(memory) / 1000,
                        "search as many session turns", float(sessions) / 1000, "<= 1x", max_ratio=1.0))
    return rows


def bench_mcp_section(opts: Options) -> list[Row]:
    """bench_mcp.py: an MCP tool call beside a Python tool; the REPL's start and a one-shot chat
    with three servers declared beside none."""
    out = run_script([str(HERE / "bench_mcp.py"), "--calls", "200" if opts.quick else "1000",
                      "--runs", str(opts.runs), "--cold-runs", "1" if opts.quick else "3"], timeout=3600)

    def median(label: str) -> float:
        return grab(re.escape(label) + r"\s+median\s+([\d.]+)", out, label)

    python, remote = median("python tool") / 1000, median("MCP tool (chatflow)") / 1000
    return [
        Row("mcp", "call to a running stdio MCP server (toolbox's echo), per call", remote,
            "same tool as a Python function", python, "<= +5 ms", max_seconds=python + 0.005,
            note=f"the SDK alone: {median('SDK alone (call_tool on its loop)'):.2f} ms"),
        Row("mcp", "REPL start to the first prompt, three MCP servers declared", median("three servers declared"),
            "no server declared", median("none declared"), "<= 1.05x (no longer)", max_ratio=1.05),
        Row("mcp", 'chat "Say hi" calling no tool, three MCP servers declared (tools kept)',
            median("three servers, tools kept"), "no server declared", median("none"), "<= 1.1x (close to none)",
            max_ratio=1.1, note=f"first run ever: {median('three servers, first run ever'):.2f} s"),
    ]


RUNNERS: dict[str, Callable[[Options], list[Row]]] = {
    "turn": bench_turn,
    "local": bench_local_section,
    "cli": bench_cli_section,
    "store": bench_store_section,
    "sdk": bench_sdk_section,
    "runner": bench_runner_section,
    "memory": bench_memory_section,
    "mcp": bench_mcp_section,
    "render": bench_render_section,
    "fakeserver": bench_fakeserver_section,
    "postgres": bench_postgres_section,
}


# ---------------------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------------------
def table(rows: list[Row], info: dict[str, Any], runs: int) -> str:
    lines = [
        f"Machine: {info['cpu']}, {info['cores']} cores, Python {info['python']} ({info['platform']}); "
        f"load average {info['load_average']} before, {info.get('load_average_after', '?')} after; "
        f"medians of {runs} whole-process runs (turn, cli) or of each benchmark's own repetitions.",
        "",
        "| figure | chatflow | alternative | alternative's time | ratio | target | verdict |",
        "|---|---:|---|---:|---:|---|---|",
    ]
    for r in rows:
        ratio = f"{r.ratio:.2f}x" if r.ratio is not None else "-"
        alt = r.alternative_name if not r.error else "error: " + " ".join(r.error.split()).replace("|", "/")
        figure = r.figure + (f" ({r.note})" if r.note else "")
        lines.append(f"| {figure} | {fmt_time(r.chatflow)} | {alt} | {fmt_time(r.alternative)} | {ratio} | "
                     f"{r.target} | {r.verdict} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repetitions: check that every benchmark runs")
    parser.add_argument("--runs", type=positive_int, help="whole-process runs per command (default 9; 3 with --quick)")
    parser.add_argument("--only", help=f"comma-separated sections: {','.join(SECTIONS)}")
    parser.add_argument("--json", type=Path, help="also write the rows and the machine as JSON here")
    parser.add_argument("--verbose", action="store_true", help="print each section's rows as it finishes")
    args = parser.parse_args(argv)
    chosen = [s.strip() for s in args.only.split(",")] if args.only else list(SECTIONS)
    unknown = [s for s in chosen if s not in RUNNERS]
    if unknown:
        parser.error(f"unknown section(s) {unknown}; choose from {','.join(SECTIONS)}")
    runs = args.runs or (3 if args.quick else 9)
    info = machine()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="chatflow-report-") as tmp:
        opts = Options(quick=args.quick, runs=runs, work=Path(tmp), verbose=args.verbose)
        for name in chosen:
            started = time.perf_counter()
            print(f"[{name}] running...", file=sys.stderr, flush=True)
            try:
                section_rows = RUNNERS[name](opts)
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - one broken benchmark must not hide the others
                section_rows = [Row(name, name, None, error=f"{type(exc).__name__}: {exc}"[:300])]
            rows += section_rows
            print(f"[{name}] done in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
            if args.verbose:
                for r in section_rows:
                    print(f"  {r.figure}: {fmt_time(r.chatflow)} vs {fmt_time(r.alternative)} {r.verdict}",
                          file=sys.stderr)
        notes = opts.notes
    info["load_average_after"] = round(os.getloadavg()[0], 2)
    print(table(rows, info, runs))
    for note in notes:
        print(f"\nNote: {note}")
    print(f"\nCommand: python -m tests.benchmarks.report{' ' + ' '.join(argv or sys.argv[1:]) if (argv or sys.argv[1:]) else ''}")
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "runs": runs, "rows": [r.to_dict() for r in rows]},
                                        indent=2))
    return 1 if any(r.verdict == "error" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
