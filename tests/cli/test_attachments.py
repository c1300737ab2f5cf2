"""``chatflow chat --attach FILE`` as a real process against the fake server, which checks
image parts as real providers do: what is sent, stored once, shown, refused, exported and
imported back."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

Image = pytest.importorskip("PIL.Image")


def _db() -> Path:
    return Path(os.environ["CHATFLOW_HOME"]) / "chatflow.db"


def make_image(path: Path, fmt: str = "PNG", size: tuple[int, int] = (64, 32)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buffer, format=fmt)
    path.write_bytes(buffer.getvalue())
    return buffer.getvalue()


def test_an_image_and_a_text_file_are_sent_stored_once_and_shown(chatflow: Any, provider: Any,
                                                                 tmp_path: Path) -> None:
    png = make_image(tmp_path / "shot.png")
    (tmp_path / "app.py").write_text("print('hi')\n", encoding="utf-8")
    r = chatflow("chat", "-s", "a", "-f", str(tmp_path / "shot.png"), "-f", str(tmp_path / "app.py"),
                 "what is in this?")
    assert r.returncode == 0, r
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    assert provider.requests[0]["messages"][-1] == {"role": "user", "content": [
        {"type": "text", "text": "what is in this?"},
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "File app.py:\n```\nprint('hi')\n```"}]}
    # the next turn sends the image again, read back from the database byte for byte, and
    # the same file attached ten times more is still one row
    r = chatflow("chat", "-s", "a", *[a for _ in range(10) for a in ("-f", str(tmp_path / "shot.png"))], "again")
    assert r.returncode == 0, r
    second = [m for m in provider.requests[1]["messages"] if m["role"] == "user"]
    assert second[0]["content"][1]["image_url"]["url"] == url
    assert [p["image_url"]["url"] for p in second[-1]["content"][1:]] == [url] * 10
    with sqlite3.connect(_db()) as conn:
        assert conn.execute("SELECT count(*) FROM chatflow_attachments").fetchone()[0] == 2
    shown = chatflow("sessions", "show", "a")
    assert "attached: shot.png (image/png, " in shown.stdout and ", 64x32)" in shown.stdout
    assert "attached: app.py (text/plain, 12 B)" in shown.stdout
    user = chatflow("sessions", "show", "a", "--json").json()["turns"][0]["messages"][0]
    assert user["attachments"][0] == {"sha256": hashlib.sha256(png).hexdigest(), "media_type": "image/png",
                                      "size": len(png), "name": "shot.png", "width": 64, "height": 32}


def test_files_that_cannot_be_attached_send_and_store_nothing(chatflow: Any, provider: Any, tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "big.log").write_bytes(b"x" * 1_000_001)
    (tmp_path / "doc.pdf").write_bytes(b"%PDF-1.7\n\x00\x01\x02")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    locked = tmp_path / "locked.txt"
    locked.write_text("secret")
    locked.chmod(0)
    cases = [("missing.png", "no such file"), ("dir", "is a directory"), ("fifo", "not a regular file"),
             ("empty.txt", "the file is empty"), ("big.log", "over the limit of 1.0 MB for a text file"),
             ("doc.pdf", "it accepts images (PNG, JPEG, WebP, GIF) and UTF-8 text files")]
    if os.geteuid() != 0:  # root reads any file
        cases.append(("locked.txt", "permission denied"))
    for name, words in cases:
        r = chatflow("chat", "-f", str(tmp_path / name), "look")
        assert r.returncode == 2 and words in r.stderr and r.stderr.count("\n") == 1, (name, r)
    (tmp_path / "n.txt").write_text("n")
    r = chatflow("chat", *[a for _ in range(11) for a in ("-f", str(tmp_path / "n.txt"))], "many")
    assert r.returncode == 2 and "a message carries at most 10" in r.stderr, r
    assert provider.requests == [] and chatflow("sessions", "ls", "--json").json() == []


def test_stdin_as_a_file_and_a_file_that_is_not_what_its_name_says(chatflow: Any, provider: Any,
                                                                  tmp_path: Path) -> None:
    jpeg = make_image(tmp_path / "photo.png", "JPEG")  # named .png, holds a JPEG: sent as what it is
    r = chatflow("chat", "-s", "b", "-f", "-", "-f", str(tmp_path / "photo.png"), "summarise", "--output", "jsonl",
                 input="ERROR boom\n")
    assert r.returncode == 0, r
    [user] = [e["data"]["message"] for e in r.jsonl() if e["type"] == "message.user"]
    assert [(a["name"], a["media_type"], a["sha256"]) for a in user["attachments"]] == [
        ("stdin", "text/plain", hashlib.sha256(b"ERROR boom\n").hexdigest()),
        ("photo.png", "image/jpeg", hashlib.sha256(jpeg).hexdigest())]
    parts = provider.requests[0]["messages"][-1]["content"]
    assert parts[1] == {"type": "text", "text": "File stdin:\n```\nERROR boom\n```"}
    assert parts[2]["image_url"]["url"] == "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()


def test_a_model_without_vision_gets_one_line_and_the_message_stays(chatflow: Any, provider: Any,
                                                                   tmp_path: Path) -> None:
    make_image(tmp_path / "shot.png")
    r = chatflow("chat", "-s", "c", "-m", "fake-text-only", "-f", str(tmp_path / "shot.png"), "what is it?")
    assert r.returncode == 5, r
    assert "model fake-text-only does not accept images" in r.stderr and r.stderr.count("\n") <= 2, r
    [turn] = chatflow("sessions", "show", "c", "--json", "--all").json()["turns"]
    assert turn["failed"] and turn["messages"][0]["attachments"][0]["name"] == "shot.png"
    from tests.conftest import llama_cpp_installed

    if llama_cpp_installed():  # the local model is text-only: said before anything starts or is stored
        r = chatflow("chat", "-s", "d", "-m", "local", "-f", str(tmp_path / "shot.png"), "what is it?")
        assert r.returncode == 5 and "the local model (SmolLM2) reads text only" in r.stderr, r
        assert "d" not in [s["session_id"] for s in chatflow("sessions", "ls", "--json").json()]


def test_attachments_survive_export_and_import(chatflow: Any, provider: Any, tmp_path: Path) -> None:
    png = make_image(tmp_path / "shot.png")
    assert chatflow("chat", "-s", "e", "-f", str(tmp_path / "shot.png"), "see").returncode == 0
    exported = chatflow("sessions", "export", "e")
    assert exported.returncode == 0, exported
    path = tmp_path / "e.jsonl"
    path.write_text(exported.stdout, encoding="utf-8")
    other = tmp_path / "other.db"
    done = chatflow("--db", str(other), "sessions", "import", str(path))
    assert done.returncode == 0, done

    def turns(*db: str) -> Any:
        return chatflow(*db, "sessions", "show", "e", "--json").json()["turns"]

    assert turns("--db", str(other)) == turns()
    with sqlite3.connect(other) as conn:
        assert conn.execute("SELECT data FROM chatflow_attachments").fetchall() == [(png,)]
    openai = chatflow("--db", str(other), "sessions", "export", "e", "--format", "openai").jsonl()
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    [user] = [m for m in openai[0]["messages"] if m["role"] == "user"]
    assert user["content"][1] == {"type": "image_url", "image_url": {"url": url}}
    # md: the transcript, and the file beside it, read back by the import
    md = tmp_path / "out" / "e.md"
    md.parent.mkdir()
    assert chatflow("sessions", "export", "e", "--format", "md", "-o", str(md)).returncode == 0
    beside = md.parent / "attachments" / (hashlib.sha256(png).hexdigest() + ".png")
    assert beside.read_bytes() == png and f"![shot.png](attachments/{beside.name})" in md.read_text()
    third = tmp_path / "third.db"
    assert chatflow("--db", str(third), "sessions", "import", str(md)).returncode == 0
    assert turns("--db", str(third))[0]["messages"] == turns()[0]["messages"]
    beside.unlink()
    gone = chatflow("--db", str(tmp_path / "fourth.db"), "sessions", "import", str(md))
    assert gone.returncode == 2 and "are not in the file" in gone.stderr, gone
    # the chatflow export of the import carries the same bytes
    again = [json.loads(line) for line in chatflow("--db", str(other), "sessions", "export", "e").stdout.splitlines()]
    assert again[1] == {"attachment": {"sha256": hashlib.sha256(png).hexdigest(),
                                       "data": base64.b64encode(png).decode()}}
