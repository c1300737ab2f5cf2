"""One-shot ``chatflow chat`` sends its request straight through httpx2 (the ``http``
transport); ``CHATFLOW_TRANSPORT=openai`` sends it through the ``openai`` client, as the REPL
does (tests/repl/test_repl_transport.py).
Both transports give the same exit code and the same error line for every failure the fake
server can stage, and the same stored session for every success."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any, Callable

import pytest

from chatflow_cli.core.errors import ExitStatus
from tests.helpers.fakeserver import CLOSE, INVALID_JSON, FakeServer
from tests.helpers.net import free_port
from tests.helpers.wait import wait_until

SECRET = "sk-TRANSPORT-0123456789abcdef"

PROBE = r"""
import atexit, json, sys
def report():
    sys.__stderr__.write("MODULES=" + json.dumps(sorted(sys.modules)) + "\n")
atexit.register(report)
sys.argv = ["chatflow", *json.loads(sys.argv[1])]
from chatflow_cli.cli import main
main()
"""


def probe(args: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run ``chatflow ARGS`` in a fresh interpreter; its exit and the modules it had loaded."""
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=60, stdin=subprocess.DEVNULL)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("MODULES=")]
    return proc, set(json.loads(lines[-1][len("MODULES="):])) if lines else set()


def user_agent(server: FakeServer) -> str:
    return server.log[-1].headers.get("user-agent", "")


# ---------------------------------------------------------------------------------------
# which path is taken
# ---------------------------------------------------------------------------------------
def test_one_shot_chat_takes_the_http_path_and_never_imports_openai(provider: FakeServer) -> None:
    proc, modules = probe(["chat", "-s", "fast", "Say hi"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ok: Say hi\n"
    assert "openai" not in modules and "httpx2" in modules
    assert user_agent(provider).startswith("chatflow/")
    body = provider.requests[-1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("how", ["stdin", "jsonl", "rerun"])
def test_every_non_interactive_chat_takes_the_http_path(chatflow: Callable[..., Any], provider: FakeServer,
                                                        how: str) -> None:
    if how == "stdin":
        r = chatflow("chat", "-s", "piped", input="hello from a pipe\n")
    elif how == "jsonl":
        r = chatflow("chat", "-s", "lines", "--input", "jsonl", input='{"message": "one"}\n{"message": "two"}\n')
    else:
        assert chatflow("chat", "-s", "orig", "first").returncode == 0
        r = chatflow("replay", "orig", "--rerun", "--into", "copy")
    assert r.returncode == 0, r
    assert all(entry.headers.get("user-agent", "").startswith("chatflow/") for entry in provider.log)


def test_chatflow_transport_openai_sends_through_the_openai_client(provider: FakeServer) -> None:
    proc, modules = probe(["chat", "-s", "slow", "Say hi"], env={"CHATFLOW_TRANSPORT": "openai"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ok: Say hi\n"
    assert "openai" in modules
    assert user_agent(provider).startswith("OpenAI/Python")


def test_an_unknown_chatflow_transport_is_a_config_error_storing_nothing(chatflow: Callable[..., Any],
                                                                        provider: FakeServer) -> None:
    r = chatflow("chat", "-s", "never", "hi", env={"CHATFLOW_TRANSPORT": "carrier-pigeon"})
    assert r.returncode == ExitStatus.CONFIG, r
    assert r.stderr_lines == ["chatflow: error: CHATFLOW_TRANSPORT='carrier-pigeon': use openai or http"]
    assert provider.log == []
    assert chatflow("sessions", "show", "never").returncode == ExitStatus.NOT_FOUND


# ---------------------------------------------------------------------------------------
# the same outcome on both paths
# ---------------------------------------------------------------------------------------
def _text(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": text}}]}


#: name -> (stage the server's replies for one run, expected exit code). Every run retries
#: twice (openai's default), so retried failures are staged three times.
SCENARIOS: dict[str, tuple[Callable[[FakeServer], Any], int]] = {
    "401": (lambda s: s.add_error(401, message=f"Incorrect API key provided: {SECRET}"), ExitStatus.PROVIDER),
    "403": (lambda s: s.add_error(403, message="not allowed"), ExitStatus.PROVIDER),
    "404": (lambda s: s.add_error(404, message="no such model", body=None), ExitStatus.PROVIDER),
    "400": (lambda s: s.add_error(400, message="messages: bad"), ExitStatus.PROVIDER),
    "422": (lambda s: s.add_error(422, message="unprocessable"), ExitStatus.PROVIDER),
    "409-no-retry": (lambda s: s.add_error(409, message="conflict", headers={"x-should-retry": "false"}),
                     ExitStatus.PROVIDER),
    "429-retried": (lambda s: [s.add_error(429, message="slow down", headers={"retry-after-ms": "10"})
                               for _ in range(3)], ExitStatus.RATE_LIMITED),
    "500-retried": (lambda s: [s.add_error(500, body="<html><title>502 Bad Gateway</title></html>",
                                           headers={"retry-after-ms": "10"}) for _ in range(3)],
                    ExitStatus.RATE_LIMITED),
    "429-retry-after-too-long": (lambda s: s.add_error(429, headers={"Retry-After": "600"}), ExitStatus.RATE_LIMITED),
    "503-then-ok": (lambda s: [s.add_error(503, headers={"retry-after-ms": "10"}), s.add_text("fine after all")],
                    ExitStatus.SUCCESS),
    "hang": (lambda s: [s.add_hang() for _ in range(3)], ExitStatus.NETWORK),
    "slow-chunk": (lambda s: s.add_chunks([_text("Hel"), _text("lo")], delay=[0.0, 3.0]), ExitStatus.NETWORK),
    "html-page": (lambda s: s.add_html(), ExitStatus.PROVIDER),
    "plain-text": (lambda s: s.add_error(200, body="hello, this is not an API"), ExitStatus.PROVIDER),
    "empty-stream": (lambda s: s.add_error(200, body="", headers={"Content-Type": "text/event-stream"}),
                     ExitStatus.PROVIDER),
    "invalid-json": (lambda s: s.add_chunks([_text("Hel"), INVALID_JSON]), ExitStatus.PROVIDER),
    "close-mid-stream": (lambda s: s.add_chunks([_text("Hel"), CLOSE]), ExitStatus.NETWORK),
    "error-event": (lambda s: s.add_chunks([_text("Hel"), {"error": {"message": "model overloaded"}}]),
                    ExitStatus.PROVIDER),
    "stream-options-refused": (lambda s: s.add_error(400, message="Unrecognized request argument supplied: "
                                                                  "stream_options"), ExitStatus.SUCCESS),
    "not-streamed": (lambda s: s.add_error(200, body={"choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": "one piece"}}]}), ExitStatus.SUCCESS),
    "tool-call": (lambda s: [s.add_tool_calls([("call_1", "nothing", "{}")], split=2), s.add_text("done")],
                  ExitStatus.SUCCESS),
}


def _run_both(chatflow: Callable[..., Any], provider: FakeServer, stage: Callable[[FakeServer], Any],
              *args: str, base_url: str | None = None) -> dict[str, Any]:
    results = {}
    for transport in ("openai", "http"):
        stage(provider)
        session = f"s-{transport}"
        r = chatflow("chat", "-s", session, "--timeout", "1", *(["--base-url", base_url] if base_url else []),
                     *args, "hello", env={"CHATFLOW_TRANSPORT": transport, "OPENAI_API_KEY": SECRET}, timeout=120)
        shown = chatflow("sessions", "show", session, "--json", "--all")
        turns = shown.json()["turns"] if shown.returncode == 0 else None
        results[transport] = (r, turns)
    return results


def _normalized(text: str) -> str:
    """Error text with what legitimately differs between two runs removed: the session id."""
    return re.sub(r"s-(openai|http)", "s-X", text)


def _turn_shapes(turns: list[dict[str, Any]] | None) -> Any:
    if turns is None:
        return None
    drop = {"started_at", "ended_at", "created_at", "updated_at", "duration_ms"}
    return json.loads(re.sub(r"call_[0-9a-f]{24}", "call_X",
                             json.dumps([{k: v for k, v in t.items() if k not in drop} for t in turns])))


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_both_paths_map_every_outcome_alike(chatflow: Callable[..., Any], provider: FakeServer,
                                            scenario: str) -> None:
    stage, expected = SCENARIOS[scenario]
    results = _run_both(chatflow, provider, stage)
    (slow, slow_turns), (fast, fast_turns) = results["openai"], results["http"]
    assert slow.returncode == expected, slow
    assert fast.returncode == expected, fast
    assert _normalized(fast.stderr) == _normalized(slow.stderr)
    assert fast.stdout == slow.stdout
    assert SECRET not in fast.stdout + fast.stderr
    assert _turn_shapes(fast_turns) == _turn_shapes(slow_turns)
    if expected != ExitStatus.SUCCESS:
        errors = [ln for ln in fast.stderr_lines if not ln.startswith("chatflow: new session ")]  # -s announces a new one
        assert len(errors) == 1 and errors[0].startswith("chatflow: error: ")
    agents = [e.headers.get("user-agent", "")[:8] for e in provider.log]
    assert "chatflow" in agents and "OpenAI/P" in agents


def test_both_paths_map_a_refused_connection_alike(chatflow: Callable[..., Any], provider: FakeServer) -> None:
    results = _run_both(chatflow, provider, lambda s: None, base_url=f"http://127.0.0.1:{free_port()}/v1")
    (slow, _), (fast, _) = results["openai"], results["http"]
    assert slow.returncode == fast.returncode == ExitStatus.NETWORK
    assert _normalized(fast.stderr) == _normalized(slow.stderr)
    assert "cannot connect to http://127.0.0.1:" in fast.stderr and "after 3 attempts" in fast.stderr


@pytest.mark.parametrize("transport", ["http", "openai"])
def test_ctrl_c_while_the_server_has_not_answered_is_immediate(chatflow: Callable[..., Any], provider: FakeServer,
                                                              transport: str) -> None:
    """A server that never sends its status line: Ctrl-C ends the run at once (exit 130),
    the turn is kept as interrupted, and the request is not retried."""
    import signal
    import time

    from tests.cli.conftest import COMMAND, REPO

    provider.add_hang()
    provider.add_text("a retry must not be sent")
    env = dict(os.environ, PYTHONPATH=str(REPO), CHATFLOW_TRANSPORT=transport)
    proc = subprocess.Popen([*COMMAND, "chat", "-s", "hung", "--timeout", "60", "go"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
    try:
        wait_until(lambda: provider.requests, 60, "the request to reach the server")
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == ExitStatus.INTERRUPTED, (out, err)
    assert took < 2.0, f"Ctrl-C took {took:.1f} s to end the run"
    assert b"Traceback" not in err and err.count(b"chatflow: error:") == 0 and b"interrupted" in err  # Ctrl-C is no error
    [turn] = chatflow("sessions", "show", "hung", "--json", "--all").json()["turns"]
    assert turn["interrupted"] is True
    assert len(provider.requests) == 1 and provider.pending == 1, "the cancelled request was retried"
