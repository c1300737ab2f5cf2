"""Sessions in and out of chatflow: export formats, import readers, and the import itself.

* :func:`~chatflow_cli.core.interop.exporter.export_lines` writes a stored session as
  ``chatflow`` (lossless JSON Lines), ``md`` (a Markdown transcript that imports back) or
  ``openai`` (Chat Completions message lists);
* :func:`~chatflow_cli.core.interop.sources.read_source` reads ``chatflow``, ``md``,
  ``openai``, llm's ``logs.db`` or a Claude Code session file into
  :class:`~chatflow_cli.core.interop.records.ImportedSession` values, detecting the format
  when none is given, before anything is written.
"""

from __future__ import annotations

from .exporter import export_lines, session_header
from .records import EXPORT_FORMATS, IMPORT_FORMATS, ImportedSession, ImportedTurn
from .sources import detect_format, read_source

__all__ = [
    "EXPORT_FORMATS",
    "IMPORT_FORMATS",
    "ImportedSession",
    "ImportedTurn",
    "detect_format",
    "export_lines",
    "read_source",
    "session_header",
]
