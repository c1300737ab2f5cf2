"""The command-line tests' helpers live in ``tests/conftest.py`` so every folder can use them.

The fixtures ``chatflow``, ``provider`` and ``config_file`` (and the autouse
``isolated_home``) come from there; these names are re-exported for the tests that
import them directly (``from tests.cli.conftest import COMMAND, REPO``).
"""

from __future__ import annotations

from tests.conftest import BIN, COMMAND, REPO, Result, db_path, run_chatflow  # noqa: F401
