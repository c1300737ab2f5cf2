"""ServerOptions: the one value a private and a warm local server are started from."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from chatflow_cli.core.local import APP_ENV, LocalModel, LocalServer, ServerOptions, SharedLocalServer


def test_equal_settings_give_equal_values(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(APP_ENV, raising=False)
    a = ServerOptions(model_path=str(tmp_path / "m.gguf"), extra_args=["--seed", "1"])
    b = ServerOptions(model_path=tmp_path / "m.gguf", extra_args=("--seed", "1"))
    assert a == b and hash(a) == hash(b)
    assert a.model_path == tmp_path / "m.gguf" and a.extra_args == ("--seed", "1")
    assert a.python == sys.executable and a.app is None


def test_the_app_comes_from_the_environment_unless_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(APP_ENV, "tests.helpers.local_standin:create_app")
    assert ServerOptions().app == "tests.helpers.local_standin:create_app"
    assert ServerOptions(app="").app == ""  # llama.cpp's app whatever the environment says


def test_the_identity_survives_the_state_file(tmp_path: Path) -> None:
    """A warm server is reused when the identity read back from its JSON state file equals
    the one computed now: a tuple of extra arguments must compare equal after the round trip."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    options = ServerOptions(extra_args=("--seed", "1"), n_threads=2, app="")
    stored = json.loads(json.dumps(options.identity(model)))
    assert stored == options.identity(model)
    assert stored == {"model": str(model.resolve()), "alias": "local", "chat_format": "chatml-function-calling",
                      "n_ctx": 2048, "n_threads": 2, "extra_args": ["--seed", "1"], "extra_bufts": False,
                      "app": "", "python": sys.executable}
    assert options.identity(model) != ServerOptions(extra_args=("--seed", "2"), n_threads=2, app="").identity(model)


def test_argv_puts_chatflow_options_first_and_extra_args_last(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    options = ServerOptions(python="/py", alias="smol", n_ctx=512, n_threads=3, extra_args=("--seed", "7"),
                            extra_bufts=True, app="pkg.mod:make")
    assert options.argv(model, host="127.0.0.1", port=8080, chatflow_options=["--chatflow-watch-fd", "5"]) == [
        "/py", "-m", "chatflow_cli.local_server", "--chatflow-watch-fd", "5", "--chatflow-extra-bufts", "on",
        "--chatflow-app", "pkg.mod:make", "--model", str(model), "--model_alias", "smol",
        "--chat_format", "chatml-function-calling", "--host", "127.0.0.1", "--port", "8080", "--n_ctx", "512",
        "--n_threads", "3", "--seed", "7",
    ]


def test_both_servers_take_the_value_or_its_fields(tmp_path: Path) -> None:
    options = ServerOptions(alias="smol", startup_timeout=5.0, app="")
    private = LocalServer(options, startup_timeout=9.0)
    warm = SharedLocalServer(options, data_dir=tmp_path, keep_alive=60, n_ctx=1024)
    assert private.options == ServerOptions(alias="smol", startup_timeout=9.0, app="") and private.model == "smol"
    assert warm.options == ServerOptions(alias="smol", startup_timeout=5.0, n_ctx=1024, app="")
    assert LocalServer(alias="smol", startup_timeout=5.0, app="").options == options
    assert LocalModel(options, keep_alive=0).server.options == options
    assert LocalModel(options, keep_alive=60, data_dir=tmp_path).server.options == options
    with pytest.raises(TypeError):
        LocalServer(options, no_such_option=1)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="keep_alive must be > 0"):
        SharedLocalServer(options, data_dir=tmp_path, keep_alive=0)
