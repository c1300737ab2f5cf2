"""The local model's pure parts: the keep-alive setting, the crash message, the server command."""

from __future__ import annotations

import importlib.util
import signal
from pathlib import Path

import pytest

from chatflow_cli.config import DEFAULT_LOCAL_KEEP_ALIVE, KEEP_ALIVE_ENV, load_settings
from chatflow_cli.core import local
from chatflow_cli.core.errors import ConfigError, ExitStatus, LocalModelError, UsageError
from chatflow_cli.core.local import LocalServer, LocalServerCrashedError, crash_error, parse_keep_alive


@pytest.mark.parametrize(("text", "seconds"), [
    ("0", 0.0), ("300", 300.0), (" 90 ", 90.0), ("2.5", 2.5), ("90s", 90.0), ("5m", 300.0), ("1h", 3600.0),
    ("1h30m", 5400.0), ("1m 30s", 90.0), ("500ms", 0.5), ("1d", 86400.0), ("5M", 300.0), (0, 0.0), (45, 45.0),
    (1.5, 1.5),
])
def test_keep_alive_accepts_seconds_and_durations(text, seconds) -> None:
    assert parse_keep_alive(text) == seconds


@pytest.mark.parametrize("bad", ["", "  ", "-1", "-5m", "5 minutes", "m", "5x", "1h30", "inf", "nan", True, -3, [1]])
def test_keep_alive_refuses_what_is_not_a_duration(bad) -> None:
    with pytest.raises(UsageError):
        parse_keep_alive(bad)


def test_keep_alive_default_env_and_config_file(tmp_path: Path) -> None:
    assert DEFAULT_LOCAL_KEEP_ALIVE == local.DEFAULT_KEEP_ALIVE == 300.0
    assert KEEP_ALIVE_ENV == local.KEEP_ALIVE_ENV
    cfg = tmp_path / "config.toml"
    cfg.write_text("")
    env = {"CHATFLOW_HOME": str(tmp_path / "home"), "CHATFLOW_CONFIG": str(cfg)}
    s = load_settings(env=env)
    assert (s.local_keep_alive, s.sources["local_keep_alive"]) == (300.0, "default")
    cfg.write_text('local_keep_alive = "10m"\n')
    s = load_settings(env=env)
    assert (s.local_keep_alive, s.sources["local_keep_alive"]) == (600.0, "file")
    cfg.write_text("local_keep_alive = 0\n")
    assert load_settings(env=env).local_keep_alive == 0.0
    s = load_settings(env={**env, KEEP_ALIVE_ENV: "30s"})
    assert (s.local_keep_alive, s.sources["local_keep_alive"]) == (30.0, "env")


def test_a_bad_keep_alive_is_a_config_error_naming_where(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text('model = "local"\nlocal_keep_alive = "soon"\n')
    env = {"CHATFLOW_HOME": str(tmp_path / "home"), "CHATFLOW_CONFIG": str(cfg)}
    with pytest.raises(ConfigError, match=r"line 2: local_keep_alive: not a duration: 'soon'"):
        load_settings(env=env)
    cfg.write_text("")
    with pytest.raises(ConfigError, match=r"CHATFLOW_LOCAL_KEEP_ALIVE: not a duration"):
        load_settings(env={**env, KEEP_ALIVE_ENV: "-1"})


def test_a_bad_keep_alive_in_the_environment_exits_9(chatflow) -> None:
    r = chatflow("chat", "hi", env={KEEP_ALIVE_ENV: "later"})
    assert r.returncode == 9, r
    assert r.stderr_lines == ["chatflow: error: CHATFLOW_LOCAL_KEEP_ALIVE: not a duration: 'later' "
                              "(use seconds, or e.g. 5m, 1h, 90s)"]


def test_config_show_reports_the_keep_alive(chatflow) -> None:
    data = chatflow("config", "show", "--json", env={KEEP_ALIVE_ENV: "2m"}).json()
    assert (data["local_keep_alive"], data["local_keep_alive_source"]) == (120.0, "env")


def test_the_crash_message_is_one_line_with_signal_output_and_advice() -> None:
    tail = ("llama_model_loader: loaded meta data\nload_tensors: CPU model buffer size = 87 MiB\n"
            "Fatal Python error: Illegal instruction\n\nCurrent thread 0x00007f (most recent call first):\n"
            '  File "/x/llama_cpp/llama.py", line 640 in eval\n  File "/x/app.py", line 3 in <module>\n')
    err = crash_error(-int(signal.SIGILL), tail, phase="answering")
    assert isinstance(err, LocalServerCrashedError) and isinstance(err, LocalModelError)
    assert err.exit_code == ExitStatus.PROVIDER == 5
    assert "\n" not in err.message
    assert err.message.startswith("the local model server crashed while answering: killed by SIGILL "
                                  "(illegal instruction); its output ends: ")
    # llama.cpp's start-up chatter is not worth showing: with nothing else said, the fatal line is
    assert "its output ends: 'Fatal Python error: Illegal instruction'" in err.message
    assert "load_tensors" not in err.message and "llama_model_loader" not in err.message
    said = crash_error(-int(signal.SIGILL), "load_tensors: x = 1\nRuntimeError: boom in decode\n"
                       + tail[tail.index("Fatal"):], phase="answering")
    assert "its output ends: 'RuntimeError: boom in decode'" in said.message  # what it said last
    assert "Fatal Python error" not in said.message  # the signal is named already
    assert "File " not in err.message and "Current thread" not in err.message
    assert "GGML_NATIVE=OFF" in err.message
    exited = crash_error(1, "loading\nValueError: Failed to load model from file: x.gguf\n", phase="starting",
                         log_path="/d/local/server-1.log")
    assert exited.message.startswith("the local model server crashed while starting: exited with code 1; "
                                     "its output ends: 'ValueError: Failed to load model from file: x.gguf'")
    assert exited.message.endswith("send the message again to start a new one (/retry in the REPL); "
                                   "its log: /d/local/server-1.log")
    silent = crash_error(-int(signal.SIGKILL), "", phase="answering")
    assert "killed by SIGKILL" in silent.message and "it wrote nothing" in silent.message
    assert "out of memory?" in silent.message


def test_the_embedded_model_is_started_with_extra_buffer_types_off(tmp_path: Path) -> None:
    """The command every private and warm server runs: llama.cpp's app behind chatflow's
    entry module, told to load the model with ``use_extra_bufts = False`` (the entry
    module's side is checked on the real model in tests/core/test_local.py)."""
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    argv = LocalServer(model_path=gguf, app="").command(8080, 7)
    assert argv[1:3] == ["-m", "chatflow_cli.local_server"]
    assert argv[argv.index("--chatflow-extra-bufts") + 1] == "off"
    assert "--chatflow-app" not in argv
    assert argv[argv.index("--host") + 1] == "127.0.0.1"


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed")
@pytest.mark.parametrize("extra", [[], ["--interrupt_requests", "true"]])
def test_the_server_never_interrupts_a_reply_for_a_new_request(extra: list[str]) -> None:
    """llama-cpp-python's default cuts the reply being streamed when another request comes
    (``interrupt_requests``): chatflow's server runs with it off whatever the options say,
    so a second chatflow process waits for its turn (checked on the real model in
    tests/cli/test_local_model_limits.py)."""
    from chatflow_cli.local_server import llama_settings

    server, [model] = llama_settings(["--model", "m.gguf", "--n_ctx", "2048", *extra])
    assert server.interrupt_requests is False
    assert model.model == "m.gguf" and model.n_ctx == 2048


def test_a_failed_stream_ends_with_an_error_event_naming_the_context() -> None:
    from chatflow_cli.local_server import _events_or_error, stream_error

    def over() -> object:
        yield {"choices": []}
        raise ValueError("Requested tokens (3012) exceed context window of 2048")

    events = list(_events_or_error(over))
    assert events[0] == {"choices": []}
    error = events[1]["error"]
    assert (error["code"], error["prompt_tokens"], error["n_ctx"]) == ("context_length_exceeded", 3012, 2048)
    assert "3012 tokens" in error["message"]
    other = stream_error(RuntimeError("the template failed"))["error"]
    assert other["type"] == "server_error" and other["message"] == "RuntimeError: the template failed"
