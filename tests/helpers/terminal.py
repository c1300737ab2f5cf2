"""The real ``chatflow`` process on a pseudo-terminal through pexpect, for one-shot commands.

``spawn_chatflow(args, cols=100, rows=30, **env)`` starts it with ``TERM=xterm-256color``,
colours on (``NO_COLOR`` removed unless given) and this checkout on ``PYTHONPATH``;
``screen_lines(raw)`` turns a transcript into its visible lines. The REPL, which redraws,
is read through the VT emulator instead (tests/helpers/pty_driver.py).
"""

from __future__ import annotations

import os
import re
from typing import Any

import pytest

from tests.conftest import COMMAND, REPO

#: What the REPL's prompt (prompt-toolkit) writes when it starts reading keys: bracketed paste
#: on. Keys sent before it may reach the REPL while no prompt reads them.
PROMPT_READS_KEYS = b"\x1b[?2004h"


def pexpect_module() -> Any:
    """pexpect, or skip the test where it is not installed."""
    return pytest.importorskip("pexpect")


def spawn_chatflow(args: list[str], *, cols: int = 100, rows: int = 30, timeout: float = 30,
                   encoding: str | None = None, **env: str) -> Any:
    """``chatflow ARGS`` on a ``rows`` x ``cols`` pseudo-terminal; ``env`` adds variables.

    With ``encoding`` the child reads and writes text (undecodable bytes replaced), else bytes.
    """
    pexpect = pexpect_module()
    full = dict(os.environ, TERM="xterm-256color")
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))
    full.pop("NO_COLOR", None)
    full.pop("COLUMNS", None)
    full.update(env)
    extra: dict[str, Any] = {"encoding": encoding, "codec_errors": "replace"} if encoding else {}
    return pexpect.spawn(COMMAND[0], [*COMMAND[1:], *args], env=full, timeout=timeout,
                         dimensions=(rows, cols), **extra)


def screen_lines(raw: bytes | str) -> list[str]:
    """The visible lines of a terminal transcript (no escapes, no carriage returns)."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    return text.replace("\r", "").split("\n")
