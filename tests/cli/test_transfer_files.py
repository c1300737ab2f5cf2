"""``sessions export -o`` and ``sessions import`` at the edges a fresh user meets: what the
output path is (a FIFO, a device, a symlink, a directory, a file with its own mode), exports
that write nothing, files that do not import back, and an import stopped by Ctrl-C. Every
test runs the real ``chatflow`` process."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cli import test_transfer
from tests.conftest import COMMAND, REPO, db_path
from tests.core.interop.test_claude_code import SID, lines_of, session_lines

rich_db = test_transfer.rich_db  # the fixture: sessions 'rich' and 'other'


def _leftovers(folder: Path) -> list[str]:
    """Temporary files an export left beside its target."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_export_to_a_fifo_writes_into_it_and_leaves_it_a_fifo(chatflow: Any, rich_db: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    exported = chatflow("sessions", "export", "rich", "-o", str(fifo))
    reader.join(timeout=30)
    assert exported.returncode == 0, exported
    assert stat.S_ISFIFO(fifo.lstat().st_mode)  # not replaced by a regular file
    assert got and got[0].decode("utf-8") == chatflow("sessions", "export", "rich").stdout
    assert _leftovers(tmp_path) == []


def test_export_to_a_full_device_is_one_line_exit_1_and_the_device_stays(chatflow: Any, rich_db: Path,
                                                                         tmp_path: Path) -> None:
    if not stat.S_ISCHR(os.stat("/dev/full").st_mode):  # pragma: no cover - a system without it
        pytest.skip("no /dev/full character device")
    # through a symlink in tmp_path: without the rules, the rename replaces the link, never /dev/full
    link = tmp_path / "full.jsonl"
    link.symlink_to("/dev/full")
    result = chatflow("sessions", "export", "rich", "-o", str(link))
    assert result.returncode == 1, result
    assert result.stderr == f"chatflow: error: cannot write {link}: No space left on device\n"
    assert link.is_symlink() and stat.S_ISCHR(os.stat("/dev/full").st_mode)
    assert _leftovers(tmp_path) == []


def test_export_through_a_symlink_writes_its_target_whole(chatflow: Any, rich_db: Path, tmp_path: Path) -> None:
    folder = tmp_path / "exports"
    folder.mkdir()
    target = folder / "real.jsonl"
    target.write_text("the previous export\n", encoding="utf-8")
    target.chmod(0o640)
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    result = chatflow("sessions", "export", "rich", "-o", str(link))
    assert result.returncode == 0, result
    assert link.is_symlink() and link.resolve() == target
    assert target.read_text(encoding="utf-8") == chatflow("sessions", "export", "rich").stdout
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert _leftovers(folder) == [] and _leftovers(tmp_path) == []
    # a link whose target does not exist yet: the target is made, the link kept
    dangling = tmp_path / "later.jsonl"
    dangling.symlink_to(folder / "later.jsonl")
    assert chatflow("sessions", "export", "rich", "--format", "md", "-o", str(dangling)).returncode == 0
    assert dangling.is_symlink() and (folder / "later.jsonl").read_text(encoding="utf-8").startswith("---\n")


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_an_existing_file_keeps_its_mode_and_a_new_one_follows_the_umask(chatflow: Any, rich_db: Path,
                                                                         tmp_path: Path, mask: int) -> None:
    kept = tmp_path / "kept.jsonl"
    kept.write_text("old\n", encoding="utf-8")
    kept.chmod(0o644)
    new = tmp_path / "new.jsonl"
    old_mask = os.umask(mask)  # the child process inherits it
    try:
        assert chatflow("sessions", "export", "rich", "-o", str(kept)).returncode == 0
        assert chatflow("sessions", "export", "rich", "-o", str(new)).returncode == 0
    finally:
        os.umask(old_mask)
    assert stat.S_IMODE(kept.stat().st_mode) == 0o644
    assert kept.read_text(encoding="utf-8").startswith('{"format":"chatflow"')
    assert stat.S_IMODE(new.stat().st_mode) == 0o666 & ~mask


def test_an_output_that_cannot_be_opened_is_cannot_write_exit_1(chatflow: Any, rich_db: Path, tmp_path: Path) -> None:
    # the README's exit-code table: `cannot write FILE: ...` is exit 1, however the writing failed
    missing = tmp_path / "no-such-dir" / "f.jsonl"
    result = chatflow("sessions", "export", "rich", "-o", str(missing))
    assert result.returncode == 1, result  # before: exit 2
    assert result.stderr == f"chatflow: error: cannot write {missing}: No such file or directory\n"
    loop = tmp_path / "loop.jsonl"
    loop.symlink_to(loop)
    looped = chatflow("sessions", "export", "rich", "-o", str(loop))
    assert looped.returncode == 1, looped  # before: exit 2
    assert looped.stderr == f"chatflow: error: cannot write {loop}: Too many levels of symbolic links\n"
    assert loop.is_symlink() and _leftovers(tmp_path) == []


def test_export_to_a_directory_is_a_usage_error_naming_it(chatflow: Any, rich_db: Path, tmp_path: Path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    result = chatflow("sessions", "export", "rich", "-o", str(folder))
    assert result.returncode == 2, result
    assert result.stderr == f"chatflow: error: cannot write {folder}: it is a directory (give a file name for the export)\n"
    assert list(folder.iterdir()) == [] and _leftovers(tmp_path) == []


def test_an_export_that_writes_no_session_leaves_the_file_alone(chatflow: Any, tmp_path: Path) -> None:
    from chatflow_cli.core.sqlite_store import SQLiteSessionStore

    db_path().parent.mkdir(parents=True, exist_ok=True)
    with SQLiteSessionStore(db_path()) as store:  # a session with no turn: nothing in the openai form
        store.save(store.get_or_create("quiet", "Assistant"))
    kept = tmp_path / "evals.jsonl"
    kept.write_text("the previous evals\n", encoding="utf-8")
    kept.chmod(0o644)
    skipped = chatflow("sessions", "export", "quiet", "--format", "openai", "-o", str(kept))
    assert skipped.returncode == 0, skipped
    assert skipped.stderr.splitlines()[-1] == f"chatflow: no session was written: {kept} is not written"
    assert kept.read_text(encoding="utf-8") == "the previous evals\n"
    none = tmp_path / "none.jsonl"
    for args in (["quiet", "--format", "openai"], ["--since", "1s", "--format", "openai"], ["--since", "1s"]):
        if args[0] == "--since":
            time.sleep(1.1)  # "quiet" is now older than a second
        result = chatflow("sessions", "export", *args, "-o", str(none))
        assert result.returncode == 0, result
        assert not none.exists()
    since = chatflow("sessions", "export", "--since", "1s", "-o", str(kept))
    assert since.stderr == f"chatflow: no sessions to export: {kept} is not written\n"
    assert kept.read_text(encoding="utf-8") == "the previous evals\n" and _leftovers(tmp_path) == []


def test_a_json_export_is_refused_by_import_with_what_to_do(chatflow: Any, rich_db: Path, tmp_path: Path) -> None:
    for ids in (["rich"], ["rich", "other"]):  # one document, or an array of them
        path = tmp_path / "show.json"
        assert chatflow("sessions", "export", *ids, "--format", "json", "-o", str(path)).returncode == 0
        other_db = tmp_path / "other.db"
        result = chatflow("--db", str(other_db), "sessions", "import", str(path))
        assert result.returncode == 2, result
        assert result.stderr == (f"chatflow: error: {path} is a json export (sessions show --json): it does not "
                                 "import back; export with --format chatflow (or md, openai)\n")
        assert not other_db.exists()


def test_an_empty_file_says_so(chatflow: Any, tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    for text in ("", "\n \n"):
        empty.write_text(text, encoding="utf-8")
        for extra in ([], ["--from", "openai"]):
            result = chatflow("sessions", "import", str(empty), *extra)
            assert result.returncode == 2, result
            assert result.stderr == f"chatflow: error: {empty} is empty: nothing to import\n"
    piped = chatflow("sessions", "import", "-", input="")
    assert piped.returncode == 2 and piped.stderr == "chatflow: error: - is empty: nothing to import\n"


@pytest.mark.parametrize(("messages", "said"), [
    ([{"role": "system", "content": "Be brief."}, {"role": "assistant", "content": "Hi"}],
     "the first message after the system messages must be a user message, not assistant (message 2)"),
    ([{"role": "user", "content": "q"}, {"role": "tool", "tool_call_id": "c1", "content": "r"}],
     ("message 2 is a tool result for call 'c1', which the assistant message just before it did not make "
      "(or another tool message answered already)")),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "system", "content": "s"}],
     "message 3 is a system message after the conversation began: system messages come first"),
])
def test_an_openai_line_that_breaks_a_rule_is_said_in_the_files_terms(chatflow: Any, tmp_path: Path,
                                                                      messages: list[Any], said: str) -> None:
    path = tmp_path / "evals.jsonl"
    path.write_text(json.dumps({"messages": messages}) + "\n", encoding="utf-8")
    result = chatflow("sessions", "import", str(path))
    assert result.returncode == 2, result
    assert result.stderr == f"chatflow: error: {path}: line 1: {said}\n"


def test_md_keeps_the_archive_state_and_the_sources_times_through_round_trips(chatflow: Any, tmp_path: Path) -> None:
    claude = tmp_path / f"{SID}.jsonl"
    claude.write_text("\n".join(lines_of(session_lines())) + "\n", encoding="utf-8")  # dated 2026-11-30T10:00Z
    assert chatflow("sessions", "import", str(claude)).returncode == 0
    when = 1796032800.0  # 2026-11-30T10:00:00Z
    source = chatflow("sessions", "ls", "--json").json()
    assert [(s["created_at"], s["updated_at"]) for s in source] == [(when, when)]
    db = None
    for hop in range(2):  # md -> import -> md -> import: the turn comments carry import times by then
        md = tmp_path / f"hop{hop}.md"
        exported = chatflow(*(["--db", str(db)] if db else []), "sessions", "export", SID, "--format", "md", "-o",
                            str(md))
        assert exported.returncode == 0, exported
        db = tmp_path / f"hop{hop}.db"
        assert chatflow("--db", str(db), "sessions", "import", str(md)).returncode == 0
        listed = chatflow("--db", str(db), "sessions", "ls", "--json").json()
        assert [(s["session_id"], s["created_at"], s["updated_at"]) for s in listed] == [(SID, when, when)]
        assert chatflow("--db", str(db), "sessions", "ls", "--since", "1d", "--json").json() == []
    # archived: the front matter says so, and the imported session is archived
    assert chatflow("sessions", "archive", SID).returncode == 0
    md_text = chatflow("sessions", "export", SID, "--format", "md").stdout
    assert re.search(r'^archived: "20\d\d-\d\d-\d\dT[0-9:.]+Z"$', md_text, flags=re.MULTILINE), md_text[:600]
    md = tmp_path / "archived.md"
    md.write_text(md_text, encoding="utf-8")
    archived_db = tmp_path / "archived.db"
    assert chatflow("--db", str(archived_db), "sessions", "import", str(md)).returncode == 0
    assert chatflow("--db", str(archived_db), "sessions", "ls", "--json").json() == []
    shown = chatflow("--db", str(archived_db), "sessions", "ls", "--archived", "--json").json()
    assert [(s["session_id"], s["created_at"], s["updated_at"]) for s in shown] == [(SID, when, when)]


def test_an_import_stopped_by_ctrl_c_says_what_it_stored(tmp_path: Path) -> None:
    lines = []
    for k in range(3000):  # enough that the import is still running when it is stopped
        turns = [m for t in range(20) for m in ({"role": "user", "content": f"s{k} q{t} " + "x" * 200},
                                                {"role": "assistant", "content": f"a{t}"})]
        lines.append(json.dumps({"messages": turns}))
    path = tmp_path / "many.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    db = tmp_path / "stopped.db"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))}

    def listed() -> list[str]:
        out = subprocess.run([*COMMAND, "--db", str(db), "sessions", "ls", "-n", "0", "--json"], env=env, capture_output=True,
                             text=True, timeout=60, check=False)
        return [s["session_id"] for s in json.loads(out.stdout)] if out.returncode == 0 and out.stdout else []

    proc = subprocess.Popen([*COMMAND, "--db", str(db), "sessions", "import", str(path)], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (db.exists() and len(listed()) >= 2):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    stored = listed()
    assert 2 <= len(stored) < 3000
    match = re.fullmatch(rf"chatflow: import of {re.escape(str(path))} interrupted: (\d+) sessions stored "
                         r"\(([^)]*)\)(?:, nothing of session (\S+))?; run it again to import the rest\n", err)
    assert match, err
    assert int(match.group(1)) == len(stored)
    assert set(match.group(2).removesuffix(", ...").split(", ")) <= set(stored)
    assert match.group(3) not in stored  # the session it was writing (when stopped inside one) has nothing stored
