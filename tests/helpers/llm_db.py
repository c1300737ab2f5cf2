"""Copies of llm's ``logs.db`` fixtures changed by one SQL statement, for the importer's error tests."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path


def corrupted(tmp_path: Path, source: Path, sql: str) -> Path:
    """``source`` copied to ``tmp_path / "logs.db"`` with ``sql`` run on the copy."""
    db = tmp_path / "logs.db"
    shutil.copy(source, db)
    conn = sqlite3.connect(db)
    conn.execute(sql)
    conn.commit()
    conn.close()
    return db
