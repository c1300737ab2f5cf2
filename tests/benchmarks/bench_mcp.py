"""Benchmark (issue 27): tools from MCP servers, beside what they sit next to.

Run from the repository root (not collected by pytest)::

    python -m tests.benchmarks.bench_mcp                     # all three, the default counts
    python -m tests.benchmarks.bench_mcp --only call --calls 2000
    python tests/benchmarks/bench_mcp.py --runs 3 --calls 200   # a quick check

``call``: a call to an already running stdio server (tests/mcp/toolbox.py's ``echo``, the SDK's
own server) through chatflow's :class:`~chatflow_cli.core.mcp.tools.MCPTool` -- what the
Runner's tool thread does -- beside the same tool as a Python function (``@tool``), in the same
process and run, ``--calls`` rounds after 20 warm-up rounds. Each round also times the SDK
alone: ``ClientSession.call_tool`` awaited on the MCP loop itself (no thread hop, no result
conversion), the floor chatflow sits on. The sides take turns inside each round, each round
starting one side further. Reported: each side's median and p95, and what MCP adds, the
per-round difference MCP - Python (median, p95). Target: at most +5 ms (median).

``repl``: ``chatflow chat -s ID`` in an 80x24 pseudo-terminal (tests/helpers/pty_driver.py),
from the start of the process to the first prompt, with three servers declared (toolbox, toolbox
with another argument, ``python -m mcp_server_time``) beside none; ``--runs`` pairs, alternated.
Target: no longer (servers start when a turn calls one of their tools).

``chat``: ``chatflow chat "Say hi"`` (whole process, a new session each run, stdout a pipe)
against the fake OpenAI-compatible server in its own process, with the same three servers
declared and their tools kept from an earlier run, beside none; ``--runs`` pairs, alternated.
Target: close to none (the model calls no tool: no server starts). And the first run ever (no
tools kept: the servers start to list them), ``--cold-runs`` times, for scale.

Each figure is printed with the load average before and after: on a shared machine the
whole-process figures move with it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

try:
    from tests.benchmarks._args import positive_int
except ModuleNotFoundError:  # run as a script: its own directory is on sys.path
    from _args import positive_int  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

TOOLBOX = str(REPO / "tests" / "mcp" / "toolbox.py")
CHATFLOW = [str(Path(sys.executable).with_name("chatflow"))]
if not Path(CHATFLOW[0]).exists():
    CHATFLOW = [sys.executable, "-m", "chatflow_cli"]
PROMPT = "\u203a"  # the REPL's prompt


def _q(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _line(label: str, values: list[float], unit: float = 1000.0, suffix: str = "ms") -> str:
    return (f"  {label:<34} median {statistics.median(values) * unit:8.3f} {suffix}   "
            f"p95 {_q(values, 0.95) * unit:8.3f} {suffix}   ({len(values)} samples)")


def _load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


# ---------------------------------------------------------------------------------------
# call: one tool call, MCP beside Python
# ---------------------------------------------------------------------------------------
def bench_call(calls: int) -> dict[str, list[float]]:
    from chatflow_cli import tool
    from chatflow_cli.core.mcp import MCPServerStdio, _loop

    server = MCPServerStdio({"command": sys.executable, "args": [TOOLBOX]}, name="toolbox", approval="always")

    @tool
    def echo(text: str) -> str:
        """Say the text back."""
        return text

    try:
        remote = server.agent_tools()["toolbox__echo"]
        session = server._session

        async def sdk_alone() -> float:
            started = time.perf_counter()
            await session.call_tool("echo", {"text": "hello"})
            return time.perf_counter() - started

        def python_side() -> float:
            started = time.perf_counter()
            assert echo.invoke({"text": "hello"}) == "hello"
            return time.perf_counter() - started

        def mcp_side() -> float:
            started = time.perf_counter()
            assert remote.invoke({"text": "hello"}) == "hello"
            return time.perf_counter() - started

        def sdk_side() -> float:
            return _loop.run(sdk_alone())

        sides: list[tuple[str, Callable[[], float]]] = [("python", python_side), ("mcp", mcp_side),
                                                         ("sdk", sdk_side)]
        times: dict[str, list[float]] = {name: [] for name, _ in sides}
        for i in range(calls + 20):
            k = i % len(sides)
            took = {name: side() for name, side in sides[k:] + sides[:k]}
            if i >= 20:
                for name, value in took.items():
                    times[name].append(value)
        times["added"] = [m - p for m, p in zip(times["mcp"], times["python"])]
        times["over the sdk"] = [m - s for m, s in zip(times["mcp"], times["sdk"])]
        return times
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------
# repl and chat: whole processes, three servers declared or none
# ---------------------------------------------------------------------------------------
def _servers_toml() -> str:
    python = json.dumps(sys.executable)
    return (f"[mcp_servers.toolbox]\ncommand = {python}\nargs = [{json.dumps(TOOLBOX)}]\n\n"
            f"[mcp_servers.second]\ncommand = {python}\nargs = [{json.dumps(TOOLBOX)}, \"second\"]\n\n"
            f"[mcp_servers.time]\ncommand = {python}\nargs = [\"-m\", \"mcp_server_time\", \"--local-timezone=UTC\"]\n")


@contextmanager
def _fake_server(env: dict[str, str]) -> Iterator[str]:
    server = subprocess.Popen([sys.executable, "-m", "tests.helpers.fakeserver", "--port", "0"], cwd=REPO,
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        yield server.stdout.readline().strip()  # type: ignore[union-attr]
    finally:
        server.terminate()
        server.wait()


def _env(work: Path, url: str) -> tuple[dict[str, str], dict[str, str]]:
    """The environments of the two sides: no server declared, three declared."""
    (work / "none.toml").write_text("", encoding="utf-8")
    (work / "servers.toml").write_text(_servers_toml(), encoding="utf-8")
    env = dict(os.environ, CHATFLOW_HOME=str(work / "home"), OPENAI_BASE_URL=url, CHATFLOW_MODEL="fake-model",
               OPENAI_API_KEY="bench-key", PYTHONPATH=str(REPO))
    for name in ("CHATFLOW_DB", "NO_COLOR", "COLUMNS", "LINES", "CHATFLOW_TRANSPORT", "PYTHONDONTWRITEBYTECODE"):
        env.pop(name, None)
    env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")  # compiled once, as an installed chatflow is
    return dict(env, CHATFLOW_CONFIG=str(work / "none.toml")), dict(env, CHATFLOW_CONFIG=str(work / "servers.toml"))


def _chat_once(env: dict[str, str], message: str = "Say hi") -> float:
    started = time.perf_counter()
    proc = subprocess.run([*CHATFLOW, "chat", message], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=120)
    took = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"chat failed ({proc.returncode}): {proc.stderr.decode()[-500:]}")
    return took


def _repl_once(env: dict[str, str], session: str) -> float:
    from tests.helpers.pty_driver import PtyRepl

    started = time.perf_counter()
    repl = PtyRepl(["chat", "-s", session], width=80, height=24, env=env)
    try:
        deadline = started + 60
        while PROMPT not in repl.raw:
            repl.pump(0.002)
            if time.perf_counter() > deadline:
                raise SystemExit(f"no prompt within 60 s: {repl.screen()[-500:]}")
        took = time.perf_counter() - started
        repl.send("\x04")  # Ctrl-D leaves
        if repl.wait_exit(timeout=60) != 0:
            raise SystemExit(f"the REPL did not exit cleanly: {repl.screen()[-500:]}")
        return took
    finally:
        repl.close()


def _pairs(runs: int, sides: dict[str, Callable[[int], float]]) -> dict[str, list[float]]:
    """``runs`` rounds of every side, alternated (each round starts one side further)."""
    names = list(sides)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(runs):
        for name in names[i % len(names):] + names[:i % len(names)]:
            times[name].append(sides[name](i))
    return times


def bench_processes(runs: int, cold_runs: int, only: str | None, work: Path) -> None:
    plain = dict(os.environ, PYTHONPATH=str(REPO))
    with _fake_server(plain) as url:
        none, servers = _env(work, url)
        _chat_once(none)  # warm-up: compiled files, the page cache
        _chat_once(servers)  # the first run ever: the servers list their tools, which are kept
        kept = work / "home" / "cache" / "mcp-tools"
        if len(list(kept.glob("*.json"))) != 3:
            raise SystemExit(f"expected the tools of 3 servers kept in {kept}")
        if only in (None, "repl"):
            print(f"\nrepl: start to the first prompt, 80x24 pseudo-terminal, {runs} pairs; {_load()}")
            times = _pairs(runs, {"none": lambda i: _repl_once(none, f"repl-none-{i}"),
                                  "three servers": lambda i: _repl_once(servers, f"repl-servers-{i}")})
            for name, values in times.items():
                print(_line(f"{name} declared", values, 1.0, "s"))
            ratio = statistics.median(times["three servers"]) / statistics.median(times["none"])
            print(f"  ratio of the medians: {ratio:.2f}x (target: no longer, 1.0x); {_load()}")
        if only in (None, "chat"):
            print(f"\nchat 'Say hi' (no tool called), whole process, {runs} pairs; {_load()}")
            times = _pairs(runs, {"none": lambda i: _chat_once(none),
                                  "three servers, tools kept": lambda i: _chat_once(servers)})
            for name, values in times.items():
                print(_line(f"{name}", values, 1.0, "s"))
            ratio = statistics.median(times["three servers, tools kept"]) / statistics.median(times["none"])
            print(f"  ratio of the medians: {ratio:.2f}x (target: close to 1.0x); {_load()}")
            cold = []
            for _ in range(cold_runs):
                shutil.rmtree(kept)
                cold.append(_chat_once(servers))
            print(_line("three servers, first run ever", cold, 1.0, "s") + " (they start to list their tools)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("call", "repl", "chat"))
    parser.add_argument("--calls", type=positive_int, default=1000, help="measured calls a side (call)")
    parser.add_argument("--runs", type=positive_int, default=9, help="whole-process runs a side (repl, chat)")
    parser.add_argument("--cold-runs", type=positive_int, default=3, help="first runs ever (chat)")
    args = parser.parse_args(argv)
    print(f"{_load()} before; {os.cpu_count()} cores; Python {sys.version.split()[0]}")
    if args.only in (None, "call"):
        times = bench_call(args.calls)
        print(f"\ncall: toolbox's echo on a running stdio server beside a Python @tool, {args.calls} rounds")
        print(_line("python tool", times["python"]))
        print(_line("MCP tool (chatflow)", times["mcp"]))
        print(_line("SDK alone (call_tool on its loop)", times["sdk"]))
        print(_line("added by MCP (per round)", times["added"]) + "   target: median <= +5 ms")
        print(_line("chatflow over the SDK (per round)", times["over the sdk"]))
    if args.only != "call":
        with tempfile.TemporaryDirectory(prefix="chatflow-bench-mcp-") as tmp:
            bench_processes(args.runs, args.cold_runs, args.only, Path(tmp))
    print(f"\n{_load()} after")
    return 0


if __name__ == "__main__":
    sys.exit(main())
