"""The test run's own settings: ci_long tests are left out of the default run and selected by
``-m ci_long`` (CI's second pass), and warnings are errors."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PROCESS_RUNS = "tests/hardening/test_concurrency.py::test_eight_processes_own_and_shared_sessions"


def _collected(*args: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-n", "0", *args,
         "tests/hardening/test_concurrency.py"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_ci_long_is_left_out_by_default_and_selected_by_a_later_m() -> None:
    default = _collected()
    assert f"{PROCESS_RUNS}[4x8]" in default and f"{PROCESS_RUNS}[8x50]" not in default, default
    long = _collected("-m", "ci_long")
    assert f"{PROCESS_RUNS}[8x50]" in long and f"{PROCESS_RUNS}[4x8]" not in long, long
    assert set(default).isdisjoint(long)


def test_a_warning_fails_the_test(tmp_path: Path) -> None:
    """A test whose code warns (here a DeprecationWarning) fails under the project's settings."""
    test = tmp_path / "test_warns.py"
    test.write_text("import warnings\n\ndef test_warns():\n    warnings.warn('old', DeprecationWarning)\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", f"--rootdir={REPO}",
         "-c", str(REPO / "pyproject.toml"), str(test)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 1 and "1 failed" in done.stdout, done.stdout + done.stderr
    assert "DeprecationWarning: old" in done.stdout


def test_the_default_run_uses_every_core_and_the_long_pass_one_process() -> None:
    """The default run is spread over the cores (pytest-xdist, in the test extra), keeping each
    xdist_group on one worker; .ci/run's ci_long pass runs each load run alone (-n 0)."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    addopts = shlex.split(pyproject["tool"]["pytest"]["ini_options"]["addopts"])
    assert addopts[addopts.index("-n") + 1] == "auto" and addopts[addopts.index("--dist") + 1] == "loadgroup"
    assert any(req.startswith("pytest-xdist") for req in pyproject["project"]["optional-dependencies"]["test"])
    assert "\npython -m pytest -m ci_long -n 0 " in (REPO / ".ci" / "run").read_text()


def test_auto_starts_two_workers_per_usable_core_or_the_number_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """``-n auto`` (tests/conftest.py's pytest_xdist_auto_num_workers): the tests mostly wait on
    processes and servers, so two workers per core the run may use; PYTEST_XDIST_AUTO_NUM_WORKERS
    sets the number; a value that is no number of workers is a usage error, not ignored."""
    from tests import conftest

    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3, 5})
    assert conftest.pytest_xdist_auto_num_workers(None) == 6  # type: ignore[arg-type]
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "3")
    assert conftest.pytest_xdist_auto_num_workers(None) == 3  # type: ignore[arg-type]
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", bad)
        with pytest.raises(pytest.UsageError, match="PYTEST_XDIST_AUTO_NUM_WORKERS"):
            conftest.pytest_xdist_auto_num_workers(None)  # type: ignore[arg-type]


def test_the_default_run_starts_the_hooks_number_of_workers() -> None:
    """pytest-xdist asks the project's hook under the default ``-n auto``: pinned to one core
    (taskset) the run starts 2 workers, not xdist's own one per core."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_XDIST_AUTO_NUM_WORKERS", "PYTEST_ADDOPTS")}
    core = min(os.sched_getaffinity(0))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "tests/test_typing.py::test_the_package_ships_py_typed"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
        preexec_fn=lambda: os.sched_setaffinity(0, {core}),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "created: 2/2 workers" in done.stdout, done.stdout


def test_cpu_per_test_and_file_is_listed_only_when_asked() -> None:
    """CHATFLOW_TEST_CPU=N lists the CPU each test used (its worker's and its children's) and the
    sums per file; unset, the run's summary has no such section. The test measured starts
    ``chatflow --version`` (about 0.1 s of CPU, all of it in the child process)."""
    test = "tests/cli/test_help.py::test_version"
    env = {k: v for k, v in os.environ.items() if k != "CHATFLOW_TEST_CPU"}
    runs = {}
    for asked in (None, "3"):
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", test],
            cwd=REPO, env=env if asked is None else {**env, "CHATFLOW_TEST_CPU": asked},
            capture_output=True, text=True, timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        runs[asked] = done.stdout
    assert "CPU by file" not in runs[None] and "CPU by test" not in runs[None], runs[None]
    by_file = runs["3"].split("CPU by file", 1)[1]
    assert "tests/cli/test_help.py" in by_file.split("CPU by test", 1)[0], runs["3"]
    line = next(ln for ln in by_file.split("CPU by test", 1)[1].splitlines() if test in ln)
    assert float(line.split()[0]) >= 0.05, line  # the child's CPU is counted
