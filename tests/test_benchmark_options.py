"""The benchmark scripts refuse a bad option with one argparse error (exit 2), never a
traceback from inside a measurement (``--repeat 0`` left no sample to take a median of;
``--dir`` of a missing directory failed in ``tempfile``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

CASES = [
    ("bench_sdk_session.py", ["--dir", "/nonexistent/x"], "argument --dir: /nonexistent/x is not an existing directory"),
    ("bench_sdk_session.py", ["--repeat", "0"], "argument --repeat: must be at least 1, got 0"),
    ("bench_sdk_session.py", ["--repeat", "many"], "argument --repeat: 'many' is not a whole number"),
    ("bench_store.py", ["--dir", "/nonexistent/x"], "argument --dir: /nonexistent/x is not an existing directory"),
    ("bench_store.py", ["--repeat", "-3"], "argument --repeat: must be at least 1, got -3"),
    ("bench_token_window.py", ["--repeat", "0"], "argument --repeat: must be at least 1, got 0"),
    ("bench_runner.py", ["--turns", "0"], "argument --turns: must be at least 1, got 0"),
    ("bench_startup.py", ["--runs", "0"], "argument --runs: must be at least 1, got 0"),
    ("bench_startup.py", ["--src", "/nonexistent/x"],
     "argument --src: /nonexistent/x is not a checkout of chatflow (no chatflow_cli/ in it)"),
    ("bench_mcp.py", ["--calls", "0"], "argument --calls: must be at least 1, got 0"),
    ("bench_mcp.py", ["--runs", "few"], "argument --runs: 'few' is not a whole number"),
]


@pytest.mark.parametrize(("script", "args", "error"), CASES, ids=[f"{c[0]} {' '.join(c[1])}" for c in CASES])
def test_a_bad_option_is_one_error_line(script: str, args: list[str], error: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "benchmarks" / script), *args],
                          check=False, capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert proc.returncode == 2, proc
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[-1] == f"{script}: error: {error}"
