"""Benchmark: one 190 KB paragraph in the REPL, beside printing it piped.

A model answers with one paragraph of 190,000 characters (words, bold, italic, code spans)
that arrives at once, in 16-character chunks (``--chunk N``; 0: in one chunk), from the fake OpenAI-compatible server (in its
own process). Both sides are the real ``chatflow`` process:

* *piped*: ``chatflow chat -s ID go`` with stdout a pipe (the text is written as it arrives),
  whole process;
* *REPL*: ``chatflow chat -s ID`` in a 100x40 pseudo-terminal (tests/helpers/pty_driver.py), from
  the Enter that sends ``go`` to the next prompt, the whole paragraph rendered as Markdown.

Each side is also timed with a one-word answer, and the comparison is of the extra time
the 190 KB answer costs (REPL extra / piped extra): the fixed costs (start-up, the prompt)
differ between the two and are not what is measured. Target: <= 1.5x. Medians of
``--runs`` (default 3) alternated runs. Exits 1 when the target is missed.

Run: ``python tests/benchmarks/bench_repl_paragraph.py`` from the repository root.
"""

from __future__ import annotations

import argparse
import json
import os
import random
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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.conftest import COMMAND  # noqa: E402
from tests.helpers.pty_driver import PtyRepl  # noqa: E402

TARGET = 1.5


def paragraph(chars: int, seed: int = 7) -> str:
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "**bold words**", "`a code span`", "*italic*", "epsilon",
             "international", "theta,", "iota."]
    out, size = [], 0
    while size < chars:
        word = rng.choice(words)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[: chars - 5] + " END."


def server(script: list[dict]) -> tuple[subprocess.Popen, str]:
    path = Path(tempfile.mkdtemp()) / "script.json"
    path.write_text(json.dumps(script))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.fakeserver", "--port", "0", "--script", str(path)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def piped(env: dict[str, str], session: str) -> float:
    started = time.perf_counter()
    subprocess.run([*COMMAND, "chat", "-s", session, "go"], env=env, stdout=subprocess.PIPE,
                   stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def in_repl(env: dict[str, str], session: str, end: str) -> float:
    repl = PtyRepl(["chat", "-s", session], width=100, height=40, env=env)
    try:
        repl.wait_prompt(timeout=60)
        time.sleep(0.3)
        mark = len(repl.raw)
        started = time.perf_counter()
        repl.send("go\r")

        def prompt_after_answer() -> bool:
            at = repl.raw.find(end, mark)
            return at >= 0 and "\u203a" in repl.raw[at:]

        repl.wait_for(prompt_after_answer, timeout=600, what="the answer and the next prompt")
        took = time.perf_counter() - started
        repl.send("\x04")
        repl.wait_exit(60)
        return took
    finally:
        repl.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chars", type=positive_int, default=190_000)
    parser.add_argument("--runs", type=positive_int, default=3)
    parser.add_argument("--chunk", type=positive_int, default=16,
                        help="characters a streamed chunk (0: the whole paragraph in one chunk)")
    args = parser.parse_args()
    big = paragraph(args.chars)
    small = "Short END."
    size = args.chunk or len(big)
    big_spec = {"type": "text", "text": big, "chunks": [big[i : i + size] for i in range(0, len(big), size)]}
    small_spec = {"type": "text", "text": small}
    # order of use: per run, piped small, piped big, REPL small, REPL big
    proc, url = server([big_spec if i % 2 else small_spec for i in range(4 * args.runs)])
    home = Path(tempfile.mkdtemp())
    (home / "config.toml").write_text("", encoding="utf-8")  # a named config file must exist
    env = {**os.environ, "OPENAI_BASE_URL": url, "OPENAI_API_KEY": "bench", "CHATFLOW_MODEL": "fake-model",
           "CHATFLOW_HOME": str(home), "CHATFLOW_CONFIG": str(home / "config.toml"), "PYTHONPATH": str(ROOT)}
    times: dict[str, list[float]] = {"piped small": [], "piped big": [], "repl small": [], "repl big": []}
    try:
        for run in range(args.runs):
            times["piped small"].append(piped(env, f"ps{run}"))
            times["piped big"].append(piped(env, f"pb{run}"))
            times["repl small"].append(in_repl(env, f"rs{run}", "Short END."))
            times["repl big"].append(in_repl(env, f"rb{run}", "END."))
    finally:
        proc.terminate()
        proc.wait(10)
    med = {name: statistics.median(values) for name, values in times.items()}
    piped_extra = med["piped big"] - med["piped small"]
    repl_extra = med["repl big"] - med["repl small"]
    ratio = repl_extra / piped_extra if piped_extra > 0 else float("inf")
    for name, value in med.items():
        print(f"{name:12} {value:7.2f} s  (runs: {', '.join(f'{v:.2f}' for v in times[name])})")
    print(f"190 KB paragraph, extra time: REPL {repl_extra:.2f} s, piped {piped_extra:.2f} s, "
          f"ratio {ratio:.2f}x (target <= {TARGET}x)")
    print(f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
