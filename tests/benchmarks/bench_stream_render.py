"""Benchmark (issue 6): stream a 1,500-line Markdown answer into an 80x24 terminal.

The fake OpenAI-compatible server (tests/helpers/fakeserver.py, in its own process so that it
does not share our GIL) streams a 1,500-line answer with five code blocks as token-sized
chunks (1 to 7 characters) with 0.8 ms before each: about 1,000 tokens a second. The
real client (:class:`chatflow_cli.core.model.ModelClient`) reads it twice:

1. *server time*: reading the stream and doing nothing else;
2. *render time*: feeding every delta to :class:`MarkdownStream` on
   ``Console(file=StringIO(), width=80, height=24, force_terminal=True)``, up to
   :meth:`MarkdownStream.finish`.

Targets: render time <= 1.25 x server time; time per refresh flat as the answer grows
(the mean and max per decile of the answer are printed: the last decile's mean must stay
within 2x the first's, or 1 ms); every line of the answer exactly once on the screen and
in the scrollback (replayed through tests/helpers/vt.py). Exits 1 when a target is missed.

Run: ``python tests/benchmarks/bench_stream_render.py`` from the repository root
(``--lines``, ``--delay`` to vary; ``--in-process`` to fall back to a paced generator).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

try:
    from tests.benchmarks._args import positive_int
except ModuleNotFoundError:  # run as a script: its own directory is on sys.path
    from _args import positive_int  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rich.console import Console

from chatflow_cli.render.markdown_stream import MarkdownStream
from tests.helpers.answer import long_answer, markers, tokens
from tests.helpers.vt import Terminal


def server_process(script: list[dict]) -> tuple[subprocess.Popen, str]:
    path = Path(tempfile.mkdtemp()) / "script.json"
    path.write_text(json.dumps(script))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.fakeserver", "--port", "0", "--script", str(path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    return proc, url


def deltas_from_server(url: str) -> Iterator[str]:
    from chatflow_cli.core.model import ModelClient, TextDelta

    client = ModelClient(url, "test", max_retries=0)
    for item in client.stream("fake-model", [{"role": "user", "content": "write a long answer"}]):
        if isinstance(item, TextDelta):
            yield item.text


def paced(pieces: list[str], delay: float) -> Iterator[str]:
    for piece in pieces:
        time.sleep(delay)
        yield piece


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=positive_int, default=1500)
    parser.add_argument("--delay", type=float, default=0.0008, help="seconds before each chunk (default 0.8 ms: about 1,000 chunks/s with the server's own overhead)")
    parser.add_argument("--in-process", action="store_true", help="a paced generator instead of the fake server")
    args = parser.parse_args()

    answer = long_answer(args.lines, code_blocks=5)
    pieces = tokens(answer)
    print(
        f"answer: {args.lines} lines, {len(answer)} chars, {len(pieces)} chunks, {answer.count('```') // 2} code blocks"
    )

    def source() -> Iterator[str]:
        if args.in_process:
            return paced(pieces, args.delay)
        return deltas_from_server(url)

    proc = None
    url = ""
    if not args.in_process:
        spec = {"type": "text", "text": answer, "chunks": pieces, "delay": args.delay}
        proc, url = server_process([spec, spec])
    try:
        started = time.perf_counter()
        received = "".join(source())
        server_s = time.perf_counter() - started
        assert received == answer, "the stream did not carry the answer intact"

        out = io.StringIO()
        console = Console(file=out, width=80, height=24, force_terminal=True)
        renderer = MarkdownStream(console)
        started = time.perf_counter()
        for delta in source():
            renderer.feed(delta)
        renderer.finish()
        render_s = time.perf_counter() - started
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)

    ratio = render_s / server_s
    rate = len(pieces) / server_s
    print(
        f"server streaming time: {server_s:.2f} s ({rate:.0f} chunks/s); with rendering: {render_s:.2f} s; "
        f"ratio {ratio:.3f} (target <= 1.25)"
    )

    stats = renderer.stats
    total_refresh = sum(s.seconds for s in stats)
    print(
        f"refreshes: {len(stats)}, rendering CPU in refreshes: {total_refresh:.2f} s, "
        f"max live tail {max(s.tail_rows for s in stats)} rows"
    )
    deciles: list[list[float]] = [[] for _ in range(10)]
    for stat in stats:
        deciles[min(9, stat.answer_chars * 10 // len(answer))].append(stat.seconds * 1000)
    print("decile  refreshes  mean ms  max ms")
    means = []
    for index, values in enumerate(deciles):
        mean = sum(values) / len(values) if values else 0.0
        means.append(mean)
        print(f"{(index + 1) * 10:>5}%  {len(values):>9}  {mean:7.2f}  {max(values, default=0):6.2f}")

    term = Terminal(80, 24)
    term.feed(out.getvalue())
    shown = Counter(markers("\n".join(term.lines())))
    wanted = markers(answer)
    wrong = [m for m in wanted if shown[m] != 1]
    print(f"lines checked: {len(wanted)} marked lines; shown other than exactly once: {len(wrong)}")

    flat = means[-1] <= max(2 * means[0], means[0] + 1.0)
    ok = ratio <= 1.25 and flat and not wrong
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
