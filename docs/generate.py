"""Write the manual's generated pages from the code, so they cannot drift from it.

* ``docs/reference.md``: every command's ``--help``, exactly as chatflow prints it (typer's
  own app, walked from the root);
* three parts of ``docs/exit-codes.md``, each between a ``<!-- generated: NAME -->`` marker
  and the next ``<!-- end generated -->``:

  - ``exit codes``: the table of :class:`chatflow_cli.core.errors.ExitStatus` and
    :data:`~chatflow_cli.core.errors.EXIT_MEANINGS`;
  - ``error tree``: every public :class:`~chatflow_cli.core.errors.ChatflowError` subclass
    of the package, under its parent, with its exit code and its docstring's first sentence;
  - ``unfinished replies``: how a reply that did not finish ends, its exit code read from
    the error the run raises (``exit_code``) or from :attr:`RunResult.exit_status`, its
    finish reasons from the verdict's own sets (``core/stream.py``).

``python docs/generate.py`` rewrites them; ``python docs/generate.py --check`` changes
nothing and exits 1 naming each stale page (``tests/test_docs.py`` runs it).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chatflow_cli.core.errors import ChatflowError

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent
END = "<!-- end generated -->"


def _commands(command: Any, path: list[str]) -> list[list[str]]:
    """Every command path below ``command``, parents before children, in name order."""
    found = [path]
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        if not getattr(sub, "hidden", False):
            found += _commands(sub, [*path, name])
    return found


def reference() -> str:
    """The command reference page: one section per command, its ``--help`` verbatim."""
    import typer
    from typer.testing import CliRunner

    from chatflow_cli.cli import app

    runner = CliRunner()
    env = {"COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"}
    parts = [
        "# Command reference\n",
        "Generated from the command line itself by `python docs/generate.py`; a test fails when",
        "this page differs from what `chatflow ... --help` prints. Exit codes: [Exit codes](exit-codes.md).\n",
    ]
    for path in _commands(typer.main.get_command(app), []):
        result = runner.invoke(app, [*path, "--help"], env=env, prog_name="chatflow")
        if result.exit_code != 0:
            raise SystemExit(f"chatflow {' '.join(path)} --help exited {result.exit_code}: {result.output}")
        title = " ".join(["chatflow", *path])
        parts.append(f"## {title}\n\n```text\n{result.output.rstrip()}\n```\n")
    return "\n".join(parts)


def exit_code_table() -> str:
    """The exit-code table, a row per :class:`ExitStatus` member."""
    from chatflow_cli.core.errors import EXIT_MEANINGS, ExitStatus

    rows = ["| code | name | meaning |", "|---:|---|---|"]
    rows += [f"| {status.value} | `{status.name}` | {EXIT_MEANINGS[status]} |" for status in ExitStatus]
    return "\n".join(rows)


def _public_errors() -> type[ChatflowError]:
    """:class:`ChatflowError`, once every module of the package is imported (a few error
    classes live beside what raises them: ``core/agents.py``, ``core/local/crash.py``...)."""
    import chatflow_cli
    from chatflow_cli.core.errors import ChatflowError

    for module in pkgutil.walk_packages(chatflow_cli.__path__, "chatflow_cli."):
        importlib.import_module(module.name)
    return ChatflowError


def first_sentence(cls: type) -> str:
    """The first sentence of ``cls``'s own docstring, as Markdown; a class without one is an error."""
    doc = cls.__dict__.get("__doc__")
    if not doc or not doc.strip():
        raise SystemExit(f"{cls.__module__}.{cls.__qualname__} has no docstring: its first sentence is its line "
                         "in the error tree of docs/exit-codes.md")
    paragraph = " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())
    match = re.match(r"(.+?[.!?])(?=\s|$)", paragraph)
    sentence = match.group(1) if match else paragraph
    return re.sub(r":\w+:`~?([^`]+)`", r"`\1`", sentence).replace("``", "`")


def public_subclasses(cls: type) -> list[type]:
    """The package's public subclasses listed under ``cls``: its direct ones, and through a
    private subclass (``_Base``, not listed) the public ones under it, which the tree shows
    under ``cls``, their nearest listed ancestor."""
    found: list[type] = []
    for sub in cls.__subclasses__():
        if not sub.__module__.startswith("chatflow_cli."):
            continue
        if sub.__name__.startswith("_"):
            found += [deeper for deeper in public_subclasses(sub) if deeper not in found]
        elif sub not in found:
            found.append(sub)
    return found


def error_tree() -> str:
    """Every public error class under its parent (by exit code, then name): a nested list."""
    root = _public_errors()
    lines: list[str] = []

    def walk(cls: type[ChatflowError], depth: int) -> None:
        code = cls.exit_code
        where = "" if cls.__module__ == root.__module__ else f", in `{cls.__module__}`"
        lines.append(f"{'    ' * depth}- `{cls.__name__}` ({int(code)} `{code.name}`{where}): {first_sentence(cls)}")
        for sub in sorted(public_subclasses(cls), key=lambda error: (int(error.exit_code), error.__name__)):
            walk(sub, depth + 1)

    walk(root, 0)
    return "\n".join(lines)


def unfinished_replies() -> str:
    """The table of how a reply ends: its exit code from the code that decides it."""
    from chatflow_cli.core.stream import BROKEN_FINISH_REASONS, TRUNCATING_FINISH_REASONS, ModelTurn, ReplyState
    from chatflow_cli.core.errors import InvalidToolCallError, StreamBrokenError
    from chatflow_cli.core.messages import ToolCall
    from chatflow_cli.core.runner import RunResult

    def stored(finish: str, content: str = "text", reasoning: str | None = None) -> int:
        """The exit status of a run whose reply was stored with ``finish``."""
        result = RunResult(content, "default", "s", 1, finish_reason=finish, reasoning=reasoning)
        return int(result.exit_status)

    def agree(pairs: list[tuple[ModelTurn, ReplyState]]) -> None:
        """Each sample reply gets the verdict its row says (``judge``), or the row is wrong."""
        for turn, state in pairs:
            if turn.verdict.state is not state:
                raise SystemExit(f"the unfinished-replies table says {state.value} for {turn}, the verdict says "
                                 f"{turn.verdict.state.value}: correct the row in docs/generate.py")

    cut = list(dict.fromkeys(TRUNCATING_FINISH_REASONS.values()))
    broken = sorted(BROKEN_FINISH_REASONS)
    bad_call = ToolCall("call_1", "lookup", '{"q": "cut')
    agree([(ModelTurn("text", finish_reason="stop"), ReplyState.COMPLETE),
           *[(ModelTurn("text", finish_reason=reason), ReplyState.TRUNCATED) for reason in [*cut, "unheard_of"]],
           (ModelTurn(None, [bad_call], finish_reason="tool_calls"), ReplyState.INVALID_TOOL_CALL),
           (ModelTurn("text", finish_reason=None), ReplyState.BROKEN),
           *[(ModelTurn("text", finish_reason=reason), ReplyState.BROKEN) for reason in broken],
           (ModelTurn(None, reasoning="thought", finish_reason="stop"), ReplyState.COMPLETE)])
    cut_codes = {stored(reason) for reason in [*cut, "unheard_of"]}
    if len(cut_codes) != 1:
        raise SystemExit(f"a cut reply exits with one code, not {sorted(cut_codes)}")

    def quoted(names: list[str]) -> str:
        """``a``, ``b`` or ``c``."""
        marked = [f"`{name}`" for name in names]
        return " or ".join([", ".join(marked[:-1]), marked[-1]] if len(marked) > 1 else marked)

    rows = [
        ("the reply", "stored", "text output", "`--output json` / `jsonl`", "exit"),
        ("finished (`finish_reason` `stop`)", "the turn", "the text", '`"finish_reason": "stop"`',
         stored("stop")),
        (f"cut by the token limit or a content filter ({quoted(cut)}), or a finish reason chatflow does not know "
         "(shown as `ended with an unknown finish reason`)",
         "the turn, marked with its `finish_reason` (message, `turn.completed` event)",
         "the text, then a dim note on a terminal, or a `chatflow: reply cut by the token limit …` (`… stopped by a "
         "content filter …`) line on stderr when piped",
         '`"finish_reason": "length"` in the result and the `turn.completed` event', cut_codes.pop()),
        ("a tool call whose arguments are not a complete JSON object (cut mid-JSON, malformed, `NaN`/`Infinity`, "
         "`null` or a list)",
         "nothing: the turn fails, the user message stays in the log for a retry; the tool never runs. When earlier "
         "rounds of the turn ran tools, the turn is kept as interrupted up to its last complete round (tool calls "
         "with their results) and the line names the tools that ran",
         "`chatflow: error: the model's reply cannot be used: tool call …` (`… or raise the token limit` only when "
         "`finish_reason` was `length`)",
         f"`is_error: true`, `error_type` `{InvalidToolCallError.__name__}`", int(InvalidToolCallError.exit_code)),
        ("the stream stopped with no finish reason (connection closed or timed out mid-reply, `[DONE]` or not, "
         f'`"finish_reason": "null"`), or the server ended it with `finish_reason` {quoted(broken)} (vLLM)',
         "what arrived (text and reasoning), as an interrupted turn (as after Ctrl-C)",
         "`chatflow: error: the reply did not finish (…); what arrived is kept as interrupted turn N`",
         f"`error_type` `{StreamBrokenError.__name__}`", int(StreamBrokenError.exit_code)),
        ("reasoning only, no text (or empty, or only whitespace)",
         "the turn, with the reasoning; a reply with no text but whitespace is left out of later requests",
         "a note: `the model answered with reasoning only…` (`the model's reply was empty`, `… was only "
         "whitespace`)",
         '`"content": ""`, `"reasoning": "…"`', stored("stop", content="", reasoning="thought")),
    ]
    lines = [f"| {' | '.join(map(str, row))} |" for row in rows]
    lines.insert(1, "|---|---|---|---|---:|")
    return "\n".join(lines)


#: Each generated part of ``docs/exit-codes.md``: its marker's name and what writes it.
PARTS: dict[str, Callable[[], str]] = {
    "exit codes": exit_code_table,
    "error tree": error_tree,
    "unfinished replies": unfinished_replies,
}


def _with_parts(page: str) -> str:
    for name, write in PARTS.items():
        start = f"<!-- generated: {name} -->"
        head, rest = page.split(start, 1)
        _, tail = rest.split(END, 1)
        page = f"{head}{start}\n{write()}\n{END}{tail}"
    return page


def pages() -> dict[Path, str]:
    """Each generated page's path and the text it should hold."""
    exit_codes = DOCS / "exit-codes.md"
    return {
        DOCS / "reference.md": reference(),
        exit_codes: _with_parts(exit_codes.read_text(encoding="utf-8")),
    }


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for path, text in pages().items():
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(path.relative_to(REPO) if path.is_relative_to(REPO) else path)
        if not check:
            path.write_text(text, encoding="utf-8")
    if check and stale:
        print("stale: " + ", ".join(map(str, stale)) + " (run: python docs/generate.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    raise SystemExit(main(sys.argv[1:]))
