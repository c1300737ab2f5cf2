"""CPU time of whole ``chatflow`` processes for the plain commands (issue 30). Not collected by pytest.

Run::

    python tests/benchmarks/bench_startup.py [--runs 8] [--src CHECKOUT ...]

Every CPU millisecond a ``chatflow`` process spends starting is paid by every run, and
thousands of times by the test suite. For each command this prints the minimum and the
median over ``--runs`` runs of the process's CPU time (user + system, from
``getrusage(RUSAGE_CHILDREN)``: steadier than wall time on a busy machine), stdout a pipe:

* ``python -c pass``: the interpreter's own start, the floor;
* ``chatflow --help``;
* ``chatflow sessions ls`` and ``chatflow sessions show ID`` over 5 one-turn sessions;
* ``chatflow chat hi``: a new session each run, answered by the fake OpenAI-compatible server
  (tests/helpers/fakeserver.py, running in its own process).

``--src`` (repeatable) names checkouts of chatflow to compare, each put first on
``PYTHONPATH`` in turn (default: this one). Their runs alternate, A B A B, so a change of
the machine's load weighs on each alike. Child processes get compiled ``.pyc`` files (a
temporary ``PYTHONPYCACHEPREFIX`` per checkout, warmed first), as an installed chatflow has
them, even where ``PYTHONDONTWRITEBYTECODE`` is set.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    from tests.benchmarks._args import positive_int
except ModuleNotFoundError:  # run as a script: its own directory is on sys.path
    from _args import positive_int  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[2]
CHATFLOW = [str(Path(sys.executable).with_name("chatflow"))]
if not Path(CHATFLOW[0]).exists():
    CHATFLOW = [sys.executable, "-m", "chatflow_cli"]

COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "chatflow --help": [*CHATFLOW, "--help"],
    "chatflow sessions ls": [*CHATFLOW, "sessions", "ls"],
    "chatflow sessions show s0": [*CHATFLOW, "sessions", "show", "s0"],
    "chatflow chat hi": [*CHATFLOW, "chat", "hi"],
}


def checkout(text: str) -> Path:
    """A directory holding a ``chatflow_cli`` package."""
    path = Path(text).expanduser().resolve()
    if not (path / "chatflow_cli" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a checkout of chatflow (no chatflow_cli/ in it)")
    return path


def cpu_seconds(cmd: list[str], env: dict[str, str]) -> float:
    """User + system CPU seconds of one run of ``cmd`` (stdout and stderr pipes, no stdin)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {proc.returncode}): {proc.stderr.decode()[-500:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=positive_int, default=8)
    parser.add_argument("--src", type=checkout, action="append",
                        help="a checkout of chatflow to measure (repeatable; default: this one)")
    args = parser.parse_args()
    sources: list[Path] = args.src or [REPO]
    with tempfile.TemporaryDirectory(prefix="chatflow-startup-") as tmp:
        config = Path(tmp) / "empty.toml"  # a named config file must exist
        config.write_text("", encoding="utf-8")
        base = dict(os.environ, CHATFLOW_CONFIG=str(config), PYTHON_KEYRING_BACKEND="keyring.backends.fail.Keyring")
        for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "CHATFLOW_MODEL", "CHATFLOW_DB", "CHATFLOW_TRANSPORT",
                     "NO_COLOR", "COLUMNS", "PYTHONDONTWRITEBYTECODE"):
            base.pop(name, None)
        server = subprocess.Popen([sys.executable, "-m", "tests.helpers.fakeserver", "--port", "0"], cwd=REPO,
                                  stdout=subprocess.PIPE, text=True, env=dict(base, PYTHONPATH=str(REPO)))
        try:
            url = server.stdout.readline().strip()  # type: ignore[union-attr]
            envs = []
            for i, src in enumerate(sources):
                home = Path(tmp) / f"home-{i}"
                home.mkdir(mode=0o700)
                env = dict(base, PYTHONPATH=str(src), CHATFLOW_HOME=str(home), OPENAI_BASE_URL=url,
                           CHATFLOW_MODEL="fake-model", OPENAI_API_KEY="sk-bench",
                           PYTHONPYCACHEPREFIX=str(Path(tmp) / f"pycache-{i}"))
                for k in range(5):
                    cpu_seconds([*CHATFLOW, "chat", "-s", f"s{k}", "hi"], env)
                envs.append(env)
            print(f"machine: {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}; "
                  f"{args.runs} runs each; load average {os.getloadavg()[0]:.2f}")
            print(f"{'CPU seconds, min / median':<28}" + "".join(f"{src.name[:24]:>26}" for src in sources))
            for label, cmd in COMMANDS.items():
                for env in envs:  # warm the .pyc files and the page cache
                    cpu_seconds(cmd, env)
                samples: list[list[float]] = [[] for _ in sources]
                for _ in range(args.runs):
                    for i, env in enumerate(envs):
                        samples[i].append(cpu_seconds(cmd, env))
                print(f"{label:<28}" + "".join(f"{min(s):>16.3f} / {statistics.median(s):.3f}" for s in samples),
                      flush=True)
            print(f"load average at the end {os.getloadavg()[0]:.2f}")
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
