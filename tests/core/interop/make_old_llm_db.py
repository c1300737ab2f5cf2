"""Write ``data/llm-0.27-logs.db`` again with an old llm on ``PYTHONPATH`` (see data/README.md)."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests.helpers.fakeserver import FakeServer  # noqa: E402
from tests.core.interop.conftest import run_llm_session, script_replies  # noqa: E402


def main(target: str) -> None:
    with tempfile.TemporaryDirectory() as tmp, FakeServer() as server:
        script_replies(server)
        home = Path(tmp) / "home"
        run_llm_session(home, server.url, [sys.executable, "-m", "llm"])
        shutil.copy(home / "logs.db", target)


if __name__ == "__main__":
    main(sys.argv[1])
