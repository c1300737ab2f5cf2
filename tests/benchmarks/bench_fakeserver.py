"""Benchmark: the fake provider's own latency per request (tests/helpers/fakeserver.py).

What a test or a benchmark pays for each model request that the fake server answers,
measured with a minimal client (``http.client``, one new connection per request, since
werkzeug's dev server closes every connection) and, for reference, through chatflow's
``ModelClient`` (the ``openai`` client: request building, SSE decoding, chunk models):

* non-streaming: ``stream: false`` -> one JSON completion ("ok: hi", the default reply);
* streaming: ``stream: true`` with ``stream_options.include_usage`` -> the same reply as
  6 SSE events (role chunk, "ok:", " hi", finish chunk, usage chunk, ``[DONE]``).

A last pair of rows sends a 40-turn window (162 messages) streamed, through ModelClient and
through ``openai``'s typed ``chat.completions.create``, whose request transform grows with
the history (why ModelClient posts through ``client.post``).

The server runs in this process (a thread, as in the tests) and, separately, in its own
process (``python -m tests.helpers.fakeserver``, as the runner benchmark uses it). Prints medians
and 90th percentiles in milliseconds. Run::

    /tmp/venv/bin/python tests/benchmarks/bench_fakeserver.py [--requests 300]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import urlparse

try:
    from tests.benchmarks._args import positive_int
except ModuleNotFoundError:  # run as a script: its own directory is on sys.path
    from _args import positive_int  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from chatflow_cli.core.model import ModelClient  # noqa: E402
from tests.helpers.fakeserver import FakeServer  # noqa: E402

USER = [{"role": "user", "content": "hi"}]
PLAIN = json.dumps({"model": "fake-model", "messages": USER}).encode()
STREAM = json.dumps({"model": "fake-model", "messages": USER, "stream": True,
                     "stream_options": {"include_usage": True}}).encode()


@contextmanager
def in_process() -> Iterator[str]:
    with FakeServer() as server:
        yield server.url


@contextmanager
def other_process() -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.fakeserver", "--port", "0"], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def raw_request(url: str, body: bytes) -> Callable[[], None]:
    parts = urlparse(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80

    def once() -> None:
        conn = http.client.HTTPConnection(host, port)
        conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        assert resp.status == 200 and data

    return once


def openai_request(url: str, stream: bool) -> Callable[[], None]:
    client = ModelClient(url, None, max_retries=0)

    if stream:
        def once() -> None:
            assert client.complete("fake-model", USER).content == "ok: hi"
    else:
        raw = client._openai()

        def once() -> None:
            assert raw.chat.completions.create(model="fake-model", messages=USER).choices[0].message.content

    return once


def long_history(turns: int = 40) -> list[dict]:
    """A 40-turn window like the Runner sends: each turn a tool call, its result and an answer."""
    messages: list[dict] = [{"role": "system", "content": "You are a helpful assistant."}]
    for i in range(turns):
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"X"}'}}
        messages += [{"role": "user", "content": f"What is the weather in city {i}?"},
                     {"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"call_{i}", "content": "sunny, 21C"},
                     {"role": "assistant", "content": f"It is sunny in city {i}."}]
    return messages + USER


def history_requests(url: str) -> list[tuple[str, Callable[[], None]]]:
    client = ModelClient(url, None, max_retries=0)
    raw = client._openai()
    history = long_history()

    def model_client() -> None:
        client.complete("fake-model", history)

    def typed() -> None:
        for _ in raw.chat.completions.create(model="fake-model", messages=history, stream=True,
                                             stream_options={"include_usage": True}):
            pass

    return [("ModelClient", model_client), ("openai typed", typed)]


def measure(fn: Callable[[], None], n: int) -> tuple[float, float]:
    for _ in range(20):  # warm-up: imports, first connections
        fn()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.9)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=positive_int, default=300)
    args = parser.parse_args()
    print(f"fake server latency, {args.requests} requests each, {os.cpu_count()} CPUs, Python "
          f"{sys.version.split()[0]}")
    print(f"{'server':<14}{'client':<14}{'request':<16}{'median ms':>10}{'p90 ms':>9}")
    for where, ctx in (("thread", in_process), ("process", other_process)):
        with ctx() as url:
            rows = [
                ("http.client", "non-streaming", raw_request(url, PLAIN)),
                ("http.client", "streaming", raw_request(url, STREAM)),
                ("openai typed", "non-streaming", openai_request(url, stream=False)),
                ("ModelClient", "streaming", openai_request(url, stream=True)),
            ]
            for client, kind, fn in rows:
                median, p90 = measure(fn, args.requests)
                print(f"{where:<14}{client:<14}{kind:<16}{median:>10.2f}{p90:>9.2f}")
    print(f"\nstreaming with a 40-turn window ({len(long_history())} messages), server in a thread:")
    with in_process() as url:
        for client, fn in history_requests(url):
            median, p90 = measure(fn, max(20, args.requests // 10))
            print(f"{'thread':<14}{client:<14}{f'{len(long_history())} messages':<16}{median:>10.2f}{p90:>9.2f}")


if __name__ == "__main__":
    main()
