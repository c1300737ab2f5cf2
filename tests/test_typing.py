"""Typed users: the package ships ``py.typed`` and a bot written against the README's API
passes ``mypy --strict``."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# The mypy runs (20-30 s of CPU each) are marked ci_long: .ci/run's second pass runs them in one
# process, in file order, so those sharing ``strict_cache`` (the whole package first, then the
# README's uses) analyse the standard library and openai once. The default run keeps the cheap
# check that the package ships its types (py.typed). Under xdist (``-m ci_long -n 2``) they still
# go to one worker, the group "mypy".
pytestmark = pytest.mark.xdist_group("mypy")

BOT = '''
import asyncio

from chatflow_cli import (
    Agent,
    ChatflowError,
    MessageState,
    NetworkError,
    ProviderError,
    RateLimitedError,
    RunResult,
    Runner,
    SessionBusyError,
    SQLiteSessionStore,
    tool,
)


@tool
def check_order_status(order_id: str) -> dict[str, str]:
    """Check shipment tracking for an order ID."""
    return {"order_id": order_id, "status": "IN_TRANSIT"}


agent = Agent(name="Orders", instructions="Answer order questions.", tools=[check_order_status], model="gpt-4o-mini")
store = SQLiteSessionStore(db_path="sessions.db", default_max_turns=30)
runner = Runner(starting_agent=agent, session_store=store)
answer: str | None = runner.run("customer-1", "Where is order 404?").content


async def handle_inbound_webhook(user_phone: str, message_text: str, webhook_msg_id: str) -> str | None:
    if store.is_message_processed(webhook_msg_id):
        return None
    store.mark_message_processed(webhook_msg_id)
    response = await runner.run_async(
        session_id=user_phone,
        user_message=message_text,
        metadata={"channel": "whatsapp", "phone": user_phone},
    )
    return response.content


async def handle(user_phone: str, text: str, msg_id: str) -> str | None:
    try:
        result: RunResult = await runner.run_async(user_phone, text, message_id=msg_id, wait=30.0)
    except SessionBusyError:
        return None
    except (RateLimitedError, ProviderError, NetworkError) as exc:
        raise RuntimeError("deliver again later") from exc
    except ChatflowError:
        raise
    state: MessageState = store.message_state(msg_id)
    return result.content if state is MessageState.PROCESSED else None


print(asyncio.run(handle_inbound_webhook("+15550199", "Where is order 404?", "msg_id_001")))
'''


def test_the_package_ships_py_typed() -> None:
    assert (REPO / "chatflow_cli" / "py.typed").is_file()
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["chatflow_cli"]


def _needs_psycopg() -> None:
    """mypy follows chatflow_cli into its PostgreSQL store, which imports psycopg and
    psycopg_pool: without the ``postgres`` extra those imports are errors, not the package's."""
    for module in ("psycopg", "psycopg_pool"):
        pytest.importorskip(module, reason=f"{module} is not installed (pip install -e '.[postgres]')")


@pytest.fixture(scope="session")
def strict_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One mypy cache for the plain ``mypy --strict`` runs below (same options, the same
    chatflow_cli files): the first run analyses the standard library, openai and the package,
    the later ones re-read that and check only what is new (mypy re-checks a changed file)."""
    return tmp_path_factory.mktemp("mypy-strict-cache")


MYPY_INI = """[mypy]
strict = True

# chatflow_cli is followed silently, as an installed typed package is; the front-end and
# provider packages it imports lazily are not the user's concern here.
[mypy-chatflow_cli.*]
follow_imports = silent

[mypy-openai.*,typer.*,rich.*,prompt_toolkit.*,llama_cpp.*,httpx.*,httpx2.*]
follow_imports = skip
"""

WRONG = """from chatflow_cli import Agent, Runner, SessionStore

runner = Runner(starting_agent=Agent(name="A", instructions=""), session_store=SessionStore())
text: int = runner.run("s", "hi").content
"""


@pytest.mark.slow
@pytest.mark.ci_long  # a whole-program mypy run: CI's second pass
def test_mypy_strict_passes_on_a_bot_using_the_readme_api(tmp_path: Path) -> None:
    """bot.py (the README's API) is clean; wrong.py (a misuse) is an error: the check is real."""
    pytest.importorskip("mypy")
    (tmp_path / "bot.py").write_text(BOT)
    (tmp_path / "wrong.py").write_text(WRONG)
    (tmp_path / "mypy.ini").write_text(MYPY_INI)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--cache-dir", str(tmp_path / ".mypy_cache"),
         "bot.py", "wrong.py"],
        cwd=tmp_path, env={**os.environ, "MYPYPATH": str(REPO)}, capture_output=True, text=True, timeout=280,
    )
    lines = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert lines and all(line.startswith("wrong.py:4:") for line in lines), done.stdout + done.stderr
    assert "Incompatible types in assignment" in lines[0]


def _readme_typed_install() -> list[str]:
    """The pip arguments of the manual's command for typed users (the line that runs mypy)."""
    readme = (REPO / "docs" / "library.md").read_text()
    line = next(ln for ln in readme.splitlines() if ln.startswith("pip install") and "mypy --strict" in ln)
    pip_part = line.split("&&")[0].split()
    return [arg.strip("'") for arg in pip_part[2:]]


def _installed_here() -> str | None:
    """Where chatflow-cli is installed in the environment running the tests (None: nowhere)."""
    from importlib import metadata

    try:
        return str(metadata.distribution("chatflow-cli")._path)  # type: ignore[attr-defined]
    except metadata.PackageNotFoundError:
        return None


@pytest.mark.slow
@pytest.mark.ci_long  # a whole-program mypy run: CI's second pass
def test_mypy_strict_passes_after_the_readmes_install_for_typed_users(tmp_path: Path) -> None:
    """The README's install for typed users, made for real into a fresh environment, then plain
    ``mypy --strict`` (no MYPYPATH, no per-module settings) with that environment's interpreter:
    bot.py is clean and wrong.py is an error, so the package's types were seen."""
    pytest.importorskip("mypy")
    args = _readme_typed_install()
    assert "editable_mode=compat" in args or "-e" not in args, args
    env_dir = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=60)
    # The README's arguments with the checkout for ".", installed into the fresh environment;
    # dependencies are left out (mypy checks the bot against chatflow_cli's own types).
    # pip runs for the fresh environment's interpreter (--python), so it never touches the
    # environment running the tests (--prefix would uninstall chatflow-cli from it first).
    install = [str(REPO) + a[1:] if a.startswith(".") else a for a in args]
    before = _installed_here()
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(env_dir / "bin" / "python"), "install", "-q", "--no-deps",
         *install],
        capture_output=True, text=True, timeout=280,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert _installed_here() == before, "the install for the bot changed the environment running the tests"
    (tmp_path / "bot.py").write_text(BOT)
    (tmp_path / "wrong.py").write_text(WRONG)
    env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--python-executable", str(env_dir / "bin" / "python"),
         "--cache-dir", str(tmp_path / ".mypy_cache"), "bot.py", "wrong.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280,
    )
    lines = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert lines and all(line.startswith("wrong.py:4:") for line in lines), done.stdout + done.stderr
    assert "Incompatible types in assignment" in lines[0]


@pytest.mark.slow
@pytest.mark.ci_long  # a whole-program mypy run: CI's second pass
def test_mypy_strict_passes_with_the_checkout_on_mypypath(tmp_path: Path, strict_cache: Path) -> None:
    """The package's own code passes ``mypy --strict`` as a bot's dependency read from source
    (MYPYPATH, or an editable install mypy is pointed at): plain ``--strict``, no per-module
    settings, so errors inside chatflow_cli count."""
    pytest.importorskip("mypy")
    _needs_psycopg()
    (tmp_path / "bot.py").write_text(BOT)
    (tmp_path / "wrong.py").write_text(WRONG)
    env = {**os.environ, "MYPYPATH": str(REPO)}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(strict_cache), "bot.py", "wrong.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400,
    )
    lines = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert lines and all(line.startswith("wrong.py:4:") for line in lines), done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.ci_long  # a whole-program mypy run: CI's second pass
def test_the_whole_package_passes_mypy_strict(tmp_path: Path, strict_cache: Path) -> None:
    """``mypy --strict chatflow_cli``: the library and the front end, with no per-module
    settings, are clean (the REPL's parts declare the state they share, the stores and the
    Runner are typed at the boundary)."""
    pytest.importorskip("mypy")
    _needs_psycopg()
    env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(strict_cache), "chatflow_cli"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("Success: no issues found"), done.stdout


TWINS = """import asyncio
from typing import assert_type

from chatflow_cli import Agent, Message, SQLiteSessionStore
from chatflow_cli.core.events import Event
from chatflow_cli.core.memory import Owner, SessionContext, SessionSummary, TurnRecord, TurnStart
from chatflow_cli.core.memory.base import EditResult
from chatflow_cli.core.memory.search import SearchHit


async def main(store: SQLiteSessionStore, agent: Agent) -> None:
    assert_type(await store.aget("s"), SessionContext | None)
    start = await store.abegin_turn("s", default_agent=agent, user_message=Message.user("q"), owner=Owner.current())
    assert_type(start, TurnStart)
    assert_type(await store.aedit("s", lambda ctx: len(ctx.turns), create_agent=agent), EditResult[int])
    assert_type(await store.alist_sessions(10, archived=True, title="x"), list[SessionSummary])
    assert_type(await store.asearch("wal", limit=3), list[SearchHit])
    assert_type(await store.arollback("s", last=1), list[Event])
    assert_type(await store.aload_turns("s", 1, 2), list[TurnRecord])
    assert_type(await store.arelease(start.session, reason="done"), list[Event])
    assert_type(await store.aclaim_message("m"), bool)


asyncio.run(main(SQLiteSessionStore(":memory:"), Agent(name="A", instructions="")))
"""

#: Misuses of derived async twins, each an error mypy must report on its own line.
WRONG_TWINS = [
    "await store.aget(1)",
    "await store.abegin_turn(\"s\", default_agent=None, user_message=None, owner=Owner.current(), enqueue=\"yes\")",
    "await store.alist_sessions(archive=True)",
    "n: str = await store.alast_seq(\"s\")",
    "await store.arollback(\"s\", 1, 2)",
]


@pytest.mark.slow
@pytest.mark.ci_long  # a whole-program mypy run: CI's second pass
def test_the_async_twins_have_their_methods_parameters_and_results(tmp_path: Path, strict_cache: Path) -> None:
    """The async twins derived from the store methods (``aget = async_twin(get)``): mypy
    --strict sees each method's own parameters and result (a generic ``edit`` keeps its
    change's type), and reports a wrong argument, an unknown keyword or a wrong result type."""
    pytest.importorskip("mypy")
    _needs_psycopg()
    (tmp_path / "twins.py").write_text(TWINS)
    head = ("from chatflow_cli import SQLiteSessionStore\nfrom chatflow_cli.core.memory import Owner\n\n\n"
            "async def main(store: SQLiteSessionStore) -> None:\n")
    wrong = head + "".join(f"    {line}\n" for line in WRONG_TWINS)
    first = head.count("\n") + 1
    (tmp_path / "wrong_twins.py").write_text(wrong)
    env = {**os.environ, "MYPYPATH": str(REPO)}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(strict_cache), "twins.py", "wrong_twins.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400,
    )
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert not [e for e in errors if e.startswith("twins.py")], done.stdout + done.stderr
    flagged = {int(e.split(":")[1]) for e in errors if e.startswith("wrong_twins.py:")}
    assert flagged == set(range(first, first + len(WRONG_TWINS))), done.stdout + done.stderr


def _readme_sdk_switch() -> str:
    """The manual's two-line switch to chatflow's store (the first python block of the library
    page's "An Agents SDK session on chatflow's store" section)."""
    readme = (REPO / "docs" / "library.md").read_text()
    section = readme.split("## An Agents SDK session on chatflow's store", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.slow
@pytest.mark.ci_long  # a whole-program mypy run: CI's second pass
def test_mypy_strict_passes_on_the_readmes_agents_sdk_switch(tmp_path: Path, strict_cache: Path) -> None:
    """The README's two lines, with the SDK's real ``Runner.run(..., session=session)``:
    ChatflowSession meets the SDK's ``Session`` protocol for a type checker (its items are
    the SDK's ``TResponseInputItem``, its settings ``SessionSettings | None``)."""
    pytest.importorskip("mypy")
    _needs_psycopg()
    pytest.importorskip("agents", reason="the agents-sdk extra (openai-agents) is not installed")
    body = "".join(f"    {line}\n" if line else "\n" for line in _readme_sdk_switch().splitlines())
    assert "Runner.run(" in body and "session=session" in body, body
    bot = ("from typing import Any\n\nfrom agents import Agent, Runner\n\n\n"
           "async def main(agent: Agent[Any]) -> None:\n" + body
           + "    items = await session.get_items()\n    await session.add_items(items)\n"
           + "    print(result.final_output, await session.pop_item())\n")
    (tmp_path / "sdk_bot.py").write_text(bot)
    # plain --strict: the SDK's and openai's types are followed (skipping them makes the items Any)
    env = {**os.environ, "MYPYPATH": str(REPO)}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(strict_cache), "sdk_bot.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400,
    )
    assert done.returncode == 0, bot + done.stdout + done.stderr
    assert done.stdout.startswith("Success: no issues found"), done.stdout
