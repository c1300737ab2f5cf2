"""Write the manual's generated pages from the code, so they cannot drift from it.

* ``docs/reference.md``: every command's ``--help``, exactly as chatflow prints it (typer's
  own app, walked from the root);
* the exit-code table in ``docs/exit-codes.md``: :class:`chatflow_cli.core.errors.ExitStatus`
  and :data:`~chatflow_cli.core.errors.EXIT_MEANINGS`, between the page's
  ``<!-- generated: exit codes -->`` markers.

``python docs/generate.py`` rewrites them; ``python docs/generate.py --check`` changes
nothing and exits 1 naming each stale page (``tests/test_docs.py`` runs it).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent
START, END = "<!-- generated: exit codes -->", "<!-- end generated -->"


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


def _with_table(page: str) -> str:
    head, rest = page.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{exit_code_table()}\n{END}{tail}"


def pages() -> dict[Path, str]:
    """Each generated page's path and the text it should hold."""
    exit_codes = DOCS / "exit-codes.md"
    return {
        DOCS / "reference.md": reference(),
        exit_codes: _with_table(exit_codes.read_text(encoding="utf-8")),
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
