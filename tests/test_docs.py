"""The manual in docs/: its generated pages are current, it builds with ``mkdocs --strict``
(no broken link, no page left out of the navigation), and the README stays a short door into it."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import manual

REPO = manual.REPO


def _generator() -> object:
    spec = importlib.util.spec_from_file_location("docs_generate", REPO / "docs" / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_pages_match_the_code() -> None:
    """``docs/reference.md`` is every command's ``--help``; in ``docs/exit-codes.md`` the
    exit-code table is ``ExitStatus``, the error tree the error classes, and the exit codes of
    unfinished replies what the code gives them: ``python docs/generate.py`` rewrites them when
    the code changed."""
    generate = _generator()
    stale = [str(path.relative_to(REPO)) for path, text in generate.pages().items()  # type: ignore[attr-defined]
             if path.read_text(encoding="utf-8") != text]
    assert not stale, f"stale generated pages {stale}: run python docs/generate.py"


def test_the_check_mode_sees_a_stale_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check is real: a reference page that lost a line is reported, exit 1, and not rewritten."""
    generate = _generator()
    pages = generate.pages()  # type: ignore[attr-defined]
    reference = next(path for path in pages if path.name == "reference.md")
    copy = tmp_path / "reference.md"
    copy.write_text(reference.read_text(encoding="utf-8").replace("--limit", "--lim"), encoding="utf-8")
    monkeypatch.setattr(generate, "pages", lambda: {copy: pages[reference]})
    assert generate.main(["--check"]) == 1  # type: ignore[attr-defined]
    assert "--lim " in copy.read_text(encoding="utf-8")


def test_every_exit_status_has_its_meaning_in_the_table() -> None:
    from chatflow_cli.core.errors import EXIT_MEANINGS, ExitStatus

    assert set(EXIT_MEANINGS) == set(ExitStatus)
    table = manual.page("exit-codes.md")
    for status in ExitStatus:
        assert f"| {status.value} | `{status.name}` |" in table



def test_every_error_class_is_in_the_error_tree_with_its_exit_code() -> None:
    """The error tree is written from the classes, so none is left out (a tree written by hand
    once missed ``SummaryTooLongError``): each public subclass of ``ChatflowError`` in the
    package, wherever it is defined, has its line with its exit code, nested under its parent."""
    generate = _generator()
    root = generate._public_errors()  # type: ignore[attr-defined]
    tree = manual.page("exit-codes.md").split("<!-- generated: error tree -->", 1)[1].split("<!-- end", 1)[0]
    lines = tree.strip().splitlines()
    seen = []

    def check(cls: type, depth: int) -> None:
        seen.append(cls.__name__)
        line = next((line for line in lines if line.lstrip().startswith(f"- `{cls.__name__}` (")), None)
        assert line is not None, f"{cls.__name__} is not in the error tree of docs/exit-codes.md"
        assert line.startswith("    " * depth + "- "), f"{cls.__name__} is not under its parent: {line!r}"
        assert f"({int(cls.exit_code)} `" in line, line  # type: ignore[attr-defined]
        for sub in generate.public_subclasses(cls):  # type: ignore[attr-defined]
            check(sub, depth + 1)

    check(root, 0)
    assert {"SummaryTooLongError", "LocalServerCrashedError", "AgentDefinitionError"} <= set(seen)
    assert len(lines) == len(seen), "the error tree has a line for no class"


def test_a_public_error_under_a_private_one_is_listed_under_the_nearest_listed_class() -> None:
    """A private class is walked through, not listed: its public subclasses are not lost."""
    generate = _generator()
    namespace = {"__module__": "chatflow_cli.core.example"}
    root = type("Root", (Exception,), namespace)
    private = type("_Base", (root,), namespace)
    public = type("Public", (private,), namespace)
    deeper = type("_Deeper", (private,), namespace)
    under_deeper = type("UnderDeeper", (deeper,), namespace)
    direct = type("Direct", (root,), namespace)
    type("Elsewhere", (root,), {"__module__": "tests.example"})
    listed = generate.public_subclasses(root)  # type: ignore[attr-defined]
    assert sorted(cls.__name__ for cls in listed) == ["Direct", "Public", "UnderDeeper"]
    assert generate.public_subclasses(public) == [] and direct in listed and under_deeper in listed  # type: ignore[attr-defined]


def test_an_error_class_without_a_docstring_stops_the_generator() -> None:
    generate = _generator()
    with pytest.raises(SystemExit, match="Undocumented has no docstring"):
        generate.first_sentence(type("Undocumented", (Exception,), {}))  # type: ignore[attr-defined]



def test_the_unfinished_replies_table_reads_its_exit_codes_from_the_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """The exit column is what the code gives: the error a failed reply raises, and
    ``RunResult.exit_status`` for a stored one (what ``chatflow chat`` exits with)."""
    from chatflow_cli.core.errors import ExitStatus, StreamBrokenError
    from chatflow_cli.core.runner import RunResult

    generate = _generator()
    monkeypatch.setattr(StreamBrokenError, "exit_code", ExitStatus.RATE_LIMITED)
    monkeypatch.setattr(RunResult, "exit_status",
                        property(lambda self: ExitStatus.ERROR if self.truncated else ExitStatus.SUCCESS))
    rows = generate.unfinished_replies().splitlines()  # type: ignore[attr-defined]
    assert next(row for row in rows if "StreamBrokenError" in row).endswith("| 7 |")
    assert next(row for row in rows if row.startswith("| cut by")).endswith("| 1 |")
    assert next(row for row in rows if row.startswith("| finished")).endswith("| 0 |")


def test_the_manual_builds_with_mkdocs_strict(tmp_path: Path) -> None:
    """A broken link, a missing anchor or a page left out of the navigation fails the build."""
    if importlib.util.find_spec("mkdocs") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("mkdocs is not installed: the test extra must install it")
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    with open(REPO / "docs" / "mkdocs.yml", "rb") as config:  # as the page says: -f - from the root
        done = subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", "-", "--site-dir", str(tmp_path / "site")],
            stdin=config, cwd=REPO, capture_output=True, text=True, timeout=120,
        )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "reference" / "index.html").exists()


def test_the_readme_is_short_and_its_links_reach_the_manual() -> None:
    text = manual.README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    links = re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)", text)
    assert any(target.startswith("docs/") for target, _ in links)
    for target, anchor in links:
        if "://" in target:
            continue
        path = REPO / target
        assert path.exists(), f"README links to {target}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}
            assert anchor in slugs, f"README links to {target}#{anchor}: no such heading"


def test_every_page_of_the_manual_is_in_its_navigation() -> None:
    nav = (REPO / "docs" / "mkdocs.yml").read_text(encoding="utf-8")
    for page in manual.doc_pages():  # docs/ and its subfolders: a page mkdocs builds but nav misses
        assert f": {manual.name(page)}" in nav, f"{manual.name(page)} is not in docs/mkdocs.yml's nav"


def _command_lines() -> list[tuple[str, str]]:
    """Every ``chatflow ...`` command in the manual's shell examples: (page, command line)."""
    found = []
    for page in manual.pages():
        for fence in manual.fences(page.read_text(encoding="utf-8")):
            if fence.lang not in ("bash", "console", "sh"):
                continue
            for line in fence.body.splitlines():
                line = line.strip()
                line = line.removeprefix("$ ")
                for part in re.split(r"\|\s*|\$\(|&&|;", line):
                    part = part.strip().split(" #", 1)[0].rstrip(") ")
                    if part.startswith("chatflow ") or part == "chatflow":
                        found.append((manual.name(page), part))
    return found


def test_every_shell_example_names_real_commands_and_options() -> None:
    """Each ``chatflow ...`` line of the manual names a command that exists and only options
    that command (or the root, for the global ones) takes."""
    import shlex

    import typer

    from chatflow_cli.cli import app

    root = typer.main.get_command(app)
    global_options = {opt for p in root.params for opt in p.opts + p.secondary_opts}
    lines = _command_lines()
    assert len(lines) > 50, lines
    wrong = []
    for page, line in lines:
        try:
            words = shlex.split(line, comments=True)[1:]
        except ValueError:
            words = line.split()[1:]
        command = root
        while words and words[0] in getattr(command, "commands", {}):
            command = command.commands[words.pop(0)]
        known = global_options | {opt for p in command.params for opt in p.opts + p.secondary_opts} | {"-h", "--help"}
        for word in words:
            option = word.split("=", 1)[0]
            if option.startswith("-") and option != "-" and not re.fullmatch(r"-\d+", option) and option not in known:
                wrong.append(f"{page}: {line!r}: {option}")
    assert not wrong, "\n".join(wrong)


def test_exit_meanings_and_error_docstrings_name_the_finish_reasons_the_verdict_gives_them() -> None:
    """Exit 10's meaning names every finish reason that cuts a reply (and a reason chatflow
    does not know, which also does), exit 6's meaning and ``StreamBrokenError``'s docstring
    every one that breaks it: none that the verdict (``core/stream.py``) gives another end."""
    from chatflow_cli.core.errors import EXIT_MEANINGS, ExitStatus, StreamBrokenError
    from chatflow_cli.core.stream import (BROKEN_FINISH_REASONS, NORMAL_FINISH_REASONS, TRUNCATING_FINISH_REASONS,
                                          ModelTurn, ReplyState, normalize_finish_reason)

    def ends(reason: str) -> ReplyState:
        return ModelTurn("text", finish_reason=normalize_finish_reason(reason)).verdict.state

    known = {*TRUNCATING_FINISH_REASONS, *NORMAL_FINISH_REASONS, *BROKEN_FINISH_REASONS}
    for where, text, state in (("exit 10", EXIT_MEANINGS[ExitStatus.INCOMPLETE], ReplyState.TRUNCATED),
                               ("exit 6", EXIT_MEANINGS[ExitStatus.NETWORK], ReplyState.BROKEN),
                               ("StreamBrokenError", StreamBrokenError.__doc__ or "", ReplyState.BROKEN)):
        named = set(re.findall(r"`+(\w+)`+", text)) & known
        assert named == {reason for reason in known if ends(reason) is state}, f"{where}: {text}"
        assert ("does not know" in text) == (ends("unheard_of") is state), f"{where}: {text}"
