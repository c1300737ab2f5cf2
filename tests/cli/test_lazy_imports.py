"""``chatflow --help``, ``sessions ls`` and ``sessions show`` never import the heavy modules
(issues 2 and 5), and a plain ``chat`` imports only what it uses (issue 30: every millisecond a
``chatflow`` process spends starting is paid by every run).

Each command runs in a fresh interpreter through ``chatflow_cli.cli.main``; the modules
loaded when it exits are then checked.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

import pytest

#: pydantic is not listed: typer 0.29 itself imports it to coerce any non-flag option (issue 2
#: calls that "the honest floor"). httpx and httpx2 are: only a model request needs them.
HEAVY = ("openai", "prompt_toolkit", "rich.markdown", "llama_cpp", "httpx", "httpx2")

PROBE = r"""
import atexit, json, sys
def report():
    sys.__stderr__.write("MODULES=" + json.dumps(sorted(sys.modules)) + "\n")
atexit.register(report)
sys.argv = ["chatflow", *json.loads(sys.argv[1])]
from chatflow_cli.cli import main
main()
"""


def _modules(args: list[str]) -> set[str]:
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True,
                          env=dict(os.environ), timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("MODULES=")][-1]
    return set(json.loads(line[len("MODULES="):]))


@pytest.fixture
def stored_session(chatflow, provider):
    provider.add_tool_calls([("c1", "nothing", "{}")])  # an unknown tool: an error result, then text
    provider.add_text("Some **markdown** answer")
    assert chatflow("chat", "-s", "lazy", "hello").returncode == 0
    return "lazy"


@pytest.mark.parametrize(
    "args",
    [["--help"], ["sessions", "ls"], ["sessions", "ls", "--json"], ["sessions", "show", "lazy"],
     ["sessions", "show", "lazy", "--json"], ["sessions", "--help"], ["chat", "--help"]],
)
def test_no_heavy_imports(stored_session, args):
    loaded = _modules(args)
    heavy = sorted(m for m in loaded if m.split(".")[0] in {h.split(".")[0] for h in HEAVY if "." not in h}
                   or m in HEAVY)
    assert heavy == [], f"chatflow {' '.join(args)} imported {heavy}"


def test_the_probe_can_see_heavy_imports(stored_session, monkeypatch):
    """The guard itself works: a chat turn imports httpx2, and openai when sent through it."""
    assert "httpx2" in _modules(["chat", "-s", "lazy", "again"])
    monkeypatch.setenv("CHATFLOW_TRANSPORT", "openai")
    assert "openai" in _modules(["chat", "-s", "lazy", "once more"])


def test_a_one_shot_chat_imports_neither_openai_nor_rich_nor_prompt_toolkit(stored_session):
    """Into a pipe, a chat turn needs no openai (its request goes through httpx2), no Rich
    and no prompt_toolkit."""
    loaded = _modules(["chat", "-s", "lazy", "piped"])
    assert sorted(m for m in loaded if m.split(".")[0] in {"openai", "rich", "prompt_toolkit", "llama_cpp"}) == []


#: What a plain ``chat "hi"`` (a new session, no tool, no mount, no attachment, no MCP server),
#: ``sessions ls`` and ``sessions show`` do not import, each imported where it is used: asyncio
#: (and its ssl) only where a coroutine runs, the search where a search runs, memory stores'
#: documents and vaults where one is used, the in-memory store, automatic compaction before a
#: session has turns (and its model a known context size), the sessions table where it is
#: not printed; the TOML parser for an empty config file (the tests').
NOT_ON_THE_PLAIN_PATHS = {
    "chat": ("asyncio", "concurrent.futures", "chatflow_cli.core.memory.search", "chatflow_cli.core.memory.inmemory",
             "chatflow_cli.core.resources.documents", "chatflow_cli.core.resources.vaults",
             "chatflow_cli.core.compaction", "chatflow_cli.core.mcp", "chatflow_cli.core.interop",
             "chatflow_cli.commands.attach", "chatflow_cli.render.sessions", "tomllib"),
    "sessions": ("asyncio", "ssl", "tomllib", "chatflow_cli.core.memory.search", "chatflow_cli.core.memory.inmemory",
                 "chatflow_cli.core.resources.documents", "chatflow_cli.core.resources.vaults",
                 "chatflow_cli.core.mcp", "chatflow_cli.core.interop"),
    "--help": ("chatflow_cli.core.resources.mounts", "chatflow_cli.core.memory", "chatflow_cli.render"),
}


@pytest.mark.parametrize(
    "args",
    [["chat", "hi"], ["sessions", "ls"], ["sessions", "ls", "--json"], ["sessions", "show", "lazy"],
     ["sessions", "show", "lazy", "--json"], ["--help"]],
)
def test_a_plain_command_imports_only_what_it_uses(stored_session, args):
    loaded = _modules(args)
    unused = NOT_ON_THE_PLAIN_PATHS[args[0]]
    found = sorted(m for m in loaded if m in unused or any(m.startswith(u + ".") for u in unused))
    assert found == [], f"chatflow {' '.join(args)} imported {found}"


def test_the_probe_sees_what_a_session_with_turns_and_a_search_import(stored_session, config_file):
    """The guard above can fail: a turn of a session with turns, on a model whose context size
    is known, imports compaction (to see whether it is due); a search imports the query
    language; a config file with a setting, the TOML parser."""
    assert "chatflow_cli.core.compaction" in _modules(["chat", "-s", "lazy", "--max-context-tokens", "9000", "again"])
    assert "chatflow_cli.core.memory.search" in _modules(["sessions", "search", "markdown"])
    assert "tomllib" not in _modules(["sessions", "ls"])
    config_file("max_turns = 30\n")
    assert "tomllib" in _modules(["sessions", "ls"])


def test_what_is_loaded_before_the_command_is_left_out_of_the_cycle_collector(isolated_home):
    """The collector's walks of the older generations, and the interpreter's collections at
    exit, walked every object typer and the command modules made at import (about 10 ms of
    each run): ``main`` freezes them; the command's own objects are collected as always."""
    probe = ("import atexit, gc, sys\n"
             "atexit.register(lambda: sys.__stderr__.write(f'FROZEN={gc.get_freeze_count()}\\n'))\n"
             "sys.argv = ['chatflow', 'sessions', 'ls']\n"
             "from chatflow_cli.cli import main\n"
             "main()\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=dict(os.environ),
                          timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    frozen = int([ln for ln in proc.stderr.splitlines() if ln.startswith("FROZEN=")][-1][len("FROZEN="):])
    assert frozen > 10_000, frozen


def _reads_counted(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """How many times typer reads each command function's parameters, from now on."""
    import typer.main

    reads: collections.Counter[str] = collections.Counter()
    original = typer.main.get_params_from_function

    def counting(func):
        reads[f"{func.__module__}.{func.__qualname__}"] += 1
        return original(func)

    monkeypatch.setattr(typer.main, "get_params_from_function", counting)
    return reads


def _every_command(command) -> list[str]:
    """Look up every command of the tree (building each), depth first; their paths."""
    paths = []
    for name in list(getattr(command, "commands", None) or ()):
        paths.append(name)
        paths += [f"{name} {sub}" for sub in _every_command(command.commands[name])]
    return paths


def test_building_the_command_reads_each_functions_parameters_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """typer read each command function's signature (and evaluated its string annotations)
    two or more times, about 40 ms of each run: now once, however much of the tree is built."""
    import typer.main

    from chatflow_cli.cli import build_command

    reads = _reads_counted(monkeypatch)
    command = build_command()
    paths = _every_command(command)
    assert "chat" in paths and "sessions ls" in paths and "memory ls" in paths, paths
    assert len(reads) > 40 and max(reads.values()) == 1, reads.most_common(3)
    assert typer.main.get_params_from_function.__name__ == "counting"  # put back after each build


def test_a_run_builds_only_the_commands_it_looks_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building the whole tree (44 command functions) took about 10 ms of every run: the
    root is built first, each command when it is first looked up (``chat``: the root and
    ``chat``; ``sessions ls``: the root, the group and ``ls``), each given chatflow's shape
    then (global options after the command, plain argument help)."""
    from chatflow_cli.cli import build_command

    reads = _reads_counted(monkeypatch)

    def commands_read() -> list[str]:
        return sorted(f for f in reads if f.startswith(("chatflow_cli.cli.", "chatflow_cli.sessions_app."))
                      and not f.endswith("_callback"))

    command = build_command()
    assert commands_read() == ["chatflow_cli.cli.root"]
    assert "chat" in command.commands and "nope" not in command.commands and len(command.commands) == 10
    assert commands_read() == ["chatflow_cli.cli.root"]  # names, ``in`` and len build nothing
    chat = command.commands["chat"]
    assert commands_read() == ["chatflow_cli.cli.chat", "chatflow_cli.cli.root"]
    ls = command.commands["sessions"].commands["ls"]
    assert commands_read() == ["chatflow_cli.cli.chat", "chatflow_cli.cli.root", "chatflow_cli.sessions_app.sessions_ls"]
    for built in (chat, ls):
        assert {"--db", "--config", "--debug", "--no-color"} <= {o for p in built.params for o in p.opts}
    assert command.commands["chat"] is chat  # built once
