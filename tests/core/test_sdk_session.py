"""ChatflowSession: the Agents SDK's Session protocol on chatflow's stores, through the SDK's real Runner."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

agents = pytest.importorskip("agents", reason="the agents-sdk extra (openai-agents) is not installed")

from agents import Agent, Runner, SessionSettings, SQLiteSession, function_tool, handoff  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

agents.set_tracing_disabled(True)  # no trace export from tests

from chatflow_cli.core.memory import BaseSessionStore, SessionStore  # noqa: E402
from chatflow_cli.core.messages import Message, ToolCall  # noqa: E402
from chatflow_cli.core.sdk_session import GAP_TOOL_NAME, ChatflowSession  # noqa: E402
from chatflow_cli.core.sqlite_store import SQLiteSessionStore  # noqa: E402


@function_tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def script() -> list[Any]:
    return [
        {"output": [function_call("add", {"a": 2, "b": 3}, call_id="c1"),
                    function_call("add", {"a": 1, "b": 1}, call_id="c2")]},
        {"output": [assistant_message("5 and 2", item_id="m1")]},
        {"output": [assistant_message("Ça va ✓ — 你好", item_id="m2")]},
    ]


@pytest.fixture(params=["memory", "sqlite"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BaseSessionStore]:
    """Each store kind in turn: the in-memory store, then SQLite."""
    made: BaseSessionStore = SessionStore() if request.param == "memory" else SQLiteSessionStore(tmp_path / "s.db")
    yield made
    made.close()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def two_runs(session: Any) -> tuple[ScriptedModel, list[Any]]:
    model = ScriptedModel(script())
    agent = Agent(name="Calc", instructions="Add.", model=model, tools=[add])
    await Runner.run(agent, "what is 2+3 and 1+1?", session=session)
    await Runner.run(agent, "and now?", session=session)
    return model, await session.get_items()


def test_multi_turn_history_through_the_runner_matches_the_sdks_own_session(any_store: BaseSessionStore) -> None:
    ours = ChatflowSession("calc", any_store)
    model, items = run(two_runs(ours))
    _, reference = run(two_runs(SQLiteSession("calc")))
    assert items == reference  # every item back exactly as the SDK added it, in order
    assert [i.get("type") or i.get("role") for i in items] == [
        "user", "function_call", "function_call", "function_call_output", "function_call_output", "message",
        "user", "message"]
    # the second model call saw the first run's whole history
    second_run_input = model.calls[2].input
    assert [i.get("call_id") for i in second_run_input if i.get("type") == "function_call"] == ["c1", "c2"]
    # it is a chatflow session: turns, tool calls and results as chatflow shows them
    turns = any_store.load_turns("calc")
    assert [t.number for t in turns] == [1, 2]
    assert turns[0].messages[1].tool_calls == (ToolCall("c1", "add", '{"a":2,"b":3}'),
                                               ToolCall("c2", "add", '{"a":1,"b":1}'))
    assert turns[0].messages[2] == Message("tool", "5", tool_call_id="c1", name="add", items=(items[3],))
    assert turns[1].messages[-1].content == "Ça va ✓ — 你好"


def test_add_items_is_one_transaction_with_consecutive_seq(any_store: BaseSessionStore) -> None:
    session = ChatflowSession("tx", any_store)
    run(session.add_items([{"role": "user", "content": "hi"}]))
    before = any_store.last_seq("tx")
    batch = [{"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "a", "output": "1"},
             {"type": "reasoning", "id": "r", "summary": [{"type": "summary_text", "text": "hmm"}]},
             {"role": "assistant", "content": "done"}]
    run(session.add_items(batch))
    new = any_store.events("tx", after_seq=before)
    assert [e.seq for e in new] == list(range(before + 1, before + 5))
    with pytest.raises(TypeError, match="item 1 is not JSON-serialisable"):
        run(session.add_items([{"role": "user", "content": "x"}, {"role": "user", "content": object()}]))
    assert any_store.last_seq("tx") == before + 4  # nothing of the refused batch


@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
def test_add_items_refuses_nan_and_infinity_naming_the_item_and_writes_nothing(any_store: BaseSessionStore,
                                                                               number: float) -> None:
    # stored as a bare NaN, one such item made every search of the SQLite file fail
    session = ChatflowSession("bad", any_store)
    run(session.add_items([{"role": "user", "content": "hello"}]))
    before = any_store.last_seq("bad")
    batch = [{"role": "assistant", "content": "fine"},
             {"type": "web_search_call", "id": "ws", "status": "completed", "scores": [0.5, number]}]
    with pytest.raises(TypeError, match=r"^item 1 is not JSON-serialisable: a float NaN or Infinity"):
        run(session.add_items(batch))
    assert any_store.last_seq("bad") == before
    assert run(session.get_items()) == [{"role": "user", "content": "hello"}]


def test_items_come_back_exactly_as_added_even_when_they_break_chatflows_rules(any_store: BaseSessionStore) -> None:
    session = ChatflowSession("odd", any_store)
    odd = [
        {"role": "assistant", "content": "before any user message"},
        {"type": "function_call_output", "call_id": "nobody", "output": "orphan"},  # no call: the SDK's open issue
        {"role": "user", "content": [{"type": "input_text", "text": "look"}, {"type": "input_image", "image_url": "x"}]},
        {"type": "function_call", "call_id": "k", "name": "f", "arguments": "{}"},
        {"role": "user", "content": "a user message while k waits"},
        {"type": "web_search_call", "id": "ws", "status": "completed", "action": {"type": "search", "query": "q"}},
        {"role": "user", "content": "ünïcødé\u2028line, ‮RTL, 🎉", "extra": {"nested": [1, 2.5, None, True]}},
    ]
    run(session.add_items(odd))
    assert run(session.get_items()) == odd
    names = [m.name for t in any_store.load_turns("odd") for m in t.messages]
    assert GAP_TOOL_NAME in names  # k was closed so the history stays valid; get_items leaves it out
    store2 = ChatflowSession("odd", any_store)
    assert run(store2.get_items()) == odd


def test_returned_items_are_copies(any_store: BaseSessionStore) -> None:
    session = ChatflowSession("copy", any_store)
    item = {"role": "user", "content": "x", "meta": {"k": [1]}}
    run(session.add_items([item]))
    item["meta"]["k"].append(2)
    got = run(session.get_items())
    got[0]["meta"]["k"].append(3)
    assert run(session.get_items()) == [{"role": "user", "content": "x", "meta": {"k": [1]}}]


def test_pop_item_removes_the_newest_and_marks_it_in_the_log(any_store: BaseSessionStore) -> None:
    session = ChatflowSession("pop", any_store)
    _, items = run(two_runs(session))
    popped = []
    for _ in range(4):
        popped.append(run(session.pop_item()))
        assert run(session.get_items()) == items[: len(items) - len(popped)]
    assert popped == list(reversed(items[-4:]))  # the message, the user item, the message, an output
    events = any_store.events("pop")
    assert [e.payload["item"] for e in events if e.type == "sdk.item_popped"] == popped
    assert sum(1 for e in events if e.type == "rollback") == 4
    # the log keeps what was popped: sessions show --all still has it
    kept = [m.content for r in any_store.load_turns("pop", include_rolled_back=True) for m in r.messages]
    assert "and now?" in kept
    # the parallel calls are one message: popping one call keeps the other
    run(session.pop_item())  # output c1
    run(session.pop_item())  # call c2
    assert run(session.get_items()) == items[:2]
    assert any_store.load_turns("pop")[0].messages[1].tool_calls == (ToolCall("c1", "add", '{"a":2,"b":3}'),)
    run(session.pop_item())
    run(session.pop_item())
    assert run(session.get_items()) == []
    assert run(session.pop_item()) is None
    assert run(ChatflowSession("never-made", any_store).pop_item()) is None


def test_clear_session_empties_the_window_and_keeps_the_log(any_store: BaseSessionStore) -> None:
    session = ChatflowSession("clear", any_store)
    run(two_runs(session))
    seq = any_store.last_seq("clear")
    run(session.clear_session())
    assert run(session.get_items()) == []
    events = any_store.events("clear")
    assert events[-2].type == "rollback" and events[-2].payload["to_turn"] == 0
    assert events[-1].type == "sdk.session_cleared" and len(events) == seq + 2
    run(session.add_items([{"role": "user", "content": "again"}]))
    assert run(session.get_items()) == [{"role": "user", "content": "again"}]
    assert any_store.turn_count("clear") == 1
    run(ChatflowSession("nothing-yet", any_store).clear_session())  # no session: nothing to clear


def test_sessions_are_isolated(any_store: BaseSessionStore) -> None:
    a, b = ChatflowSession("a", any_store), ChatflowSession("b", any_store)
    run(a.add_items([{"role": "user", "content": "for a"}]))
    run(b.add_items([{"role": "user", "content": "for b"}]))
    run(a.clear_session())
    assert run(a.get_items()) == []
    assert run(b.get_items()) == [{"role": "user", "content": "for b"}]
    assert run(b.pop_item()) == {"role": "user", "content": "for b"}
    assert any_store.turn_count("a") == 0 and any_store.turn_count("b") == 0


def test_limit_and_session_settings(any_store: BaseSessionStore) -> None:
    items = [{"role": "user", "content": "q1"}, {"type": "function_call", "call_id": "x", "name": "f", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "x", "output": "1"}, {"role": "assistant", "content": "a1"},
             {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}]
    plain = ChatflowSession("lim", any_store)
    run(plain.add_items(items))
    assert run(plain.get_items(2)) == items[-2:]
    assert run(plain.get_items(3)) == items[-3:]
    assert run(plain.get_items(0)) == []
    assert run(plain.get_items(-1)) == items
    assert run(plain.get_items(100)) == items
    settings = ChatflowSession("lim", any_store, session_settings=SessionSettings(limit=3))
    assert settings.session_settings.limit == 3
    assert run(settings.get_items()) == items[-3:]
    assert run(settings.get_items(1)) == items[-1:]  # an explicit limit wins
    assert ChatflowSession("lim", any_store, session_settings={"limit": 2}).session_settings.limit == 2
    # turn-safe: whole turns only, so never a function_call_output without its call
    safe = ChatflowSession("lim", any_store, turn_safe=True)
    assert run(safe.get_items(5)) == items[-2:]   # turn 2 fits, turn 1 (4 items) does not
    assert run(safe.get_items(6)) == items
    assert run(safe.get_items(1)) == items[-1:]   # limit is a hard bound: the newest turn is cut
    window = ChatflowSession("win", any_store, max_turns=1)
    run(window.add_items(items))
    assert run(window.get_items()) == items[-2:]


def test_turn_safe_limit_is_a_hard_bound_and_drops_orphaned_outputs(any_store: BaseSessionStore) -> None:
    """The SDK's contract: at most ``limit`` items. A limit that cuts the newest turn keeps its
    newest items, minus any function_call_output whose call was cut off."""
    turn = [{"role": "user", "content": "weather?"},
            {"type": "function_call", "call_id": "a", "name": "city", "arguments": "{}"},
            {"type": "function_call", "call_id": "b", "name": "temp", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "a", "output": "Oslo"},
            {"type": "function_call_output", "call_id": "b", "output": "3"},
            {"role": "assistant", "content": "3 degrees in Oslo"}]
    safe = ChatflowSession("cut", any_store, turn_safe=True)
    run(safe.add_items([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]))
    run(safe.add_items(turn))
    for limit in range(1, 9):
        got = run(safe.get_items(limit))
        assert len(got) <= limit, (limit, got)
        calls = {it["call_id"] for it in got if it.get("type") == "function_call"}
        assert all(it["call_id"] in calls for it in got if it.get("type") == "function_call_output"), (limit, got)
    assert run(safe.get_items(4)) == [turn[2], turn[4], turn[5]]  # output "a" lost its call: dropped
    assert run(safe.get_items(6)) == turn
    assert run(safe.get_items(8)) == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, *turn]


def test_an_injected_store_is_never_closed(tmp_path: Path) -> None:
    store = SQLiteSessionStore(tmp_path / "inj.db")
    session = ChatflowSession("i", store)
    run(session.add_items([{"role": "user", "content": "x"}]))
    session.close()
    assert store.turn_count("i") == 1  # still open
    store.close()
    own = ChatflowSession("o", tmp_path / "own.db")
    run(own.add_items([{"role": "user", "content": "y"}]))
    own.close()
    with SQLiteSessionStore(tmp_path / "own.db") as again:
        assert again.turn_count("o") == 1


def test_a_session_written_by_chatflow_reads_as_items(any_store: BaseSessionStore) -> None:
    ctx = any_store.get_or_create("cli", "Assistant")
    ctx.add_message(Message.user("hi"))
    ctx.add_message(Message.model(None, [ToolCall("t", "f", '{"x":1}')]))
    ctx.add_message(Message.tool("t", "ok", name="f"))
    ctx.add_message(Message.model("done"))
    ctx.complete_turn("done")
    any_store.save(ctx)
    assert run(ChatflowSession("cli", any_store).get_items()) == [
        {"role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "t", "name": "f", "arguments": '{"x":1}'},
        {"type": "function_call_output", "call_id": "t", "output": "ok"},
        {"role": "assistant", "content": "done"}]


CHILD = """
import asyncio, sys
from chatflow_cli.core.sdk_session import ChatflowSession
tag, db = sys.argv[1], sys.argv[2]
async def main():
    session = ChatflowSession("shared", db)
    for b in range(40):
        await session.add_items([{"role": "user", "content": f"{tag}-{b}-0"}]
                                + [{"role": "assistant", "content": f"{tag}-{b}-{i}"} for i in (1, 2, 3)])
    session.close()
asyncio.run(main())
"""


def test_concurrent_add_items_from_two_processes_on_one_sqlite_file(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    SQLiteSessionStore(db).close()
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, tag, str(db)], env=env, stderr=subprocess.PIPE)
             for tag in ("p", "q")]
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err.decode()
    items = run(ChatflowSession("shared", db).get_items())
    texts = [i["content"] for i in items]
    assert len(texts) == 320
    for start in range(0, 320, 4):  # every batch landed whole, its four items together and in order
        tag, batch, _ = texts[start].split("-")
        assert texts[start:start + 4] == [f"{tag}-{batch}-{i}" for i in range(4)]
    for tag in ("p", "q"):
        assert [t for t in texts if t.startswith(tag) and t.endswith("-0")] == [f"{tag}-{b}-0" for b in range(40)]
    with SQLiteSessionStore(db) as store:
        seqs = [e.seq for e in store.events("shared")]
        assert seqs == list(range(1, len(seqs) + 1))


def billing_agents() -> tuple[Agent[Any], Agent[Any], ScriptedModel]:
    model = ScriptedModel([])
    billing = Agent(name="Billing", instructions="Refunds.", model=model)
    support = Agent(name="Support", instructions="Help.", model=model, handoffs=[handoff(billing)])
    return support, billing, model


def test_run_remembers_the_active_agent_across_runs(any_store: BaseSessionStore) -> None:
    support, billing, model = billing_agents()
    model.extend([{"output": [function_call("transfer_to_billing", {}, call_id="h1")]},
                  {"output": [assistant_message("Billing here.")]},
                  {"output": [assistant_message("Refund sent.")]}])
    session = ChatflowSession("agents", any_store, agent_name="Support")
    first = run(session.run(support, "I want a refund", agents={"Billing": billing}))
    assert first.last_agent == "Billing" and session.active_agent_name == "Billing"
    second = run(session.run(support, "Thanks, when?", agents={"Billing": billing}))
    assert second.final_output == "Refund sent."
    assert model.calls[-1].system_instructions == "Refunds."  # the second run started with Billing
    handoffs = [e.payload for e in any_store.events("agents") if e.type == "handoff"]
    assert [(h["from_agent"], h["to_agent"]) for h in handoffs] == [("Support", "Billing")]


def test_replies_carry_the_agent_that_gave_them_and_the_handoff_sits_where_it_happened(tmp_path: Path) -> None:
    """Items carry no agent name: replies are labelled with the active agent, and a handoff's
    output (the SDK's ``{"assistant": name}``) switches it at that place in the turn -- through
    the plain ``Runner.run`` too, and as ``chatflow sessions show`` prints it."""
    support, billing, model = billing_agents()
    model.extend([{"output": [function_call("transfer_to_billing", {}, call_id="h1")]},
                  {"output": [assistant_message("Billing here.")]}])
    db = tmp_path / "s.db"
    store = SQLiteSessionStore(db)
    session = ChatflowSession("labels", store, agent_name="Support")
    run(Runner.run(support, "I want a refund", session=session))  # the SDK's own Runner, not session.run
    assert session.active_agent_name == "Billing"
    (turn,) = store.load_turns("labels")
    assert [(m.role.value, m.agent) for m in turn.messages] == [
        ("user", None), ("model", "Support"), ("tool", None), ("model", "Billing")]
    events = store.events("labels")
    handoff_event = next(e for e in events if e.type == "handoff")
    assert handoff_event.payload["from_agent"] == "Support" and handoff_event.payload["to_agent"] == "Billing"
    assert handoff_event.payload["tool_call_id"] == "h1"
    tool_seq = next(e.seq for e in events if e.type == "tool.result")
    assert handoff_event.seq == tool_seq + 1  # right after the handoff's output, before Billing's reply
    store.close()
    shown = subprocess.run([sys.executable, "-m", "chatflow_cli", "--db", str(db), "sessions", "show", "labels"],
                           capture_output=True, text=True, timeout=60, env={**os.environ, "NO_COLOR": "1"})
    assert shown.returncode == 0, shown.stderr
    assert "handoff: Support -> Billing" in shown.stdout
    assert "Billing: Billing here." in shown.stdout
    assert "model" not in shown.stdout.replace("(budget", "")


def test_an_output_that_only_looks_like_a_handoff_changes_no_agent(any_store: BaseSessionStore) -> None:
    session = ChatflowSession("lookalike", any_store, agent_name="Support")
    run(session.add_items([
        {"role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "t1", "name": "lookup", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "t1", "output": '{"assistant": "Billing"}'},
        {"type": "function_call", "call_id": "t2", "name": "transfer_to_billing", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "t2", "output": "not json"},
    ]))
    assert session.active_agent_name == "Support"
    assert not [e for e in any_store.events("lookalike") if e.type == "handoff"]


def test_run_with_a_message_id_runs_a_redelivery_once(any_store: BaseSessionStore) -> None:
    support, _, model = billing_agents()
    model.extend([{"output": [assistant_message("Hello!")]}])
    session = ChatflowSession("hook", any_store)
    first = run(session.run(support, "hi", message_id="wamid.1"))
    again = run(session.run(support, "hi", message_id="wamid.1"))
    assert first.final_output == "Hello!" and not first.replayed
    assert again.duplicate and again.replayed and again.result is None
    assert len(model.calls) == 1
    assert any_store.message_state("wamid.1").value == "processed"


def test_run_with_an_idempotency_key_returns_the_first_output(any_store: BaseSessionStore) -> None:
    support, _, model = billing_agents()
    model.extend([{"error": RuntimeError("provider down")}, {"output": [assistant_message("Answer")]}])
    session = ChatflowSession("idem", any_store)
    with pytest.raises(RuntimeError, match="provider down"):
        run(session.run(support, "q", idempotency_key="k1"))
    ok = run(session.run(support, "q", idempotency_key="k1"))  # the failed run left the key free
    replay = run(session.run(support, "q", idempotency_key="k1"))
    assert ok.final_output == "Answer" and not ok.replayed
    assert replay.replayed and replay.final_output == "Answer" and replay.last_agent == "Support"
    assert len(model.calls) == 2


def test_unicode_round_trip_json_file(tmp_path: Path) -> None:
    items = [{"role": "user", "content": "🎉 \u0000 nul? no: \\u0000 text, 'quotes' \"and\" \\ back"},
             {"role": "assistant", "content": "ok\u2029para"}]
    session = ChatflowSession("u", tmp_path / "u.db")
    run(session.add_items(items))
    session.close()
    again = ChatflowSession("u", tmp_path / "u.db")
    assert run(again.get_items()) == json.loads(json.dumps(items))
    again.close()


def test_a_second_writer_is_seen_at_once(any_store: BaseSessionStore) -> None:
    """Each session object answers get_items from its window cache only while the log has not moved."""
    one, two = ChatflowSession("both", any_store), ChatflowSession("both", any_store)
    run(one.add_items([{"role": "user", "content": "from one"}]))
    assert run(one.get_items()) == [{"role": "user", "content": "from one"}]
    run(two.add_items([{"role": "assistant", "content": "from two"}]))
    assert run(one.get_items()) == [{"role": "user", "content": "from one"}, {"role": "assistant", "content": "from two"}]
    run(two.add_items([{"role": "assistant", "content": "two again"}]))
    run(one.add_items([{"role": "user", "content": "one again"}]))  # its cache was stale: not extended
    want = [{"role": "user", "content": "from one"}, {"role": "assistant", "content": "from two"},
            {"role": "assistant", "content": "two again"}, {"role": "user", "content": "one again"}]
    assert run(one.get_items()) == want and run(two.get_items()) == want
    assert run(two.pop_item()) == want[-1]
    assert run(one.get_items()) == want[:-1]
    any_store.delete("both")
    run(two.add_items([{"role": "user", "content": "new incarnation"}]))
    assert run(one.get_items()) == [{"role": "user", "content": "new incarnation"}]


_ITEM_KINDS = ["user", "call", "output", "assistant", "reasoning", "orphan_output", "handoff", "system",
               "developer"]


def _item(kind: str, n: int) -> list[dict[str, Any]]:
    if kind == "user":
        return [{"role": "user", "content": f"q{n} ✓"}]
    if kind == "call":
        return [{"type": "function_call", "call_id": f"c{n}", "name": "add", "arguments": "{}"}]
    if kind == "output":
        return [{"type": "function_call_output", "call_id": f"c{n - 1}", "output": str(n)}]
    if kind == "assistant":
        return [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": f"a{n}"}]}]
    if kind == "reasoning":
        return [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "hm"}]}]
    if kind == "system":
        return [{"role": "system", "content": f"Be brief ({n})."}]
    if kind == "developer":
        return [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": f"d{n}"}]}]
    if kind == "orphan_output":
        return [{"type": "function_call_output", "call_id": "nowhere", "output": "x"}]
    return [{"type": "function_call", "call_id": f"h{n}", "name": "transfer_to_billing", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"h{n}", "output": '{"assistant": "Billing"}'}]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "add", "add", "pop", "clear"]),
                              st.lists(st.sampled_from(_ITEM_KINDS), min_size=1, max_size=4)), max_size=12),
       created_with=st.sampled_from([None, 1, 2]))
def test_the_cached_window_always_equals_a_fresh_read(tmp_path: Path, ops: list[tuple[str, list[str]]],
                                                      created_with: int | None) -> None:
    """get_items() answers from a cache that add_items extends in place: after any mix of
    adds, pops and clears it returns what a read of the stored window returns -- also on a
    session another object created with a turn limit (``created_with``) its own does not know."""
    import uuid

    store = SQLiteSessionStore(tmp_path / f"{uuid.uuid4().hex}.db")
    if created_with is not None:
        creator = ChatflowSession("prop", store, max_turns=created_with)
        run(creator.add_items([{"role": "user", "content": "first"}]))
    session = ChatflowSession("prop", store)
    fresh = ChatflowSession("prop", store)
    n = 0
    try:
        run(session.get_items())  # the cache starts from the stored window
        for op, kinds in ops:
            if op == "add":
                items: list[dict[str, Any]] = []
                for kind in kinds:
                    n += 1
                    items += _item(kind, n)
                run(session.add_items(items))
            elif op == "pop":
                run(session.pop_item())
            else:
                run(session.clear_session())
            cached = run(session.get_items())
            fresh._cache = None
            assert cached == run(fresh.get_items())
    finally:
        store.close()


def _shown(db: Path, session_id: str) -> str:
    """``chatflow sessions show ID``, the real process, as plain text."""
    shown = subprocess.run([sys.executable, "-m", "chatflow_cli", "--db", str(db), "sessions", "show", session_id],
                           capture_output=True, text=True, timeout=60, env={**os.environ, "NO_COLOR": "1"})
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def test_a_session_run_creates_is_labelled_with_the_agent_it_starts_with(tmp_path: Path) -> None:
    """No ``agent_name``: the session ``run()`` creates takes the starting agent's name, so
    Support's reply reads ``Support:`` and the handoff ``Support -> Billing``; a later run
    that starts with another agent than the remembered one (Billing is not in ``agents``)
    makes it the active agent first (a ``Billing -> Support`` handoff event), before its user item."""
    support, _, model = billing_agents()
    model.extend([{"output": [assistant_message("Let me pass you on."),
                              function_call("transfer_to_billing", {}, call_id="h1")]},
                  {"output": [assistant_message("Billing here.")]},
                  {"output": [assistant_message("Support again.")]}])
    db = tmp_path / "s.db"
    store = SQLiteSessionStore(db)
    session = ChatflowSession("fresh", store)
    run(session.run(support, "I want a refund"))
    run(session.run(support, "one more thing", agents={}))
    turns = store.load_turns("fresh")
    assert [[m.agent for m in t.messages if m.role.value == "model"] for t in turns] == [
        ["Support", "Support", "Billing"], ["Support"]]
    handoffs = [(e.payload["from_agent"], e.payload["to_agent"], e.payload["turn"]) for e in store.events("fresh")
                if e.type == "handoff"]
    assert handoffs == [("Support", "Billing", 1), ("Billing", "Support", 1)]
    store.close()
    out = _shown(db, "fresh")
    assert "Support: Let me pass you on." in out
    assert "handoff: Support -> Billing" in out and "Billing: Billing here." in out
    assert "You: one more thing\nSupport: Support again." in out  # (show draws handoffs of transfer calls only)
    assert "Assistant" not in out


def test_run_refuses_an_idempotency_key_used_with_another_input(any_store: BaseSessionStore) -> None:
    from chatflow_cli.core.errors import IdempotencyConflictError

    support, _, model = billing_agents()
    model.extend([{"output": [assistant_message("Answer")]}])
    session = ChatflowSession("idem2", any_store)
    run(session.run(support, "q", idempotency_key="K1"))
    with pytest.raises(IdempotencyConflictError, match="idempotency key 'K1' was used with another input"):
        run(session.run(support, "different", idempotency_key="K1"))
    with pytest.raises(IdempotencyConflictError):  # items are an input too
        run(session.run(support, [{"role": "user", "content": "q"}], idempotency_key="K1"))
    assert run(session.run(support, "q", idempotency_key="K1")).replayed  # the same input still replays
    assert len(model.calls) == 1
    (done,) = [e for e in any_store.events("idem2") if e.type == "sdk.run_completed"]
    assert len(done.payload["input_sha256"]) == 64


HOLDER = """
import sys, time
from chatflow_cli.core.agents import Agent
from chatflow_cli.core.memory import Owner
from chatflow_cli.core.messages import Message
from chatflow_cli.core.sqlite_store import SQLiteSessionStore
store = SQLiteSessionStore(sys.argv[1])
start = store.begin_turn("busy", default_agent=Agent("Assistant", ""), user_message=Message.user("from the CLI"),
                         owner=Owner.current())
print("held", flush=True)
time.sleep(float(sys.argv[2]))
start.session.add_message(Message.model("cli reply"))
start.session.complete_turn("cli reply")
store.release(start.session)
store.close()
"""


def _hold(db: Path, seconds: float) -> subprocess.Popen[str]:
    """Another process running a turn on session ``busy`` for ``seconds`` (as ``chatflow chat`` does)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(db), str(seconds)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert proc.stdout is not None and proc.stdout.readline() == "held\n", proc.stderr.read() if proc.stderr else ""
    return proc


def test_edits_wait_for_a_turn_another_process_runs(tmp_path: Path) -> None:
    """add_items, pop_item and clear_session wait up to ``wait`` seconds for a busy session
    (retrying), then raise SessionBusyError; ``wait=0`` refuses at once."""
    import time

    from chatflow_cli.core.errors import SessionBusyError

    db = tmp_path / "busy.db"
    SQLiteSessionStore(db).close()
    session = ChatflowSession("busy", db)
    assert session.wait == 60.0
    holder = _hold(db, 1.0)
    began = time.monotonic()
    with pytest.raises(SessionBusyError):
        run(ChatflowSession("busy", db, wait=0).add_items([{"role": "user", "content": "now"}]))
    run(session.add_items([{"role": "user", "content": "after the CLI turn"}]))
    assert time.monotonic() - began >= 0.9
    holder.communicate(timeout=60)  # waits, and closes the pipes
    assert holder.returncode == 0
    assert [it["content"] for it in run(session.get_items())] == ["from the CLI", "cli reply", "after the CLI turn"]
    for edit in (lambda s: s.pop_item(), lambda s: s.clear_session()):
        holder = _hold(db, 1.0)
        short = ChatflowSession("busy", db, wait=0.3)
        began = time.monotonic()
        with pytest.raises(SessionBusyError):
            run(edit(short))
        assert time.monotonic() - began >= 0.3  # (it raised while the holder still held: no upper bound needed)
        run(edit(session))
        assert time.monotonic() - began >= 0.9
        holder.communicate(timeout=60)  # waits, and closes the pipes
        assert holder.returncode == 0
        short.close()
    assert run(session.get_items()) == []
    with pytest.raises(ValueError):
        ChatflowSession("busy", db, wait=-1)
    session.close()


def test_leading_instructions_are_system_messages(tmp_path: Path) -> None:
    """A system or developer item before any turn is a SYSTEM message carrying the item:
    ``sessions show`` has no empty turn for it, get_items returns every item as added and
    in order, pop_item and clear_session remove it; after the first turn it stays in order."""
    from chatflow_cli.core.messages import Role

    db = tmp_path / "sys.db"
    store = SQLiteSessionStore(db)
    session = ChatflowSession("sys", store)
    lead = [{"role": "developer", "content": "Answer in French."},
            {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "Be brief."}]}]
    turn = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "bonjour"}]
    late = {"role": "system", "content": "late note"}
    run(session.add_items([*lead, *turn, late]))
    want = [*lead, *turn, late]
    assert run(session.get_items()) == want
    fresh = ChatflowSession("sys", store)
    assert run(fresh.get_items()) == want
    assert run(ChatflowSession("sys", store, turn_safe=True).get_items(4)) == [*turn, late]  # the SYSTEM group apart
    (first,) = store.load_turns("sys")
    assert [(m.role, m.content) for m in first.messages][:2] == [(Role.USER, "hello"), (Role.MODEL, "bonjour")]
    store.close()
    out = _shown(db, "sys")
    openai_line = subprocess.run([sys.executable, "-m", "chatflow_cli", "--db", str(db), "sessions", "export", "sys",
                                  "--format", "openai"], capture_output=True, text=True, timeout=60, check=True).stdout
    assert {"role": "system", "content": "Answer in French."} in json.loads(openai_line)["messages"]
    # one turn, opened by "hello": no empty turn for the instructions (the late note's rendering is not checked)
    assert "· 1 turn ·" in out and "You: hello\nAssistant: bonjour" in out and "You: \n" not in out
    store = SQLiteSessionStore(db)
    session = ChatflowSession("sys", store)
    ctx = store.get("sys")
    assert ctx is not None
    assert [(m.role, m.content, m.items) for m in ctx.history if m.role is Role.SYSTEM] == [
        (Role.SYSTEM, "Answer in French.", (lead[0],)), (Role.SYSTEM, "Be brief.", (lead[1],))]
    # pop: the turn's items, then the SYSTEM items, newest first
    popped = [run(session.pop_item()) for _ in range(5)]
    assert popped == list(reversed(want))
    assert run(session.pop_item()) is None and run(session.get_items()) == []
    run(session.add_items([*lead, {"role": "user", "content": "again"}]))
    run(session.clear_session())
    assert run(session.get_items()) == [] and run(ChatflowSession("sys", store).get_items()) == []
    run(session.add_items(lead))  # a cleared session takes instructions as SYSTEM messages again
    assert run(ChatflowSession("sys", store).get_items()) == lead
    assert [e.payload.get("system") for e in store.events("sys") if e.type == "rollback"][-1] is True
    store.close()
    cli = [sys.executable, "-m", "chatflow_cli", "--db", str(db), "sessions", "export", "sys"]
    # the log (with its rollbacks of SYSTEM messages) imports back to the same window
    exported = subprocess.run(cli, capture_output=True, text=True, timeout=60, check=True).stdout
    other = tmp_path / "other.db"
    subprocess.run([sys.executable, "-m", "chatflow_cli", "--db", str(other), "sessions", "import", "-"],
                   input=exported, capture_output=True, text=True, timeout=60, check=True)
    again = ChatflowSession("sys", other)
    assert run(again.get_items()) == lead
    again.close()


def test_setting_the_active_agent_reads_no_older_turns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """run() ends with set_active_agent: on a long session it reads only the newest turn."""
    import chatflow_cli.core.memory.sqlite.tx as sqlite_module

    db = tmp_path / "s.db"
    writer = ChatflowSession("long", db)
    for n in range(1, 31):
        run(writer.add_items([{"role": "user", "content": f"q{n}"}, {"role": "assistant", "content": f"a{n}"}]))
    writer.close()
    reads: list[int] = []
    original = sqlite_module._SQLiteTx.live_window

    def live_window(self: Any, session_id: str, newest_first: int) -> Any:
        reads.append(newest_first)
        return original(self, session_id, newest_first)

    monkeypatch.setattr(sqlite_module._SQLiteTx, "live_window", live_window)
    session = ChatflowSession("long", db)  # a new store: nothing kept from the writes above
    try:
        run(session.set_active_agent("Billing"))
        assert reads and min(reads) == 30
        assert session.active_agent_name == "Billing"
    finally:
        session.close()


def _handoff_runs(session: ChatflowSession, support: Agent[Any], billing: Agent[Any], model: ScriptedModel) -> None:
    """Turn 1 with Support; turn 2 hands off to Billing, who answers."""
    model.extend([{"output": [assistant_message("Hi.")]},
                  {"output": [function_call("transfer_to_billing", {}, call_id="h1")]},
                  {"output": [assistant_message("Billing here.")]}])
    run(session.run(support, "hello", agents={"Billing": billing}))
    run(session.run(support, "I want a refund", agents={"Billing": billing}))
    assert session.active_agent_name == "Billing"


def test_pop_item_and_clear_session_of_a_handoff_bring_back_the_agent_before_it(any_store: BaseSessionStore) -> None:
    support, billing, model = billing_agents()
    session = ChatflowSession("pop-agent", any_store, agent_name="Support")
    _handoff_runs(session, support, billing, model)
    assert run(session.pop_item())["type"] == "message"  # Billing's reply: the handoff's output stays
    assert session.active_agent_name == "Billing"
    assert run(session.pop_item())["type"] == "function_call_output"  # the handoff's output goes
    assert session.active_agent_name == "Support"
    # each pop rolled turn 2 back to Support; the first wrote the handoff's output again, with its handoff
    log = [(e.type, e.payload.get("active_agent", e.payload.get("to_agent"))) for e in any_store.events("pop-agent")
           if e.type in ("rollback", "handoff")]
    assert log == [("handoff", "Billing"), ("rollback", "Support"), ("handoff", "Billing"), ("rollback", "Support")]

    cleared = ChatflowSession("clear-agent", any_store, agent_name="Support")
    _handoff_runs(cleared, support, billing, model)
    run(cleared.clear_session())
    assert cleared.active_agent_name == "Support"  # the agent the session was created with


def test_a_run_after_a_cli_rollback_starts_with_the_agent_of_that_turn(tmp_path: Path) -> None:
    support, billing, model = billing_agents()
    db = tmp_path / "s.db"
    store = SQLiteSessionStore(db)
    session = ChatflowSession("cli-rb", store, agent_name="Support")
    _handoff_runs(session, support, billing, model)
    rolled = subprocess.run([sys.executable, "-m", "chatflow_cli", "--db", str(db), "sessions", "rollback", "cli-rb",
                             "--to", "1", "--yes"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "NO_COLOR": "1"})
    assert rolled.returncode == 0, rolled.stderr
    assert "agent Support" in _shown(db, "cli-rb")
    assert session.active_agent_name == "Support"
    model.extend([{"output": [assistant_message("Support again.")]}])
    again = run(session.run(support, "one more thing", agents={"Billing": billing}))
    assert again.last_agent == "Support"
    assert model.calls[-1].system_instructions == "Help."  # the run started with Support, not Billing
    handoffs = [(e.payload["from_agent"], e.payload["to_agent"]) for e in store.events("cli-rb") if e.type == "handoff"]
    assert handoffs == [("Support", "Billing")]  # no handoff back was needed: Support was active again
    store.close()
