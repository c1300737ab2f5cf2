"""Token counts of messages, the context budget of a model, and the token-budget window.

Counting
--------
Every stored message carries a token count (``Message.tokens``), written when the message is
stored, so loading a window never re-reads or re-counts older history:

* a MODEL reply takes the provider's ``usage.completion_tokens`` of the request that
  produced it when the provider reported usage (exact for the reply's text and tool calls);
* every other message, and a reply with no usage, takes :func:`estimate_tokens`.

The estimate counts characters by class, with no tokenizer: ASCII letters 1/3 token each,
digits 1 each (many tokenizers, SmolLM2's and Llama 3's among them, split numbers into
digits), whitespace 1/4, other ASCII symbols 3/4, and 2/3 token per UTF-8 byte of anything
non-ASCII; plus :data:`MESSAGE_OVERHEAD` tokens a message for the chat template's role
markers, and, per tool call, its name, arguments and :data:`TOOL_CALL_OVERHEAD`.

Its margin, measured against SmolLM2's tokenizer (llama.cpp, 1,500-character chunks of
this repository's English README and design documents, Portuguese prose, Python source,
JSON, Chinese, Japanese, Russian, emoji and runs of numbers;
``python tests/benchmarks/bench_token_estimate.py``): it never undercounts by more than
:data:`ESTIMATE_MARGIN` (10 %; the worst measured is 7.5 %, runs of digits), and overcounts ordinary prose and code by about 1.4x
(median), so a window chosen by the estimate fits. Random identifiers are the exception:
hexadecimal and UUIDs undercount by up to 20 %, base64 by up to 46 %.
``tests/core/test_tokens.py`` checks the 10 % bound on that corpus with the real tokenizer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from .messages import Message, Role

__all__ = [
    "ESTIMATE_MARGIN",
    "MESSAGE_OVERHEAD",
    "MODEL_CONTEXT_TOKENS",
    "TOOL_CALL_OVERHEAD",
    "ContextBudget",
    "context_budget",
    "estimate_text_tokens",
    "estimate_tokens",
    "message_tokens",
    "model_context_tokens",
    "reply_tokens",
    "select_window",
    "short_count",
]

#: Tokens a message costs beyond its text: the chat template's role markers and separators.
MESSAGE_OVERHEAD = 5
#: Tokens a tool call costs beyond its name and arguments (its id, type and JSON framing).
TOOL_CALL_OVERHEAD = 12
#: The largest undercount of :func:`estimate_tokens` measured on ordinary text (see above).
ESTIMATE_MARGIN = 0.10

#: Context sizes (tokens) of common models, matched by prefix of the model name (longest
#: prefix wins; a provider prefix such as ``openai/`` is ignored).
MODEL_CONTEXT_TOKENS: dict[str, int] = {
    "local": 2048,
    "smollm2": 8192,
    "gpt-4o": 128_000,
    "gpt-4o-mini": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-4-turbo": 128_000,
    "gpt-4-1106": 128_000,
    "gpt-4-0125": 128_000,
    "gpt-4-vision": 128_000,
    "gpt-4-32k": 32_768,
    "gpt-4": 8192,
    "gpt-3.5-turbo": 16_385,
    "gpt-5": 400_000,
    "o1": 200_000,
    "o1-mini": 128_000,
    "o1-preview": 128_000,
    "o3": 200_000,
    "o4-mini": 200_000,
    "claude": 200_000,
    "claude-2": 100_000,
    "claude-instant": 100_000,
    "llama3.2": 131_072,
    "llama3.1": 131_072,
    "llama3.3": 131_072,
    "llama3": 8192,
    "qwen2.5": 32_768,
    "mistral": 32_768,
    "gemma2": 8192,
    "gemma3": 131_072,
    "phi3": 4096,
    "phi3.5": 131_072,
}

_LETTERS = re.compile(r"[A-Za-z]")
_DIGITS = re.compile(r"[0-9]")
_SPACES = re.compile(r"[\t\n\v\f\r ]")


def estimate_text_tokens(text: str) -> int:
    """The estimated token count of ``text`` (see the module notes; 0 for ``""``)."""
    if not text:
        return 0
    letters = len(_LETTERS.findall(text))
    digits = len(_DIGITS.findall(text))
    spaces = len(_SPACES.findall(text))
    if text.isascii():
        other_ascii = len(text) - letters - digits - spaces
        non_ascii_bytes = 0
    else:
        ascii_count = sum(1 for ch in text if ch < "\x80")
        other_ascii = ascii_count - letters - digits - spaces
        non_ascii_bytes = len(text.encode("utf-8", "surrogatepass")) - ascii_count
    twelfths = 4 * letters + 12 * digits + 3 * spaces + 9 * other_ascii + 8 * non_ascii_bytes
    return -(-twelfths // 12)


def reply_tokens(usage: object, *, reasoning: bool = False) -> int | None:
    """The tokens a model reply costs in the context the next request carries, from its
    request's ``usage`` (a :class:`~chatflow_cli.core.model.Usage` or None): the
    ``completion_tokens`` minus the ``reasoning_tokens`` the provider reports among them
    (reasoning is never sent back), plus :data:`MESSAGE_OVERHEAD`. None (the caller
    estimates the stored message instead) when there is no usage or no completion count,
    when nothing is left after the reasoning, or when the reply came with reasoning text
    but the provider said nothing of its tokens (they may be inside ``completion_tokens``,
    as llama.cpp's server counts them).
    """
    completion = int(getattr(usage, "completion_tokens", 0) or 0)
    spent = int(getattr(usage, "reasoning_tokens", 0) or 0)
    if completion <= 0 or (reasoning and not spent):
        return None
    sent = completion - spent
    return sent + MESSAGE_OVERHEAD if sent > 0 else None


def estimate_tokens(message: Message) -> int:
    """The estimated token count of ``message`` as sent to a model (text, tool calls,
    attachments: an image by OpenAI's tile rule, :func:`~chatflow_cli.core.attachments.image_tokens`;
    overhead).

    Reasoning text is not counted: it is never sent back to a model.
    """
    count = MESSAGE_OVERHEAD + estimate_text_tokens(message.content or "")
    for call in message.tool_calls:
        count += TOOL_CALL_OVERHEAD + estimate_text_tokens(call.name) + estimate_text_tokens(call.arguments)
    if message.role is Role.TOOL:
        count += estimate_text_tokens(message.tool_call_id or "")
    if message.attachments:
        from .attachments import attachment_tokens

        count += sum(attachment_tokens(a, estimate_text_tokens) for a in message.attachments)
    return count


def message_tokens(message: Message) -> int:
    """``message.tokens`` when it was counted (stored), else :func:`estimate_tokens`."""
    tokens = message.tokens
    return tokens if tokens is not None else estimate_tokens(message)


def short_count(tokens: int) -> str:
    """A token count for a status line: ``950``, ``6.1k``, ``128k``, ``1.0M``."""
    if tokens < 1000:
        return str(tokens)
    if tokens < 100_000:
        return f"{tokens / 1000:.1f}k"
    if tokens < 1_000_000:
        return f"{tokens // 1000}k"
    return f"{tokens / 1_000_000:.1f}M"


def model_context_tokens(model: str | None) -> int | None:
    """The context size of ``model`` from :data:`MODEL_CONTEXT_TOKENS`, or None when unknown."""
    if not model:
        return None
    name = model.lower().rsplit("/", 1)[-1]
    best: tuple[int, int] | None = None
    for prefix, size in MODEL_CONTEXT_TOKENS.items():
        if name.startswith(prefix) and (best is None or len(prefix) > best[0]):
            best = (len(prefix), size)
    return best[1] if best is not None else None


@dataclass(frozen=True, slots=True)
class ContextBudget:
    """How many tokens of history a request may carry.

    ``context``: the model's context size (tokens); ``reserve``: tokens kept free for the
    reply; ``tokens``: the budget for the messages sent, ``context - reserve`` (at least 1);
    ``source``: where ``context`` came from (``"flag"``, ``"config"``, ``"local"`` or
    ``"table"``).
    """

    context: int
    reserve: int
    source: str

    @property
    def tokens(self) -> int:
        return max(1, self.context - self.reserve)


def context_budget(
    model: str | None,
    *,
    max_context_tokens: int | None = None,
    configured: int | None = None,
    local_n_ctx: int | None = None,
    reply_tokens: int | None = None,
) -> ContextBudget | None:
    """The :class:`ContextBudget` of a session talking to ``model``, or None when no size is known.

    The context size is, first found: ``max_context_tokens`` (the ``--max-context-tokens``
    flag), ``configured`` (``max_context_tokens`` of the agent in config.toml),
    ``local_n_ctx`` (the embedded model's ``n_ctx``), the model table; with none of them
    (an unknown model) there is no token budget and the window is ``max_turns`` turns
    only. The reply reserve is ``reply_tokens`` (the request's
    ``max_tokens``) when given, else a quarter of the context, at most 4,096 tokens.

    Raises:
        ValueError: a given size is not a positive int.
    """
    for name, value in (("max_context_tokens", max_context_tokens), ("configured", configured),
                        ("local_n_ctx", local_n_ctx), ("reply_tokens", reply_tokens)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if max_context_tokens is not None:
        context, source = max_context_tokens, "flag"
    elif configured is not None:
        context, source = configured, "config"
    elif local_n_ctx is not None:
        context, source = local_n_ctx, "local"
    elif (known := model_context_tokens(model)) is not None:
        context, source = known, "table"
    else:
        return None
    reserve = reply_tokens if reply_tokens is not None else min(4096, context // 4)
    return ContextBudget(context, min(reserve, context - 1) if context > 1 else 0, source)


def select_window(
    systems: Sequence[Message], turns: Sequence[Sequence[Message]], budget: int
) -> tuple[int, int]:
    """The newest whole turns that fit ``budget`` tokens beside every SYSTEM message.

    ``turns`` are whole turns, oldest first (a turn is a USER message and everything up to
    the next one, so a tool call is never separated from its result). The newest turn is
    always kept, even when it alone (with the system messages) is over the budget: the
    caller sends it and warns (the provider is the authority on what fits; the estimate may
    overcount). Older turns are added newest first while the total stays within budget;
    the first that does not fit stops the selection (the window stays contiguous).

    Returns:
        ``(kept, tokens)``: how many of the newest turns are kept, and the tokens of the
        window (system messages included).
    """
    total = sum(message_tokens(m) for m in systems)
    kept = 0
    for msgs in reversed(turns):
        cost = sum(message_tokens(m) for m in msgs)
        if kept and total + cost > budget:
            break
        total += cost
        kept += 1
    return kept, total
