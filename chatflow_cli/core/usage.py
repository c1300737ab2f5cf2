"""The one shape of a turn's token usage, as stored in ``turn.completed`` and exported.

A turn's usage is ``{"prompt_tokens", "completion_tokens", "total_tokens"}`` (OpenAI's Chat
Completions names, which chatflow speaks; whole token counts), plus ``"reasoning_tokens"``
when the provider reports how many of the completion tokens were reasoning
(``completion_tokens_details.reasoning_tokens``). A count nobody reported is left out, and
a usage with no count at all is ``None`` (``null``): unknown, never a false 0.

:func:`normalise_usage` reads every shape chatflow has stored or imports: its own (above),
the older ``{0, 0, 0}`` it wrote for a server that reports no usage (read as unknown: no
chat request has an empty prompt), and ``input_tokens``/``output_tokens`` (llm's columns,
Anthropic's and Claude Code's ``usage``, whose cache reads and writes are input too, and
are kept beside the prompt count they are part of). Every
writer of a turn's usage (the Runner, the importers through ``complete_turn``) and every
reader that shows one goes through it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["normalise_usage"]

#: input counts that add up to the prompt (Anthropic counts cache reads and writes apart)
_INPUT_KEYS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
#: keys read into the shape's counts (any other key is kept as it is)
_READ_KEYS = frozenset({"prompt_tokens", "completion_tokens", "total_tokens", "reasoning_tokens", "input_tokens",
                        "output_tokens"})


def _count(value: Any) -> int | None:
    """A whole, non-negative token count, else None (unknown)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and value >= 0 else None


def normalise_usage(data: Any) -> dict[str, int] | None:
    """``data`` (a usage mapping in any shape above, or None) in the one stored shape.

    ``prompt_tokens`` is ``prompt_tokens``, else the sum of ``input_tokens`` and the cache
    counts; ``completion_tokens`` is ``completion_tokens``, else ``output_tokens``;
    ``total_tokens`` is the one given, else their sum when both are known;
    ``reasoning_tokens`` is ``reasoning_tokens`` or ``completion_tokens_details.reasoning_tokens``.
    A count that is missing, null, negative, fractional or not a number is left out. Any
    other key (a provider's ``completion_tokens_details``, Anthropic's cache counts, a
    caller's own ``cost``) is kept as it is: nothing given is lost. Returns None when there
    is nothing else and no count is known, or prompt and completion are both 0 (what
    chatflow stored, before, for a server that reported no usage).
    """
    if not isinstance(data, Mapping):
        return None
    out: dict[str, int] = {}
    prompt = _count(data.get("prompt_tokens"))
    if prompt is None:
        inputs = [c for c in (_count(data.get(k)) for k in _INPUT_KEYS) if c is not None]
        prompt = sum(inputs) if inputs else None
    completion = _count(data.get("completion_tokens"))
    if completion is None:
        completion = _count(data.get("output_tokens"))
    total = _count(data.get("total_tokens"))
    if total is None and prompt is not None and completion is not None:
        total = prompt + completion
    details = data.get("completion_tokens_details")
    reasoning = _count(data.get("reasoning_tokens"))
    if reasoning is None and isinstance(details, Mapping):
        reasoning = _count(details.get("reasoning_tokens"))
    extra = {k: v for k, v in data.items() if k not in _READ_KEYS}  # a provider's details, a caller's cost...
    if not prompt and not completion and not total:
        return extra or None  # no count known, or the old false {0, 0, 0}
    for key, value in (("prompt_tokens", prompt), ("completion_tokens", completion), ("total_tokens", total),
                       ("reasoning_tokens", reasoning)):
        if value is not None:
            out[key] = value
    return {**out, **extra}
