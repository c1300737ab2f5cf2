"""``chatflow_cli.core.sqlite_store.SQLiteSessionStore``: the SQLite store under its first import path.

The store lives in :mod:`chatflow_cli.core.memory.sqlite` and its schema in
:mod:`chatflow_cli.core.memory.schema`; this module re-exports them for code that imports
from here.
"""

from __future__ import annotations

from .memory.schema import SCHEMA_VERSION
from .memory.sqlite import SQLiteSessionStore

__all__ = ["SCHEMA_VERSION", "SQLiteSessionStore"]
