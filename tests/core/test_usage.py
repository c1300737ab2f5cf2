"""One usage shape (``chatflow_cli.core.stream.normalize_usage``) and the tokens a reply costs
in the next request's context (``chatflow_cli.core.tokens.reply_tokens``)."""

from __future__ import annotations

from chatflow_cli.core.memory import InMemorySessionStore
from chatflow_cli.core.agents import Agent
from chatflow_cli.core.messages import Message
from chatflow_cli.core.model import Usage
from chatflow_cli.core.tokens import MESSAGE_OVERHEAD, reply_tokens
from chatflow_cli.core.stream import normalize_usage


def test_every_known_shape_becomes_the_one_shape() -> None:
    assert normalize_usage({"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}) == \
        {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}
    # llm's columns and Anthropic's usage (cache reads and writes are input too)
    assert normalize_usage({"input_tokens": 12, "output_tokens": 3}) == \
        {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
    assert normalize_usage({"input_tokens": 5, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 7,
                            "output_tokens": 9}) == {"prompt_tokens": 112, "completion_tokens": 9, "total_tokens": 121,
                                                     "cache_read_input_tokens": 100, "cache_creation_input_tokens": 7}
    # anything else given is kept as it is (nothing is lost)
    assert normalize_usage({"input_tokens": 1, "output_tokens": 2, "cost": 0.25}) == \
        {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3, "cost": 0.25}
    assert normalize_usage({"cost": 0.25}) == {"cost": 0.25}
    # a provider's reasoning count among the completion tokens is kept
    assert normalize_usage({"prompt_tokens": 1, "completion_tokens": 3004, "total_tokens": 3005,
                            "completion_tokens_details": {"reasoning_tokens": 3000}})["reasoning_tokens"] == 3000
    # a count the source does not give is left out: no total made up from half of it
    assert normalize_usage({"input_tokens": 12, "output_tokens": None}) == {"prompt_tokens": 12}


def test_unknown_is_none_never_a_false_zero() -> None:
    for data in (None, {}, {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
                 {"input_tokens": None, "output_tokens": None}, {"prompt_tokens": "many"}, {"prompt_tokens": -1},
                 {"prompt_tokens": 1.5}, {"prompt_tokens": True}, "12 tokens"):
        assert normalize_usage(data) is None, data


def test_complete_turn_stores_the_one_shape_or_null() -> None:
    store = InMemorySessionStore()
    ctx = store.get_or_create("u", Agent(name="A", instructions=""))
    ctx.add_message(Message.user("q1"))
    ctx.add_message(Message.model("a1"))
    ctx.complete_turn("a1", usage={"input_tokens": 12, "output_tokens": 3})
    ctx.add_message(Message.user("q2"))
    ctx.add_message(Message.model("a2"))
    ctx.complete_turn("a2", usage=None)
    ctx.add_message(Message.user("q3"))
    ctx.add_message(Message.model("a3"))
    ctx.complete_turn("a3", usage=Usage(0, 0, 0))
    store.save(ctx)
    done = [e.payload["usage"] for e in store.events("u") if e.type == "turn.completed"]
    assert done == [{"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}, None, None]


def test_a_reply_counts_what_is_sent_back() -> None:
    reasoned = Usage.from_dict({"prompt_tokens": 30, "completion_tokens": 3004, "total_tokens": 3034,
                                "completion_tokens_details": {"reasoning_tokens": 3000}})
    assert reply_tokens(reasoned) == 4 + MESSAGE_OVERHEAD
    assert reply_tokens(Usage(30, 12, 42)) == 12 + MESSAGE_OVERHEAD
    assert reply_tokens(None) is None and reply_tokens(Usage()) is None
    # reasoning text with no count of its tokens: they may be inside completion_tokens, so estimate
    assert reply_tokens(Usage(30, 3003, 3033), reasoning=True) is None
