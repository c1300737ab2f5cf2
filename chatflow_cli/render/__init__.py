"""Renderers for chatflow's command line and REPL: safe text, tables, turns, events, JSON.

One room per concern:

* :mod:`~chatflow_cli.render.text`: the one terminal sanitizer (:func:`safe_text`,
  :class:`TextSanitizer`), :func:`dumps`, folding, plurals, ages;
* :mod:`~chatflow_cli.render.lines`: :class:`Lines`, styled text without Rich;
* :mod:`~chatflow_cli.render.shapes`: the JSON shapes (events, summaries, turns);
* :mod:`~chatflow_cli.render.sessions`: the one sessions table, and the agents table;
* :mod:`~chatflow_cli.render.markdown`: the Markdown layout;
* :mod:`~chatflow_cli.render.turns`: turns and events for people, and the reply as it
  streams (``chat``);
* :mod:`~chatflow_cli.render.styles`: private copies of Rich's styles (imports Rich).
* :mod:`~chatflow_cli.render.markdown_stream`: the reply's Markdown as it streams
  (imports Rich; not imported here), over :mod:`~chatflow_cli.render.markdown_blocks` (the
  block scanner) and :mod:`~chatflow_cli.render.unpadded` (Rich lines without padding).

Nothing here imports ``rich.markdown`` until Markdown is rendered on a terminal, so
``sessions show`` into a pipe stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .lines import Lines
    from .markdown import has_markdown, markdown_lines, markdown_renderable, parse_markdown
    from .sessions import agents_lines, sessions_lines
    from .shapes import (
        EVENT_SCHEMA,
        event_json,
        stored_event_json,
        summary_dict,
        turn_dict,
        turn_handoffs,
        turn_interrupted,
    )
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
        ReplyPrinter,
        agent_changed_text,
        event_text,
        mount_text,
        mounts_text,
        reply_cut_text,
        reply_note,
        turn_renderables,
        turn_versions,
    )

#: Each name of :data:`__all__` and the module it comes from, imported on first use: a
#: command imports the renderers it uses, not all of them (``chat`` needs no table).
_EXPORTS = {
    "AgentVersionMarks": "turns",
    "BIDI_CONTROLS": "text",
    "EVENT_SCHEMA": "shapes",
    "FOLD_CHARS": "text",
    "FOLD_LINES": "text",
    "LINE_SEPARATORS": "text",
    "Lines": "lines",
    "ReplyPrinter": "turns",
    "TextSanitizer": "text",
    "agent_changed_text": "turns",
    "agents_lines": "sessions",
    "dumps": "text",
    "event_json": "shapes",
    "event_text": "turns",
    "fold": "text",
    "format_age": "text",
    "has_markdown": "markdown",
    "markdown_lines": "markdown",
    "markdown_renderable": "markdown",
    "mount_text": "turns",
    "mounts_text": "turns",
    "parse_markdown": "markdown",
    "plural": "text",
    "pretty_json_text": "text",
    "reply_cut_text": "turns",
    "reply_note": "turns",
    "safe_text": "text",
    "sessions_lines": "sessions",
    "stored_event_json": "shapes",
    "summary_dict": "shapes",
    "turn_dict": "shapes",
    "turn_handoffs": "shapes",
    "turn_interrupted": "shapes",
    "turn_renderables": "turns",
    "turn_versions": "turns",
}

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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
