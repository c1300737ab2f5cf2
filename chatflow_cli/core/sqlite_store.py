"""``chatflow_cli.core.sqlite_store.SQLiteSessionStore``: the SQLite store under its first import path.

The store lives in the package :mod:`chatflow_cli.core.memory.sqlite` (its schema in
:mod:`chatflow_cli.core.memory.sqlite.schema`); this module re-exports them for code that
imports from here.
"""

from __future__ import annotations

from .memory.sqlite import SCHEMA_VERSION, SQLiteSessionStore

__all__ = ["SCHEMA_VERSION", "SQLiteSessionStore"]
