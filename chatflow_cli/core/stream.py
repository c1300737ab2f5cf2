"""Folding a streamed Chat Completions reply, the verdict on whether it finished, and the one
shape of a turn's token usage.

Pure (no ``openai``, no I/O): every way of talking to a server -- the streamed request of
:class:`~chatflow_cli.core.model.ModelStream`, a server that answered with one JSON body,
any faster request path -- feeds its chunk dicts to one :class:`StreamAccumulator` and
reads the :class:`ModelTurn` it gives. :meth:`ModelTurn.verdict` (computed by
:func:`judge`) is the one place that decides whether a reply is complete; the Runner, the
command line, the REPL and the stores read that verdict and never re-derive it.

Verdicts (:class:`ReplyState`):

=================  ====================================================================
state              when
=================  ====================================================================
``complete``       ``finish_reason`` ``stop`` or ``tool_calls`` (or a spelling of them:
                   ``end_turn``, ``eos``, ``tool_use``…) and every tool call's arguments
                   are a JSON object
``truncated``      ``finish_reason`` ``length`` (also sent as ``max_tokens``),
                   ``content_filter``, or a reason chatflow does not know, with no tool
                   calls: the text is all there will be; it is stored as the turn's
                   reply, marked with its finish reason (an unknown reason is shown as
                   ``ended with an unknown finish reason``)
``invalid_tool_call``  a tool call whose arguments are not a complete JSON object (cut by
                   the token limit, or malformed), or that has no function name: it must
                   never run, be offered as pending, or be stored for the next request
``broken``         the stream stopped before any choice carried a finish reason
                   (connection closed, read timeout, or the body just ended, with or
                   without ``[DONE]``; the string ``"null"`` counts as none), or the
                   server ended it with ``finish_reason`` ``error`` or ``abort`` (vLLM):
                   what arrived is partial
``interrupted``    chatflow cancelled the stream (Ctrl-C, a cancel request)
=================  ====================================================================

A finish reason followed by usage-only chunks, or with no ``[DONE]`` after it, is complete.
A truncated reply whose tool calls all have complete arguments is a normal tool round (the
calls are whole; the cut came after them).

Token usage: :class:`Usage` holds the counts of a request (or, added, of a turn's requests),
and :func:`normalize_usage` gives the one shape of a turn's token usage, as stored in
``turn.completed`` and exported. A turn's usage is ``{"prompt_tokens", "completion_tokens", "total_tokens"}`` (OpenAI's Chat
Completions names, which chatflow speaks; whole token counts), plus ``"reasoning_tokens"``
when the provider reports how many of the completion tokens were reasoning
(``completion_tokens_details.reasoning_tokens``). A count nobody reported is left out, and
a usage with no count at all is ``None`` (``null``): unknown, never a false 0.

:func:`normalize_usage` reads every shape chatflow has stored or imports: its own (above),
the older ``{0, 0, 0}`` it wrote for a server that reports no usage (read as unknown: no
chat request has an empty prompt), and ``input_tokens``/``output_tokens`` (llm's columns,
Anthropic's and Claude Code's ``usage``, whose cache reads and writes are input too, and
are kept beside the prompt count they are part of). Every
writer of a turn's usage (the Runner, the importers through ``complete_turn``) and every
reader that shows one goes through it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping, Union

from .messages import Message, ToolCall

__all__ = [
    "ModelTurn",
    "ReasoningDelta",
    "ReplyState",
    "StreamAccumulator",
    "StreamDelta",
    "BROKEN_FINISH_REASONS",
    "NORMAL_FINISH_REASONS",
    "TRUNCATING_FINISH_REASONS",
    "TextDelta",
    "ToolCallDelta",
    "Usage",
    "Verdict",
    "cut_phrase",
    "judge",
    "normalize_usage",
]

#: Finish reasons that mean the reply was cut, and the name chatflow stores for each.
TRUNCATING_FINISH_REASONS: dict[str, str] = {
    "length": "length",
    "max_tokens": "length",
    "content_filter": "content_filter",
}
#: Spellings of the same normal finish reasons, stored under the OpenAI name.
_FINISH_ALIASES = {"function_call": "tool_calls", "tool_use": "tool_calls", "end_turn": "stop", "eos": "stop",
                   "stop_sequence": "stop"}
#: The finish reasons of a reply that ended normally.
NORMAL_FINISH_REASONS = frozenset({"stop", "tool_calls"})
#: Finish reasons by which the server says the reply did not finish (vLLM sends both).
BROKEN_FINISH_REASONS = frozenset({"error", "abort"})


def cut_phrase(finish_reason: str | None) -> str:
    """How a reply with ``finish_reason`` was cut, for people: ``"cut by the token limit"``,
    ``"stopped by a content filter"``, ``"ended with an unknown finish reason"`` (any
    reason but ``stop``/``tool_calls``), or ``""`` for a normal end or none."""
    if not finish_reason or finish_reason in NORMAL_FINISH_REASONS:
        return ""
    cut = TRUNCATING_FINISH_REASONS.get(finish_reason)
    if cut == "length":
        return "cut by the token limit"
    if cut == "content_filter":
        return "stopped by a content filter"
    return "ended with an unknown finish reason"


def normalize_finish_reason(value: Any) -> str | None:
    """The finish reason chatflow stores for what a server sent (``None`` for none: also
    the strings ``"null"`` and ``"none"``, which some proxies send for a JSON null)."""
    if not isinstance(value, str) or not value.strip() or value.strip().lower() in ("null", "none"):
        return None
    value = value.strip()
    return TRUNCATING_FINISH_REASONS.get(value) or _FINISH_ALIASES.get(value) or value


# --------------------------------------------------------------------------------------
# values
# --------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one model request (or, added with ``+``, of several).

    ``reasoning_tokens``: how many of ``completion_tokens`` were reasoning, as the provider
    reports it (``completion_tokens_details.reasoning_tokens``; 0 when it does not): tokens
    the reply cost but that are never sent back with the history."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    reasoning_tokens: int = 0

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.total_tokens + other.total_tokens,
            self.reasoning_tokens + other.reasoning_tokens,
        )

    def to_dict(self) -> dict[str, int]:
        """``{"prompt_tokens", "completion_tokens", "total_tokens"}``, plus ``"reasoning_tokens"``
        when the provider reported any (:func:`normalize_usage`'s shape)."""
        data = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }
        if self.reasoning_tokens:
            data["reasoning_tokens"] = self.reasoning_tokens
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> "Usage | None":
        """Read a usage object; ``None`` for ``None``. Missing counts are 0; a missing total is the sum."""
        if not isinstance(data, Mapping):
            return None
        prompt = _int(data.get("prompt_tokens"))
        completion = _int(data.get("completion_tokens"))
        total = data.get("total_tokens")
        details = data.get("completion_tokens_details")
        reasoning = data.get("reasoning_tokens")
        if reasoning is None and isinstance(details, Mapping):
            reasoning = details.get("reasoning_tokens")
        return cls(prompt, completion, _int(total) if total is not None else prompt + completion,
                   min(_int(reasoning), completion) if completion else _int(reasoning))


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError, OverflowError):
        return 0


# -- the one shape of a turn's token usage (see the module docstring) -------------------
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


def normalize_usage(data: Any) -> dict[str, int] | None:
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


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of the model's text, in arrival order."""

    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """A piece of the model's reasoning (``reasoning_content`` or ``reasoning`` deltas)."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of one tool call.

    ``index`` is the call's position among the reply's calls in arrival order (0, 1, 2…;
    unique even when a server reuses its own ``index`` for several calls); ``id`` and
    ``name`` are the values known so far (``None`` until sent); ``arguments_fragment`` is
    the new piece of the arguments text.
    """

    index: int
    id: str | None
    name: str | None
    arguments_fragment: str


StreamDelta = Union[TextDelta, ToolCallDelta, ReasoningDelta]


class ReplyState(str, Enum):
    """How a reply ended (see the module docstring)."""

    COMPLETE = "complete"
    TRUNCATED = "truncated"
    INVALID_TOOL_CALL = "invalid_tool_call"
    BROKEN = "broken"
    INTERRUPTED = "interrupted"


@dataclass(frozen=True, slots=True)
class Verdict:
    """The decision on one reply.

    Attributes:
        state: the :class:`ReplyState`.
        finish_reason: the normalized finish reason (``None`` when none arrived).
        reason: one phrase for people saying why the reply is not complete (``""`` when
            it is): ``"cut by the token limit (finish_reason length)"``…
        invalid_calls: for ``invalid_tool_call``, the calls that must not run.
    """

    state: ReplyState
    finish_reason: str | None
    reason: str = ""
    invalid_calls: tuple[ToolCall, ...] = ()

    @property
    def complete(self) -> bool:
        """The reply may be stored as the turn's answer (complete, or truncated and marked)."""
        return self.state in (ReplyState.COMPLETE, ReplyState.TRUNCATED)

    @property
    def truncated(self) -> bool:
        return self.state is ReplyState.TRUNCATED


@dataclass(frozen=True, slots=True)
class ModelTurn:
    """The model's whole answer to one request.

    Fields:
        content: the text, or ``None`` when the model only called tools (or said nothing).
        tool_calls: the tool calls in call order; ``arguments`` is the JSON *text* as
            received (``"{}"`` when none streamed; possibly invalid JSON when cut).
        usage: token counts, when the server reported them.
        finish_reason: normalized (``"stop"``, ``"tool_calls"``, ``"length"``,
            ``"content_filter"``…); ``None`` if not sent or when interrupted.
        interrupted: the stream was cancelled by chatflow; content and tool calls are partial.
        reasoning: the reasoning text (``reasoning_content``/``reasoning`` deltas), if any.
        broken: why the stream stopped early when it did so without an exception reaching
            the caller (``"the connection closed: …"``); ``None`` otherwise.
    """

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage | None = None
    finish_reason: str | None = None
    interrupted: bool = False
    reasoning: str | None = None
    broken: str | None = None

    @property
    def verdict(self) -> Verdict:
        """:func:`judge` of this turn."""
        return judge(self)

    def to_message(self, *, agent: str | None = None) -> Message:
        """The MODEL message to store for this answer (``interrupted``, ``reasoning`` and a
        truncating ``finish_reason`` carried over)."""
        finish = self.finish_reason if cut_phrase(self.finish_reason) else None
        return Message.model(self.content, self.tool_calls, agent=agent, interrupted=self.interrupted,
                             reasoning=self.reasoning, finish_reason=finish)


def _arguments_problem(arguments: str) -> str | None:
    try:  # NaN and Infinity are no JSON: providers refuse them in a request
        value = json.loads(arguments, parse_constant=_refuse_constant)
    except _NotJSON as exc:
        return f"contain {exc.args[0]}, which is not JSON"
    except ValueError:
        return "are not a complete JSON object"
    if not isinstance(value, dict):
        return f"are {_json_kind(value)}, not a JSON object"
    return None


class _NotJSON(ValueError):
    """``NaN``, ``Infinity`` or ``-Infinity`` in arguments (``args[0]`` names it)."""


def _refuse_constant(name: str) -> Any:
    raise _NotJSON(name)


def _json_kind(value: Any) -> str:
    """``"null"``, ``"a list"``, ``"a string"``, ``"a number"``, ``"true"``… for people."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    return "a number"


def _shorten(text: str, limit: int = 40) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def judge(turn: ModelTurn) -> Verdict:
    """Decide whether ``turn`` is complete (see the module docstring for the states)."""
    finish = turn.finish_reason
    if turn.interrupted:
        return Verdict(ReplyState.INTERRUPTED, None, "interrupted")
    if finish is None:
        why = turn.broken or "the stream ended without a finish reason"
        return Verdict(ReplyState.BROKEN, None, f"the reply did not finish ({why})")
    if finish in BROKEN_FINISH_REASONS:
        return Verdict(ReplyState.BROKEN, finish,
                       f"the reply did not finish (the server ended it with finish_reason {finish})")
    phrase = cut_phrase(finish)
    cut = bool(phrase)
    invalid: list[ToolCall] = []
    problems: list[str] = []
    for call in turn.tool_calls:
        problem = "has no function name" if not call.name else _arguments_problem(call.arguments)
        if problem is not None:
            invalid.append(call)
            if problem.startswith(("are", "contain")):
                problems.append(f"tool call {call.name} ({call.id}): arguments {_shorten(call.arguments)!r} {problem}")
            else:
                problems.append(f"tool call {call.id} {problem}")
    if invalid:
        tail = f"; {phrase}, finish_reason {finish}" if cut else f"; finish_reason {finish}"
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        return Verdict(ReplyState.INVALID_TOOL_CALL, finish, f"{problems[0]}{more}{tail}", tuple(invalid))
    if cut and not turn.tool_calls:
        return Verdict(ReplyState.TRUNCATED, finish, f"{phrase} (finish_reason {finish})")
    return Verdict(ReplyState.COMPLETE, finish)


# --------------------------------------------------------------------------------------
# accumulation
# --------------------------------------------------------------------------------------
class _Slot:
    __slots__ = ("id", "name", "arguments", "index", "ordinal")

    def __init__(self, index: int, ordinal: int) -> None:
        self.id: str | None = None
        self.name: str | None = None
        self.arguments: list[str] = []
        self.index = index  # the server's index
        self.ordinal = ordinal  # arrival order among the reply's calls

    def arguments_complete(self) -> bool:
        text = "".join(self.arguments).strip()
        if not text:
            return False
        try:
            json.loads(text)
        except ValueError:
            return False
        return True


class StreamAccumulator:
    """Folds Chat Completions stream chunks into a :class:`ModelTurn`.

    :meth:`feed` takes a chunk as a dict (or any object with ``model_dump()``, such as an
    ``openai`` chunk) and returns the deltas it carried. Only choice ``index`` 0 is read.
    Tolerated, never an error: empty or missing ``choices``, a choice with no ``delta`` or
    ``delta: null``, ``content: null``, usage-only chunks (usage may also ride on a content
    chunk, or follow the finish reason), arguments sent as a JSON object instead of text
    (re-encoded), and these tool-call patterns of real servers:

    * OpenAI: ``index``, ``id`` and ``name`` in a call's first chunk, then ``index`` and
      argument fragments;
    * llama.cpp: the same ``id`` and ``name`` repeated in every chunk of one call (one call);
    * Ollama and some proxies: several calls all at ``index`` 0, each with its own ``id``:
      a new ``id`` at an index whose call has another id starts a new call -- when the
      chunk names a function or the call before it is already complete JSON (a proxy that
      stamps a fresh id on every fragment of one call still gives one call);
    * no ``index``: matched by ``id``, else a new call when there is an ``id``, else the
      last call.

    A call that never got an id receives a generated ``call_<hex>`` one; a call that
    streamed no arguments gets ``"{}"``. ``id`` and ``name`` are set once (never
    concatenated); argument fragments are concatenated as text.
    """

    def __init__(self) -> None:
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._slots: list[_Slot] = []
        self._at: dict[int, _Slot] = {}  # server index -> the call now receiving fragments there
        self.usage: Usage | None = None
        self.finish_reason: str | None = None
        self.chunks = 0

    @property
    def text(self) -> str:
        return "".join(self._text)

    @property
    def reasoning(self) -> str:
        return "".join(self._reasoning)

    def feed(self, chunk: Any) -> list[StreamDelta]:
        if not isinstance(chunk, Mapping):
            dump = getattr(chunk, "model_dump", None)
            if dump is None:
                raise TypeError(f"a stream chunk must be a mapping, not {type(chunk).__name__}")
            chunk = dump()
        self.chunks += 1
        usage = Usage.from_dict(chunk.get("usage"))
        if usage is not None:
            self.usage = usage
        deltas: list[StreamDelta] = []
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, (list, tuple)) else ():
            if not isinstance(choice, Mapping) or choice.get("index", 0) not in (0, None):
                continue
            finish = normalize_finish_reason(choice.get("finish_reason"))
            if finish is not None:
                self.finish_reason = finish
            delta = choice.get("delta")
            if not isinstance(delta, Mapping):
                continue
            for key in ("reasoning_content", "reasoning"):
                thought = delta.get(key)
                if isinstance(thought, str) and thought:
                    self._reasoning.append(thought)
                    deltas.append(ReasoningDelta(thought))
                    break
            content = delta.get("content")
            if isinstance(content, str) and content:
                self._text.append(content)
                deltas.append(TextDelta(content))
            calls = delta.get("tool_calls")
            for call in calls if isinstance(calls, (list, tuple)) else ():
                if isinstance(call, Mapping):
                    deltas.append(self._feed_call(call))
        return deltas

    def _new_slot(self, index: int) -> _Slot:
        slot = _Slot(index, len(self._slots))
        self._slots.append(slot)
        self._at[index] = slot
        return slot

    def _feed_call(self, call: Mapping[str, Any]) -> ToolCallDelta:
        call_id = call.get("id") or None
        if call_id is not None and not isinstance(call_id, str):
            call_id = json.dumps(call_id, default=str)
        function = call.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        name = name if isinstance(name, str) and name else None
        index = call.get("index")
        known = next((s for s in self._slots if call_id and s.id == call_id), None)
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            if known is not None:
                slot = known
            elif call_id or not self._slots:
                slot = self._new_slot(max((s.index for s in self._slots), default=-1) + 1)
            else:
                slot = self._slots[-1]
        else:
            slot = self._at.get(index)  # type: ignore[assignment]
            if slot is None:
                slot = self._new_slot(index)
            elif call_id and slot.id and call_id != slot.id:
                if known is not None:  # back to an earlier call of this index
                    slot = known
                elif name is not None or slot.arguments_complete():
                    slot = self._new_slot(index)
        if call_id and not slot.id:
            slot.id = str(call_id)
        fragment = ""
        if isinstance(function, Mapping):
            if name is not None and not slot.name:
                slot.name = name
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                fragment = arguments
            elif arguments is not None:
                fragment = json.dumps(arguments, ensure_ascii=False)
            if fragment:
                slot.arguments.append(fragment)
        return ToolCallDelta(slot.ordinal, slot.id, slot.name, fragment)

    @property
    def tool_calls(self) -> list[ToolCall]:
        calls = []
        for slot in sorted(self._slots, key=lambda s: (s.index, s.ordinal)):
            if slot.id is None:
                slot.id = f"call_{os.urandom(12).hex()}"
            arguments = "".join(slot.arguments)
            calls.append(ToolCall(slot.id, slot.name or "", arguments if arguments.strip() else "{}"))
        return calls

    def result(self, *, interrupted: bool = False, broken: str | None = None) -> ModelTurn:
        """The answer so far. ``interrupted=True`` marks it cancelled by chatflow;
        ``broken`` says why the stream stopped early (the finish reason is then dropped
        only if none had arrived: a reply that finished is complete whatever came after)."""
        text = self.text
        reasoning = self.reasoning
        return ModelTurn(
            content=text if text else None,
            tool_calls=self.tool_calls,
            usage=self.usage,
            finish_reason=None if interrupted else self.finish_reason,
            interrupted=interrupted,
            reasoning=reasoning if reasoning else None,
            broken=None if interrupted or self.finish_reason is not None else broken,
        )
