"""A file's name or path is shown on one inert line wherever chatflow shows it: the error
line of ``chat -f``, ``sessions show``, the ``Attached:`` line of a Markdown export (whose
link text is escaped, and whose import gives the same name back). The real process against
the fake server; names with a newline, an ESC and brackets, as a file system allows."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

ODD = "odd\nname\x1b[31m].md"  # a newline, an ESC sequence and a closing bracket
SHOWN = "odd name␛[31m].md"  # one line, the ESC shown as a picture


def test_a_path_with_a_newline_or_esc_is_one_inert_error_line(chatflow: Any, provider: Any, tmp_path: Path) -> None:
    r = chatflow("chat", "-f", "odd/missing\nfile.txt", "x")
    assert r.returncode == 2 and r.stderr == "chatflow: error: cannot attach odd/missing file.txt: no such file\n", r
    (tmp_path / "e\x1b]0;t\x07mpty.txt").write_bytes(b"")
    r = chatflow("chat", "-f", str(tmp_path / "e\x1b]0;t\x07mpty.txt"), "x")
    assert r.returncode == 2 and r.stderr.endswith("e␛]0;t␇mpty.txt: the file is empty\n"), r
    assert "\x1b" not in r.stderr and provider.requests == []


def test_an_odd_name_is_one_line_in_sessions_show_and_the_md_export_and_comes_back(
        chatflow: Any, provider: Any, tmp_path: Path) -> None:
    data = b"# notes\n"
    (tmp_path / ODD).write_bytes(data)
    r = chatflow("chat", "-s", "n1", "-f", str(tmp_path / ODD), "read")
    assert r.returncode == 0, r
    shown = chatflow("sessions", "show", "n1", "--all")
    assert shown.returncode == 0, shown
    [line] = [row for row in shown.stdout.splitlines() if "attached:" in row]
    assert f"attached: {SHOWN} (text/markdown, 8 B)" in line and "\x1b" not in shown.stdout
    assert not any(row.startswith("name") for row in shown.stdout.splitlines())
    md = tmp_path / "out" / "n1.md"
    md.parent.mkdir()
    assert chatflow("sessions", "export", "n1", "--format", "md", "-o", str(md)).returncode == 0
    text = md.read_text(encoding="utf-8")
    link = f"attachments/{hashlib.sha256(data).hexdigest()}.md"
    [attached] = [row for row in text.splitlines() if row.startswith("Attached: ")]
    assert attached == f"Attached: [odd name␛\\[31m\\].md]({link}) {SHOWN} (text/markdown, 8 B)"
    fresh = tmp_path / "fresh.db"
    assert chatflow("--db", str(fresh), "sessions", "import", str(md)).returncode == 0
    back = chatflow("--db", str(fresh), "sessions", "show", "n1", "--json").json()
    assert back["turns"][0]["messages"][0]["attachments"][0]["name"] == ODD
