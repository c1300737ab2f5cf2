"""Notes for people about the context window: what a run compacted or left out, and a
context over its budget (``chat``'s stderr and the REPL say the same words)."""

from __future__ import annotations

from typing import Any

__all__ = ["context_event_note", "over_budget_note"]


def _turns(first: int, last: int) -> str:
    return f"turn {first}" if first == last else f"turns {first}..{last}"


def context_event_note(kind: str, data: dict[str, Any]) -> str | None:
    """The note for a run's ``context.compacted`` (automatic compaction), runtime
    ``context.compaction_failed``, ``context.compaction_stopped`` or ``context.dropped``
    event; None for any other event.

    ``compacted turns 1..4: 2,300 -> 180 tokens``; ``automatic compaction through turn 4
    failed: …; turns that do not fit are left out``; ``turns 1..2 left the context window
    (not summarised)``.
    """
    if kind == "context.compacted":
        through = int(data.get("through") or 0)
        return (f"compacted {_turns(1, through)}: {int(data.get('tokens_before') or 0):,} -> "
                f"{int(data.get('tokens_after') or 0):,} tokens (every turn stays in the log)")
    if kind == "context.compaction_failed":
        return (f"automatic compaction through turn {data.get('through')} failed: {data.get('error')}; "
                "turns that do not fit the context budget are left out")
    if kind == "context.compaction_stopped":
        return (f"automatic compaction through turn {data.get('through')} cannot make room: {data.get('reason')}; "
                "it is off for this session until you compact (sessions compact, /compact) or roll back, and "
                "turns that do not fit the context budget are left out")
    if kind == "context.dropped":
        return f"{_turns(int(data['first']), int(data['last']))} left the context window (not summarised)"
    return None


def over_budget_note(use: dict[str, Any], turn: int) -> str:
    """``the context (system messages, summary and turn 5) is about 695 tokens, over the
    budget of 375; it was sent whole``: what was sent, named by its parts (``use``: a
    ``RunResult.context``)."""
    parts: list[str] = []
    if use.get("system_messages"):
        parts.append("system messages" if use["system_messages"] > 1 else "system message")
    if use.get("summary_through"):
        parts.append(f"summary of turns 1..{use['summary_through']}")
    first = use.get("first_turn") or turn
    parts.append(_turns(int(first), turn))
    what = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"the context ({what}) is about {use['tokens']} tokens, over the budget of {use['budget']}; it was sent whole"
