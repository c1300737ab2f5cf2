"""The embedded local model: its speed with extra CPU buffer types off, and the warm server.

Run::

    python tests/benchmarks/bench_local_model.py [--runs 9] [--baseline PATH]

What it measures (medians; whole processes where it says so; stdout a pipe):

* **Tokens per second of SmolLM2** through a private ``LocalServer``, with llama.cpp's extra
  CPU buffer types off (chatflow's default) and on: ``--runs`` completions of up to 96 tokens
  at temperature 0 after one warm-up, streamed chunks (one a token) per second. Where the CPU advertises
  AMX but the machine traps it, the "on" server dies by SIGILL: printed as such.
* **One-shot ``chatflow chat "Say hi"`` on the warm local server** (whole process, the server
  already warm in the data directory) against the same call with ``--base-url`` pointed at an
  already running llama.cpp server with the same model (target: at most 1.15x).
* **The first call, cold**: ``chatflow chat "Say hi"`` in a fresh data directory (it starts the
  server), with ``local_keep_alive`` 0 (a private server, as before the warm server existed)
  and with the default keep-alive; with ``--baseline PATH`` also the same call running the
  chatflow checkout at PATH (e.g. ``/work/main`` before this change).

Child processes get compiled ``.pyc`` files in a temporary ``PYTHONPYCACHEPREFIX``.
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
sys.path.insert(0, str(REPO))

PROMPT = "Write a long story about a lighthouse keeper and the sea."


def tokens_per_second(extra_bufts: bool, runs: int) -> str:
    """Median decode speed: streamed text chunks (llama.cpp sends one a token) per second of the
    whole request, ``max_tokens`` 96."""
    from chatflow_cli.core.errors import LocalModelError
    from chatflow_cli.core.local import LocalModelClient, LocalServer
    from chatflow_cli.core.model import TextDelta

    server = LocalServer(extra_bufts=extra_bufts)
    try:
        server.start()
        client = LocalModelClient(server, timeout=300)
        messages = [{"role": "user", "content": PROMPT}]

        def one(max_tokens: int) -> float:
            start = time.perf_counter()
            pieces = sum(1 for item in client.stream(server.model, messages, max_tokens=max_tokens, temperature=0.0)
                         if isinstance(item, TextDelta))
            return pieces / (time.perf_counter() - start)

        one(16)  # warm-up
        rates = [one(96) for _ in range(runs)]
        client.close()
        return f"{statistics.median(rates):7.1f} tokens/s (median of {runs}, min {min(rates):.1f}, max {max(rates):.1f})"
    except LocalModelError as exc:
        return f"failed: {exc.message[:200]}"
    finally:
        server.stop()


def whole_process(argv: list[str], env: dict[str, str], runs: int, fresh_home: bool = False) -> list[float]:
    times = []
    for _ in range(runs):
        run_env = dict(env)
        if fresh_home:
            run_env["CHATFLOW_HOME"] = tempfile.mkdtemp(prefix="cf-cold-")
        start = time.perf_counter()
        proc = subprocess.run(argv, env=run_env, stdin=subprocess.DEVNULL, capture_output=True, timeout=300)
        took = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"{argv} failed: {proc.stderr.decode()[-500:]}")
        times.append(took)
        if fresh_home:
            stop = subprocess.run([sys.executable, "-m", "chatflow_cli", "local", "stop"], env=run_env,
                                  capture_output=True)
            assert stop.returncode == 0
    return times


def fmt(times: list[float]) -> str:
    return f"{statistics.median(times):6.3f} s (min {min(times):.3f}, max {max(times):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=positive_int, default=9)
    parser.add_argument("--baseline", help="another chatflow checkout to time the cold call of")
    args = parser.parse_args()
    load = os.getloadavg()
    amx = "amx_tile" in Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else False
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"CPU advertises AMX: {amx}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")

    print("SmolLM2-135M Q4_1, 96-token completions:")
    print(f"  extra CPU buffer types off (chatflow): {tokens_per_second(False, args.runs)}")
    print(f"  extra CPU buffer types on (llama.cpp's default): {tokens_per_second(True, args.runs)}")

    home = Path(tempfile.mkdtemp(prefix="cf-bench-"))
    pycache = tempfile.mkdtemp(prefix="cf-pyc-")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CHATFLOW_"))}
    (home / "empty.toml").write_text("", encoding="utf-8")  # a named config file must exist
    env.update(CHATFLOW_HOME=str(home), CHATFLOW_CONFIG=str(home / "empty.toml"), PYTHONPATH=str(REPO),
               PYTHONPYCACHEPREFIX=pycache)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    chatflow = [sys.executable, "-m", "chatflow_cli"]
    if Path(sys.executable).with_name("chatflow").exists():
        chatflow = [str(Path(sys.executable).with_name("chatflow"))]

    from chatflow_cli.core.local import LocalServer

    with LocalServer() as running:
        whole_process([*chatflow, "chat", "Say hi"], env, 1)  # starts the warm server
        warm = whole_process([*chatflow, "chat", "Say hi"], env, args.runs)
        base = whole_process([*chatflow, "chat", "--base-url", running.base_url, "-m", running.model, "Say hi"],
                             env, args.runs)
    subprocess.run([*chatflow, "local", "stop"], env=env, capture_output=True)
    ratio = statistics.median(warm) / statistics.median(base)
    print('one-shot chatflow chat "Say hi" (whole process):')
    print(f"  local model, warm server:                    {fmt(warm)}")
    print(f"  --base-url of a running llama.cpp server:    {fmt(base)}")
    print(f"  ratio {ratio:.2f}x (target <= 1.15x)")

    cold_runs = max(3, args.runs // 3)
    print(f'first call, cold (a fresh data directory; median of {cold_runs}):')
    private = whole_process([*chatflow, "chat", "Say hi"], {**env, "CHATFLOW_LOCAL_KEEP_ALIVE": "0"}, cold_runs,
                            fresh_home=True)
    print(f"  keep-alive 0 (a private server):            {fmt(private)}")
    shared = whole_process([*chatflow, "chat", "Say hi"], env, cold_runs, fresh_home=True)
    print(f"  default keep-alive (starts the warm server): {fmt(shared)}")
    if args.baseline:
        try:
            baseline = whole_process([sys.executable, "-m", "chatflow_cli", "chat", "Say hi"],
                                     {**env, "PYTHONPATH": args.baseline}, cold_runs, fresh_home=True)
            print(f"  {args.baseline} (before):                  {fmt(baseline)}")
        except SystemExit as exc:  # before the change, a CPU whose AMX is trapped crashes the server
            print(f"  {args.baseline} (before): {str(exc)[:300]}")


if __name__ == "__main__":
    main()
