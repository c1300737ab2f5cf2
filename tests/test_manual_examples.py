"""Every example of the manual that can run is run: its Python blocks and its ``chatflow``
command lines, for real, in subprocesses against the fake OpenAI-compatible server with an
isolated home.

A block that cannot run alone carries a marker on the line right before its fence::

    <!-- example: not run: <the reason> -->

A shell block may also say what the reader's store already holds, or what the model does
(the fake model only answers ``ok: <message>``), in markers right before its fence::

    <!-- example: given: chatflow chat -s work "first" && chatflow chat -s work "second" -->
    <!-- example: model calls: memory_create {"path": "acme.md", "file_text": "..."} -->

(``given`` runs before the block's lines; ``model calls`` makes the fake model's next reply
that tool call). The output a console block shows under a command is compared with that
command's stdout (ages, session ids and runs of spaces aside); a block whose output cannot be
reproduced says why::

    <!-- example: output: illustrative: <the reason> -->

and a block that shows output under a command that is not run (a rule's line, a block not
run) must say it so, or be marked not run. A shell line that cannot run matches one of
:data:`LINE_RULES` (each with its reason); a rule does not excuse a line that goes on to run
``chatflow`` after ``&&``, ``;`` or ``|`` unless it matches that part too. Fences are read as
CommonMark reads them (three or more backticks or tildes, the info string's first word the
language); a fence may be indented (in a list item): its body is read dedented. A console
block's commands are its ``$ `` lines, and it must have one.
Anything else is run, so a new example is run by default. A Python block runs as a script in
a fresh directory; a page's shell lines run one after another in page order in one fresh
home (a page's earlier commands make what its later ones use) and each must exit 0.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import COMMAND, REPO
from tests.helpers import manual

MARK = re.compile(r"^[ \t]*<!-- example: (?P<kind>not run|given|model calls|output): (?P<value>.+?) -->$", re.M)
SHELL = ("bash", "console", "sh")

#: Shell lines that are not run, whatever page they are on: (pattern, reason).
LINE_RULES: list[tuple[str, str]] = [
    (r"^(python3? -m venv|pip install)", "installs packages"),
    (r"chatflow chat \"What is the capital of France\?\"$",
     "the Quickstart's first chat: it answers from the local model that the line's install builds"),
    (r"^export ", "the reader's own environment: the test sets the fake server, and CHATFLOW_DB to the "
                  "tests' PostgreSQL server on a page that exports it"),
    (r"^\$EDITOR ", "opens an editor"),
    (r"^chatflow( -s \S+)?( -m \S+)?( +#.*)?$", "the REPL: needs a terminal"),
    (r"--base-url http://localhost", "needs that local server (Ollama, vLLM, LM Studio)"),
    (r"^chatflow vault set \S+ \S+ *(#.*)?$", "prompts for the value on a terminal"),
    (r"chatflow replay .*--follow", "follows the log until interrupted"),
    (r"--approve call_", "needs a tool call waiting for approval (an MCP server's)"),
]
#: Shell lines not run on this machine: (pattern, reason). CI (``CI=true``; ``.ci/run``
#: installs jq) runs them all: there a missing jq fails the test that uses it.
MACHINE_RULES = [] if shutil.which("jq") or os.environ.get("CI") else [(r"\bjq\b", "jq is not installed here")]


@dataclass
class Block:
    page: str
    line: int
    lang: str
    body: str
    marks: list[tuple[str, str]]

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    def marked(self, kind: str) -> list[str]:
        return [value for k, value in self.marks if k == kind]

    @property
    def illustrative(self) -> str | None:
        """The reason its shown output is not compared, when the block gives one."""
        return next((v.removeprefix("illustrative: ") for v in self.marked("output")), None)

    @property
    def not_run(self) -> str | None:
        """The marker's reason when the block is marked not to run."""
        return next(iter(self.marked("not run")), None)


def blocks(lang: tuple[str, ...]) -> list[Block]:
    found = []
    for page in manual.pages():
        name = manual.name(page)
        if name == "reference.md":  # generated from --help: a synopsis, not examples
            continue
        text = page.read_text(encoding="utf-8")
        fences = manual.fences(text)
        placed = sum(len(fence.marks) for fence in fences)
        assert placed == text.count("<!-- example:"), f"{name}: a marker not right before a code block"
        for fence in fences:
            if fence.lang in lang:
                marks = [(k.group("kind"), k.group("value")) for k in map(MARK.match, fence.marks) if k]
                assert len(marks) == len(fence.marks), f"{name}:{fence.line}: a marker it cannot read"
                body = _dedent(fence.body, fence.indent, f"{name}:{fence.line}")
                found.append(Block(name, fence.line, fence.lang, body, marks))
    return found


def _dedent(body: str, indent: str, where: str) -> str:
    """An indented fence's body without the fence's indent (each line has it, or is blank)."""
    lines = body.splitlines(keepends=True)
    assert all(ln.startswith(indent) or not ln.strip() for ln in lines), f"{where}: a line left of its fence"
    return "".join(ln[len(indent):] if ln.startswith(indent) else ln.lstrip(" \t") for ln in lines)


def shell_lines(block: Block) -> list[str]:
    """The command lines of a shell block: a console block's ``$ `` lines, every line of a
    bash block but blank lines and comments."""
    lines = block.body.splitlines()
    if block.lang == "console":
        return [ln[2:] for ln in lines if ln.startswith("$ ")]
    return [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def shown_output(block: Block) -> list[tuple[str, list[str]]]:
    """A console block's commands in order, each with the output lines the block shows under
    it (none: not shown). By position: the same command twice shows two outputs."""
    shown: list[tuple[str, list[str]]] = []
    for line in block.body.splitlines():
        if line.startswith("$ "):
            shown.append((line[2:], []))
        elif shown:
            shown[-1][1].append(line)
    return shown


def _plain(lines: list[str]) -> list[str]:
    """Output lines with what changes from run to run made constant."""
    lines = [re.sub(r"\b\d{8}-\d{6}-[0-9a-f]{6}\b", "SESSION", ln) for ln in lines]
    lines = [re.sub(r"\b\d+[smhd] ago\b", "AGE ago", ln) for ln in lines]
    lines = [re.sub(r"-fork-[0-9a-f]{6}\b", "-fork-ID", ln) for ln in lines]
    return [" ".join(ln.split()) for ln in lines if ln.strip()]


def _parts(line: str) -> list[str]:
    """A shell line cut at each ``&&``, ``||``, ``|``, ``;`` and ``$(`` outside quotes and
    before a comment (which stays with the last part)."""
    parts, start, quote, i = [], 0, "", 0
    while i < len(line):
        c = line[i]
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            break
        elif line.startswith(("&&", "||", "$("), i) or c in "|;":
            parts.append(line[start:i])
            i += 1 if c in "|;" and not line.startswith("||", i) else 2
            start = i
            continue
        i += 1
    return [part.strip() for part in [*parts, line[start:]]]


def _excuses(pattern: str, line: str) -> bool:
    """Whether a line rule's pattern excuses a line: it matches the line, and each ``chatflow``
    the line runs after its first command."""
    chatflow = [part for part in _parts(line)[1:] if re.match(r"chatflow\b", part)]
    return bool(re.search(pattern, line)) and all(re.search(pattern, part) for part in chatflow)


def rule_for(line: str) -> str | None:
    """The reason a shell line is not run, from the first rule that matches it. A line rule
    does not excuse a line that goes on to run ``chatflow`` (after ``&&``, ``;``, ``|``...)
    unless the rule also matches that ``chatflow`` part (``export X=1 && chatflow chat hi``
    runs). A machine's rule (a missing tool) excuses the whole line."""
    for pattern, reason in LINE_RULES:
        if _excuses(pattern, line):
            return reason
    return next((reason for pattern, reason in MACHINE_RULES if re.search(pattern, line)), None)


def _env(tmp_path: Path, fake_server: Any) -> dict[str, str]:
    """The environment of an example: the test's isolated home, the fake server, a private HOME
    (an example's ``~``), ``chatflow`` on PATH running this checkout and a ``pass`` that
    shows a made-up secret."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "chatflow"
    shim.write_text(f'#!/bin/sh\nexec {shlex.join(COMMAND)} "$@"\n')
    shim.chmod(0o755)
    password_store = bin_dir / "pass"  # `pass show NAME`: the reader's password store, one entry
    password_store.write_text('#!/bin/sh\n[ "$1" = show ] && echo "example-$2-secret"\n')
    password_store.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "OPENAI_BASE_URL": fake_server.url, "OPENAI_API_KEY": "test",
           "GITHUB_TOKEN": "example-token", "NO_COLOR": "1",
           "PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])}
    env.pop("COLUMNS", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))
    return env


# -- Python ------------------------------------------------------------------------------------

PYTHON = blocks(("python", "py"))
#: the blocks run: each text once (the README's library example is the library page's first)
PYTHON_RUN = list({b.body: b for b in reversed(PYTHON) if b.not_run is None}.values())[::-1]


def test_the_manual_has_python_examples_and_most_of_them_run() -> None:
    assert len(PYTHON) >= 8, [b.id for b in PYTHON]
    assert len(PYTHON_RUN) >= 4, [b.id for b in PYTHON_RUN]
    for block in PYTHON:
        assert {kind for kind, _ in block.marks} <= {"not run"}, block.id
    for block in blocks(SHELL):
        assert not block.marked("output") or block.lang == "console", f"{block.id}: output is a console block's"
        for value in block.marked("output"):
            assert re.match(r"illustrative: \S", value), f"{block.id}: output: illustrative: <the reason>"


@pytest.mark.parametrize("block", PYTHON_RUN, ids=[b.id for b in PYTHON_RUN])
def test_the_python_example_runs(block: Block, tmp_path: Path, fake_server: Any,
                                 request: pytest.FixtureRequest) -> None:
    env = _env(tmp_path, fake_server)
    if "CHATFLOW_DB" in block.body:  # a PostgreSQL example: the tests' server, when there is one
        env["CHATFLOW_DB"] = request.getfixturevalue("pg_dsn")
    script = tmp_path / "example.py"
    script.write_text(block.body, encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{block.id}\n{done.stdout}\n{done.stderr}"


def test_every_code_block_is_of_a_kind_these_tests_know() -> None:
    """Python and shell blocks are run (above and below), TOML blocks are loaded
    (tests/test_readme.py), text and untagged blocks are shown output or drawings and hold no
    command: a block in another language (``pycon``, ``zsh``...) fails until the tests know it."""
    for block in blocks(("",)) + blocks(("text", "json")):
        assert not re.search(r"^(\$ )?chatflow ", block.body, re.M), f"{block.id}: a command in a {block.lang!r} block"
    langs = {fence.lang for page in manual.pages() for fence in manual.fences(page.read_text(encoding="utf-8"))}
    assert langs <= {"", "python", "py", "toml", "text", "json", "mermaid", *SHELL}, langs  # mermaid: test_layering


# -- shell -------------------------------------------------------------------------------------

SHELL_BLOCKS = blocks(SHELL)
SHELL_PAGES = sorted({b.page for b in SHELL_BLOCKS if b.not_run is None
                      and any(rule_for(ln) is None for ln in shell_lines(b))})


def test_every_console_block_has_a_command_line() -> None:
    """A console block's commands are its ``$ `` lines: one without any would run nothing."""
    empty = [b.id for b in SHELL_BLOCKS if b.lang == "console" and not shell_lines(b)]
    assert not empty, f"console blocks with no `$ ` command line: {empty}"


def test_every_shell_line_is_run_or_says_why_not() -> None:
    """A ``chatflow`` line in a block without a marker is run unless a rule names it; a rule
    that no longer matches any line goes."""
    run = [ln for b in SHELL_BLOCKS if b.not_run is None for ln in shell_lines(b) if rule_for(ln) is None]
    assert sum("chatflow " in ln for ln in run) >= 40, run
    used = {pattern for b in SHELL_BLOCKS for ln in shell_lines(b)
            for pattern, _ in LINE_RULES if _excuses(pattern, ln)}
    assert used == {pattern for pattern, _ in LINE_RULES}, "rules matching no line of the manual"


def _claude_code_line(uuid: str, parent: str | None, role: str, content: Any) -> str:
    return json.dumps({"parentUuid": parent, "isSidechain": False, "type": role, "uuid": uuid,
                       "sessionId": CLAUDE_SESSION, "timestamp": "2026-11-30T10:00:00.000Z",
                       "message": {"role": role, "content": content}})


CLAUDE_SESSION = "4f35e220-c435-4cf7-b9b9-f40426042847"


def _props(cwd: Path, home: Path) -> None:
    """The files a page's commands name as the reader's own: an image, a key file, a git
    checkout with a change, llm's log database and a Claude Code session file."""
    from PIL import Image

    for name in ("screenshot.png", "shot.png"):
        Image.new("RGB", (8, 8), "white").save(cwd / name)
    (cwd / "deploy_key.pem").write_text("-----BEGIN KEY-----\nexample\n-----END KEY-----\n")
    (cwd / "notes.txt").write_text("one\n")
    subprocess.run(["git", "init", "-q"], cwd=cwd, check=True)
    subprocess.run(["git", "add", "notes.txt"], cwd=cwd, check=True)
    (cwd / "notes.txt").write_text("one\ntwo\n")
    llm = home / ".config" / "io.datasette.llm"
    llm.mkdir(parents=True)
    shutil.copy(REPO / "tests" / "core" / "interop" / "data" / "llm-0.27-logs.db", llm / "logs.db")
    claude = home / ".claude" / "projects" / "-home-ana-shop"
    claude.mkdir(parents=True)
    (claude / f"{CLAUDE_SESSION}.jsonl").write_text(
        _claude_code_line("u1", None, "user", "Why does the build fail?") + "\n"
        + _claude_code_line("a1", "u1", "assistant", [{"type": "text", "text": "A header is missing."}]) + "\n")


@pytest.mark.parametrize("page", SHELL_PAGES)
def test_the_pages_shell_examples_run_in_order(page: str, tmp_path: Path, fake_server: Any,
                                               request: pytest.FixtureRequest) -> None:
    env = _env(tmp_path, fake_server)
    if any(ln.startswith("export CHATFLOW_DB=") for b in SHELL_BLOCKS if b.page == page for ln in shell_lines(b)):
        env["CHATFLOW_DB"] = request.getfixturevalue("pg_dsn")  # the page's fleet: a real PostgreSQL server
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    _props(cwd, Path(env["HOME"]))
    failed = []
    for block in SHELL_BLOCKS:
        if block.page != page or block.not_run is not None:
            continue
        for given in block.marked("given"):
            done = subprocess.run(["bash", "-o", "pipefail", "-c", given], cwd=cwd, env=env, capture_output=True,
                                  text=True, timeout=120, stdin=subprocess.DEVNULL)
            assert done.returncode == 0, f"{block.id}: given {given}\n{done.stderr}"
        for call in block.marked("model calls"):
            tool, arguments = call.split(" ", 1)
            fake_server.add_tool_calls([(f"call_{tool}", tool, arguments)])
        shown = [] if block.illustrative else [out for _, out in shown_output(block)]
        for at, line in enumerate(shell_lines(block)):
            if rule_for(line) is not None:
                continue
            done = subprocess.run(["bash", "-o", "pipefail", "-c", line], cwd=cwd, env=env, capture_output=True,
                                  text=True, timeout=60, stdin=subprocess.DEVNULL)
            if done.returncode != 0:
                failed.append(f"{block.id}: {line}\n  exit {done.returncode}: {done.stderr.strip()[-600:]}")
            elif at < len(shown) and shown[at] and _plain(shown[at]) != _plain(done.stdout.splitlines()):
                failed.append(f"{block.id}: {line}\n  printed {done.stdout!r}, the page shows {shown[at]!r}")
    assert not failed, "\n".join(failed)


def test_the_readme_lists_the_ten_commands_people_use_most() -> None:
    """Issue 29: the README shows ten commands; the others are in the manual it links to."""
    text = manual.README.read_text(encoding="utf-8")
    section = text.split("## The commands people use most", 1)[1].split("\n## ", 1)[0]
    (block,) = [b for b in blocks(SHELL) if b.page == "README.md" and b.body in section]
    assert len(shell_lines(block)) == 10, shell_lines(block)


def test_output_shown_under_a_command_is_compared_or_says_why_not() -> None:
    """A console block's shown output is compared (by the page test above) when its command
    runs; under a command that does not run it needs ``output: illustrative: <reason>`` (or
    the block's ``not run`` reason); a block that shows nothing needs no such marker."""
    unchecked, needless = [], []
    for block in SHELL_BLOCKS:
        shows = [line for line, out in shown_output(block) if any(o.strip() for o in out)]
        if block.illustrative is not None and not shows:
            needless.append(block.id)
        if block.illustrative is not None or block.not_run is not None:
            continue
        unchecked += [f"{block.id}: {line}" for line in shows  # (a machine's rule aside: CI runs those lines)
                      if any(_excuses(pattern, line) for pattern, _ in LINE_RULES)]
    assert not unchecked, f"output shown under a command that is not run, without a reason: {unchecked}"
    assert not needless, f"marked illustrative but showing no output: {needless}"
    compared = [b for b in SHELL_BLOCKS if b.illustrative is None and b.not_run is None and any(out for _, out in shown_output(b))]
    assert len(compared) >= 3, [b.id for b in compared]
