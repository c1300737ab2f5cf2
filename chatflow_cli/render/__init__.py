"""Renderers for chatflow's command line and REPL: safe text, tables, turns, events, JSON.

One room per concern:

* :mod:`~chatflow_cli.render.text`: the one terminal sanitizer (:func:`safe_text`,
  :class:`TextSanitizer`), :func:`dumps`, folding, plurals, ages;
* :mod:`~chatflow_cli.render.lines`: :class:`Lines`, styled text without Rich;
* :mod:`~chatflow_cli.render.shapes`: the JSON shapes (events, summaries, turns);
* :mod:`~chatflow_cli.render.sessions`: the one sessions table, and the agents table;
* :mod:`~chatflow_cli.render.markdown`: the Markdown layout;
* :mod:`~chatflow_cli.render.turns`: turns and events for people;
* :mod:`~chatflow_cli.render.printer`: the reply as it streams (``chat``);
* :mod:`~chatflow_cli.render.styles`: private copies of Rich's styles (imports Rich).
* :mod:`~chatflow_cli.render.markdown_stream`: the reply's Markdown as it streams
  (imports Rich; not imported here), over :mod:`~chatflow_cli.render.markdown_blocks` (the
  block scanner) and :mod:`~chatflow_cli.render.unpadded` (Rich lines without padding).

Nothing here imports ``rich.markdown`` until Markdown is rendered on a terminal, so
``sessions show`` into a pipe stays fast.
"""

from __future__ import annotations

from .lines import Lines
from .markdown import has_markdown, markdown_lines, markdown_renderable, parse_markdown
from .printer import ReplyPrinter
from .sessions import agents_lines, sessions_lines
from .shapes import EVENT_SCHEMA, event_json, stored_event_json, summary_dict, turn_dict, turn_handoffs, turn_interrupted
from .text import (
    BIDI_CONTROLS,
    FOLD_CHARS,
    FOLD_LINES,
    LINE_SEPARATORS,
    TextSanitizer,
    dumps,
    fold,
    format_age,
    plural,
    pretty_json_text,
    safe_text,
)
from .turns import (
    AgentVersionMarks,
    agent_changed_text,
    event_text,
    mount_text,
    mounts_text,
    reply_cut_text,
    reply_note,
    turn_renderables,
    turn_versions,
)

__all__ = [
    "AgentVersionMarks",
    "BIDI_CONTROLS",
    "EVENT_SCHEMA",
    "FOLD_CHARS",
    "FOLD_LINES",
    "LINE_SEPARATORS",
    "Lines",
    "ReplyPrinter",
    "TextSanitizer",
    "agent_changed_text",
    "agents_lines",
    "dumps",
    "event_json",
    "event_text",
    "fold",
    "format_age",
    "has_markdown",
    "markdown_lines",
    "markdown_renderable",
    "mount_text",
    "mounts_text",
    "parse_markdown",
    "plural",
    "pretty_json_text",
    "reply_cut_text",
    "reply_note",
    "safe_text",
    "sessions_lines",
    "stored_event_json",
    "summary_dict",
    "turn_dict",
    "turn_handoffs",
    "turn_interrupted",
    "turn_renderables",
    "turn_versions",
]
