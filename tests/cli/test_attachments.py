"""``chatflow chat --attach FILE`` as a real process against the fake server, which checks
image parts as real providers do: what is sent, stored once, shown, refused, exported and
imported back, forked and rolled back -- on SQLite and on PostgreSQL (the ``database``
fixture) where the database is what a test is about."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import Database

Image = pytest.importorskip("PIL.Image")


def make_image(path: Path, fmt: str = "PNG", size: tuple[int, int] = (64, 32),
               color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format=fmt)
    path.write_bytes(buffer.getvalue())
    return buffer.getvalue()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def stored(database: Database, at: str | None = None) -> dict[str, bytes]:
    """The attachments' bytes the database holds, by hash."""
    return {h: bytes(d) for h, d in database.execute("SELECT sha256, data FROM chatflow_attachments", at=at)}


def used_by(database: Database, session_id: str) -> set[str]:
    """The hashes a session references."""
    return {h for (h,) in database.execute("SELECT sha256 FROM chatflow_attachment_refs WHERE session_id = ?",
                                           (session_id,))}


def test_an_image_and_a_text_file_are_sent_stored_once_and_shown(chatflow: Any, provider: Any, tmp_path: Path,
                                                                 database: Database) -> None:
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
    assert stored(database) == {sha(png): png, sha(b"print('hi')\n"): b"print('hi')\n"}
    assert used_by(database, "a") == {sha(png), sha(b"print('hi')\n")}
    shown = chatflow("sessions", "show", "a")
    assert "attached: shot.png (image/png, " in shown.stdout and ", 64x32)" in shown.stdout
    assert "attached: app.py (text/plain, 12 B)" in shown.stdout
    user = chatflow("sessions", "show", "a", "--json").json()["turns"][0]["messages"][0]
    assert user["attachments"][0] == {"sha256": sha(png), "media_type": "image/png",
                                      "size": len(png), "name": "shot.png", "width": 64, "height": 32}


def _without_root_powers() -> list[str]:
    """A command prefix under which root cannot read a file its permissions forbid (root's
    CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH dropped by setpriv); [] for another user. Skips,
    saying why, where root cannot drop them."""
    if os.geteuid() != 0:
        return []
    prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    if shutil.which("setpriv") is None or subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
        pytest.skip("running as root, which reads any file, and setpriv cannot drop CAP_DAC_OVERRIDE here: "
                    "an unreadable file cannot be made")
    return prefix


def test_files_that_cannot_be_attached_send_and_store_nothing(chatflow: Any, provider: Any, tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "big.log").write_bytes(b"x" * 1_000_001)
    with open(tmp_path / "huge.png", "wb") as huge:  # sparse: its size is what is checked, before a read
        huge.truncate(20_000_001)
    (tmp_path / "doc.pdf").write_bytes(b"%PDF-1.7\n\x00\x01\x02")
    (tmp_path / "junk.png").write_bytes(os.urandom(64) + b"\x00")  # named .png, neither image nor text
    (tmp_path / "cut.png").write_bytes(make_image(tmp_path / "whole.png")[:12])  # a PNG cut in its header
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    cases = [("missing.png", "no such file"), ("dir", "is a directory"), ("fifo", "not a regular file"),
             ("empty.txt", "the file is empty"), ("big.log", "1,000,001 bytes, over the limit of 1,000,000 bytes (1 MB) for a text file"),
             ("huge.png", "20,000,001 bytes, over the limit of 20,000,000 bytes (20 MB) for an image"),
             ("doc.pdf", "it accepts images (PNG, JPEG, WebP, GIF) and UTF-8 text files"),
             ("junk.png", "not a file chatflow sends"), ("cut.png", "starts as image/png but its header is broken")]
    for name, words in cases:
        r = chatflow("chat", "-f", str(tmp_path / name), "look")
        assert r.returncode == 2 and words in r.stderr and r.stderr.count("\n") == 1, (name, r)
    (tmp_path / "n.txt").write_text("n")
    r = chatflow("chat", *[a for _ in range(11) for a in ("-f", str(tmp_path / "n.txt"))], "many")
    assert r.returncode == 2 and "a message carries at most 10" in r.stderr, r
    assert provider.requests == [] and chatflow("sessions", "ls", "--json").json() == []


def test_limits_are_said_in_exact_bytes_from_stdin_too(chatflow: Any, provider: Any, tmp_path: Path) -> None:
    """stdin is read no further than one byte past the image limit: its size is "more than"."""
    big = b"\x89PNG\r\n\x1a\n" + b"\x00" * 22_000_000
    r = chatflow("chat", "-f", "-", "look", input=big)
    assert r.returncode == 2 and r.stderr == ("chatflow: error: cannot attach stdin: more than 20,000,000 bytes, "
                                              "over the limit of 20,000,000 bytes (20 MB) for an image\n"), r
    r = chatflow("chat", "-f", "-", "look", input=b"y" * 1_000_001)
    assert r.returncode == 2 and "stdin: 1,000,001 bytes, over the limit of 1,000,000 bytes (1 MB)" in r.stderr, r
    assert provider.requests == [] and chatflow("sessions", "ls", "--json").json() == []


def test_implausible_and_cut_images_are_refused_before_sending(chatflow: Any, provider: Any, tmp_path: Path) -> None:
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    # 45 bytes: a PNG whose header claims 2147483647 x 2147483647 pixels
    (tmp_path / "vast.png").write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 2**31 - 1,
                                                                                            2**31 - 1, 8, 2, 0, 0, 0))
                                        + chunk(b"IEND", b"")[:12])
    assert len((tmp_path / "vast.png").read_bytes()) == 45
    noise = Image.frombytes("RGB", (120, 80), os.urandom(120 * 80 * 3))
    whole = {}
    for fmt in ("PNG", "JPEG", "WEBP"):
        buffer = io.BytesIO()
        noise.save(buffer, format=fmt)
        whole[fmt] = buffer.getvalue()
        (tmp_path / f"whole.{fmt}").write_bytes(whole[fmt])
        (tmp_path / f"cut.{fmt}").write_bytes(whole[fmt][:300])  # head -c 300
    (tmp_path / "tail.JPEG").write_bytes(whole["JPEG"] + b"a video after the image")  # bytes after its end: fine
    cases = [("vast.png", "its header says 2,147,483,647x2,147,483,647 pixels, over 65,535 a side"),
             ("cut.PNG", "the image/png image is cut short (its 300 bytes end before its data does)"),
             ("cut.JPEG", "the image/jpeg image is cut short"), ("cut.WEBP", "the image/webp image is cut short")]
    for name, words in cases:
        r = chatflow("chat", "-f", str(tmp_path / name), "look")
        assert r.returncode == 2 and words in r.stderr and r.stderr.count("\n") == 1, (name, r)
    assert provider.requests == [] and chatflow("sessions", "ls", "--json").json() == []
    r = chatflow("chat", "-f", str(tmp_path / "tail.JPEG"), "-f", str(tmp_path / "whole.PNG"), "look")
    assert r.returncode == 0, r


def test_an_image_the_provider_cannot_read_is_named_not_called_unaccepted(chatflow: Any, provider: Any,
                                                                           tmp_path: Path) -> None:
    """Broken inside (headers whole, pixels not): chatflow sends it; the provider's 400 says it
    is invalid, which is not "the model does not accept images"."""
    data = bytearray(make_image(tmp_path / "p.jpg", "JPEG", (64, 64)))
    sos = data.index(b"\xff\xda")
    data[sos + 14:-2] = b"\xff\x00" * ((len(data) - 2 - sos - 14) // 2)  # scan data Pillow cannot decode
    data[sos + 14:sos + 16] = b"\xff\xc4"  # a marker inside the scan
    (tmp_path / "bad.jpg").write_bytes(bytes(data))
    r = chatflow("chat", "-s", "v", "-f", str(tmp_path / "bad.jpg"), "x")
    assert r.returncode == 5, r
    assert "does not accept images" not in r.stderr, r
    assert "chatflow: error: the provider could not read image bad.jpg (the provider said: " in r.stderr, r
    assert "You uploaded an unsupported image. Please make sure your image is valid" in r.stderr, r


def test_a_file_given_to_agent_gets_a_hint_to_attach_it(chatflow: Any, provider: Any, tmp_path: Path) -> None:
    make_image(tmp_path / "shot.png")
    r = chatflow("chat", "-a", str(tmp_path / "shot.png"), "what is it?")
    assert r.returncode == 3 and r.stderr.count("\n") == 1, r
    assert f"unknown agent '{tmp_path / 'shot.png'}' (configured: " in r.stderr, r
    assert r.stderr.endswith(f"; {tmp_path / 'shot.png'} is a file: to attach a file use -f PATH\n"), r
    r = chatflow("chat", "-a", "nobody", "hi")  # not a file: no hint
    assert r.returncode == 3 and "unknown agent 'nobody'" in r.stderr and "-f PATH" not in r.stderr, r
    assert provider.requests == []


def test_a_file_without_read_permission_sends_and_stores_nothing(chatflow: Any, provider: Any,
                                                                 tmp_path: Path) -> None:
    locked = tmp_path / "locked.txt"
    locked.write_text("secret")
    locked.chmod(0)
    r = chatflow("chat", "-f", str(locked), "look", prefix=_without_root_powers())
    assert r.returncode == 2 and r.stderr == f"chatflow: error: cannot attach {locked}: permission denied " \
                                             "(it is not readable)\n", r
    assert provider.requests == [] and chatflow("sessions", "ls", "--json").json() == []


def test_files_of_each_kind_go_as_the_provider_expects(chatflow: Any, provider: Any, tmp_path: Path) -> None:
    """Text files of each kind (source, log, Markdown, CSV, JSON) go as text parts naming them;
    images of each format (PNG, JPEG, WebP, GIF) as image_url parts the fake server checks as
    a provider does (a real image in a valid base64 data: URL)."""
    texts = {"app.py": ("print(1)\n", "text/plain"), "run.log": ("12:00 ERROR disk full\n", "text/plain"),
             "README.md": ("# T\u00edtulo\n", "text/markdown"), "t.csv": ("a,b\n1,2\n", "text/csv"),
             "d.json": ('{"a": [1]}\n', "application/json")}
    for name, (text, _) in texts.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    images = {"p.png": ("PNG", "image/png"), "j.jpg": ("JPEG", "image/jpeg"), "w.webp": ("WEBP", "image/webp"),
              "g.gif": ("GIF", "image/gif")}
    data = {name: make_image(tmp_path / name, fmt, (7, 5)) for name, (fmt, _) in images.items()}
    names = [*texts, *images]
    r = chatflow("chat", "-s", "k", *[a for name in names for a in ("-f", str(tmp_path / name))], "read all",
                 "--output", "jsonl")
    assert r.returncode == 0, r
    [user] = [e["data"]["message"] for e in r.jsonl() if e["type"] == "message.user"]
    kinds = {**{n: t for n, (_, t) in texts.items()}, **{n: t for n, (_, t) in images.items()}}
    assert [(a["name"], a["media_type"]) for a in user["attachments"]] == [(n, kinds[n]) for n in names]
    assert all((a.get("width"), a.get("height")) == (7, 5) for a in user["attachments"][len(texts):])
    parts = provider.requests[0]["messages"][-1]["content"]
    assert parts[0] == {"type": "text", "text": "read all"}
    assert [p["text"] for p in parts[1:1 + len(texts)]] == [f"File {n}:\n```\n{t.rstrip()}\n```"
                                                           for n, (t, _) in texts.items()]
    assert [p["image_url"]["url"] for p in parts[1 + len(texts):]] == [
        f"data:{images[n][1]};base64,{base64.b64encode(data[n]).decode()}" for n in images]


def test_stdin_as_a_file_and_a_file_that_is_not_what_its_name_says(chatflow: Any, provider: Any,
                                                                  tmp_path: Path) -> None:
    jpeg = make_image(tmp_path / "photo.png", "JPEG")  # named .png, holds a JPEG: sent as what it is
    r = chatflow("chat", "-s", "b", "-f", "-", "-f", str(tmp_path / "photo.png"), "summarise", "--output", "jsonl",
                 input="ERROR boom\n")
    assert r.returncode == 0, r
    [user] = [e["data"]["message"] for e in r.jsonl() if e["type"] == "message.user"]
    assert [(a["name"], a["media_type"], a["sha256"]) for a in user["attachments"]] == [
        ("stdin", "text/plain", sha(b"ERROR boom\n")), ("photo.png", "image/jpeg", sha(jpeg))]
    parts = provider.requests[0]["messages"][-1]["content"]
    assert parts[1] == {"type": "text", "text": "File stdin:\n```\nERROR boom\n```"}
    assert parts[2]["image_url"]["url"] == "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()


def test_a_model_without_vision_gets_one_line_and_the_message_stays(chatflow: Any, provider: Any, tmp_path: Path,
                                                                   database: Database) -> None:
    png = make_image(tmp_path / "shot.png")
    r = chatflow("chat", "-s", "c", "-m", "fake-text-only", "-f", str(tmp_path / "shot.png"), "what is it?")
    assert r.returncode == 5, r
    assert "model fake-text-only does not accept images" in r.stderr and r.stderr.count("\n") <= 2, r
    # what stays: the failed turn in the log with its message and file, the bytes once; the
    # window is empty (a failed turn is not part of the conversation)
    [turn] = chatflow("sessions", "show", "c", "--json", "--all").json()["turns"]
    assert turn["failed"] and turn["messages"][0]["content"] == "what is it?"
    assert turn["messages"][0]["attachments"][0]["name"] == "shot.png"
    assert [(t["number"], t["in_window"], t["failed"]) for t in
            chatflow("sessions", "show", "c", "--json").json()["turns"]] == [(1, False, True)]
    assert stored(database) == {sha(png): png} and used_by(database, "c") == {sha(png)}
    # the one-shot retry is the command again on a vision model: the file is not stored twice
    # (the REPL's /retry sends the kept message without attaching it again: tests/repl)
    r = chatflow("chat", "-s", "c", "-m", "fake-model", "-f", str(tmp_path / "shot.png"), "what is it?")
    assert r.returncode == 0 and r.stdout.startswith("ok: what is it?"), r
    assert provider.requests[1]["messages"][-1] == provider.requests[0]["messages"][-1]
    turns = chatflow("sessions", "show", "c", "--json", "--all").json()["turns"]
    assert [(t["number"], t["failed"]) for t in turns] == [(1, True), (1, False)]
    assert stored(database) == {sha(png): png}
    from tests.conftest import llama_cpp_installed

    if llama_cpp_installed():  # the local model is text-only: said before anything starts or is stored
        r = chatflow("chat", "-s", "d", "-m", "local", "-f", str(tmp_path / "shot.png"), "what is it?")
        assert r.returncode == 5 and "the local model (SmolLM2) reads text only" in r.stderr, r
        assert "d" not in [s["session_id"] for s in chatflow("sessions", "ls", "--json").json()]


def test_attachments_survive_export_and_import_in_each_format(chatflow: Any, provider: Any, tmp_path: Path,
                                                              database: Database) -> None:
    png = make_image(tmp_path / "shot.png")
    code = b"x = '\xc3\xa9'\n"
    (tmp_path / "app.py").write_bytes(code)
    assert chatflow("chat", "-s", "e", "-f", str(tmp_path / "shot.png"), "see").returncode == 0
    assert chatflow("chat", "-s", "e", "-f", str(tmp_path / "app.py"), "-f", str(tmp_path / "shot.png"),
                    "more").returncode == 0
    both = {sha(png): png, sha(code): code}

    def shown(*db: str, session: str = "e") -> Any:
        r = chatflow(*db, "sessions", "show", session, "--json")
        assert r.returncode == 0, r
        return r.json()["turns"]

    def imported(path: Path) -> str:
        fresh = database.fresh()
        done = chatflow("--db", fresh, "sessions", "import", str(path))
        assert done.returncode == 0, done
        return fresh

    # chatflow (lossless) and md (the files beside it): into a fresh database, shown the same
    path = tmp_path / "e.jsonl"
    exported = chatflow("sessions", "export", "e", "-o", str(path))
    assert exported.returncode == 0, exported
    other = imported(path)
    assert shown("--db", other) == shown() and stored(database, other) == both
    md = tmp_path / "out" / "e.md"
    md.parent.mkdir()
    assert chatflow("sessions", "export", "e", "--format", "md", "-o", str(md)).returncode == 0
    beside = md.parent / "attachments" / (sha(png) + ".png")
    assert beside.read_bytes() == png and f"![shot.png](attachments/{beside.name})" in md.read_text()
    third = imported(md)
    assert shown("--db", third) == shown() and stored(database, third) == both
    # json is what sessions show --json prints (it does not import)
    as_json = chatflow("sessions", "export", "e", "--format", "json")
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["turns"] == shown(), as_json
    # openai: the messages as the request sent them; an image comes back an attachment
    # (without its name: a data: URL has none), a text file stays the text part it was sent as
    openai = tmp_path / "e.openai.jsonl"
    assert chatflow("--db", other, "sessions", "export", "e", "--format", "openai", "-o", str(openai)).returncode == 0
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    users = [m for m in json.loads(openai.read_text())["messages"] if m["role"] == "user"]
    assert [p for m in users for p in m["content"] if p["type"] == "image_url"] == [
        {"type": "image_url", "image_url": {"url": url}}] * 2
    fourth = imported(openai)
    [listed] = chatflow("--db", fourth, "sessions", "ls", "--json").json()
    image = {k: v for k, v in shown()[0]["messages"][0]["attachments"][0].items() if k != "name"}
    back = [t for t in shown("--db", fourth, session=listed["session_id"]) if t["number"] > 0]  # 0: the system
    assert [[a for m in t["messages"] for a in m.get("attachments", [])] for t in back] == [[image], [image]]
    assert [m["content"] for t in back for m in t["messages"]] == [m["content"] for t in shown()
                                                                   for m in t["messages"]][:2] + [
        "more\n\nFile app.py:\n```\nx = '\u00e9'\n```", shown()[1]["messages"][1]["content"]]
    assert stored(database, fourth) == {sha(png): png}
    # an md file whose files are gone is refused, nothing stored
    beside.unlink()
    gone = chatflow("--db", database.fresh(), "sessions", "import", str(md))
    assert gone.returncode == 2 and "are not beside the transcript: a Markdown export keeps them in " \
        f"attachments/{beside.name}" in gone.stderr, gone
    # the chatflow export of an import carries the same bytes
    again = [json.loads(line) for line in chatflow("--db", other, "sessions", "export", "e").stdout.splitlines()]
    assert {a["attachment"]["sha256"]: base64.b64decode(a["attachment"]["data"])
            for a in again if "attachment" in a} == both


def test_an_export_rewrites_a_changed_file_and_an_import_says_what_is_wrong(chatflow: Any, provider: Any,
                                                                            tmp_path: Path) -> None:
    """A name that is a hash is not trusted to be one: a changed file beside a Markdown export
    is written again, and an import says its hash differs; a .chatflow export missing a file's
    line says so in that format's words."""
    code = b"print('kept')\n"
    (tmp_path / "app.py").write_bytes(code)
    assert chatflow("chat", "-s", "h", "-f", str(tmp_path / "app.py"), "see").returncode == 0
    md = tmp_path / "exm" / "s.md"
    md.parent.mkdir()
    assert chatflow("sessions", "export", "h", "--format", "md", "-o", str(md)).returncode == 0
    beside = md.parent / "attachments" / (sha(code) + ".txt")
    beside.write_bytes(b"other bytes\n")
    bad = chatflow("--db", str(tmp_path / "x.db"), "sessions", "import", str(md))
    assert bad.returncode == 2, bad
    assert f"attachments/{beside.name} beside {md} is not the file attached as app.py: its bytes have the sha256 " \
        f"{sha(b'other bytes' + bytes([10]))}, not {sha(code)}" in bad.stderr, bad
    assert "are not" not in bad.stderr
    again = chatflow("sessions", "export", "h", "--format", "md", "-o", str(md))
    assert again.returncode == 0 and beside.read_bytes() == code, again
    r = chatflow("--db", str(tmp_path / "y.db"), "sessions", "import", str(md))
    assert r.returncode == 0, r
    # a .chatflow export with its attachment line cut out
    path = tmp_path / "h.chatflow"
    assert chatflow("sessions", "export", "h", "-o", str(path)).returncode == 0
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(line for line in lines if not line.startswith('{"attachment"')))
    assert len(path.read_text().splitlines()) == len(lines) - 1
    cut = chatflow("--db", str(tmp_path / "z.db"), "sessions", "import", str(path))
    assert cut.returncode == 2 and "are not in the file: a .chatflow export holds each file as an " \
        '{"attachment": ...} line' in cut.stderr, cut
    assert "Markdown" not in cut.stderr and "attachments/" not in cut.stderr, cut


def test_fork_and_rollback_keep_exactly_the_files_still_used(chatflow: Any, provider: Any, tmp_path: Path,
                                                             database: Database) -> None:
    """A fork references the files of the turns it copies, never a copy of their bytes; a
    rolled-back turn stays in the log (``--all`` shows it, a chatflow export carries it), so
    its files stay until the session is deleted; a delete removes what no session uses."""
    red = make_image(tmp_path / "red.png")
    blue = make_image(tmp_path / "blue.png", color=(0, 0, 200))
    (tmp_path / "notes.md").write_text("# notes\n", encoding="utf-8")
    notes = b"# notes\n"
    for files, text in ((["red.png"], "one"), (["notes.md"], "two"), (["blue.png", "red.png"], "three")):
        attached = [a for name in files for a in ("-f", str(tmp_path / name))]
        assert chatflow("chat", "-s", "s", *attached, text).returncode == 0
    assert stored(database) == {sha(red): red, sha(notes): notes, sha(blue): blue}

    fork = chatflow("sessions", "fork", "s", "--at", "1", "--into", "f")
    assert fork.returncode == 0, fork
    assert used_by(database, "f") == {sha(red)} and len(stored(database)) == 3
    assert [a["name"] for t in chatflow("sessions", "show", "f", "--json").json()["turns"]
            for m in t["messages"] for a in m.get("attachments", [])] == ["red.png"]
    assert chatflow("chat", "-s", "f", "and?").returncode == 0  # the fork sends its file, read from the database
    assert provider.requests[-1]["messages"][1]["content"][1]["image_url"]["url"].endswith(
        base64.b64encode(red).decode())

    done = chatflow("sessions", "rollback", "s", "--to", "1", "--yes")
    assert done.returncode == 0, done
    assert [t["number"] for t in chatflow("sessions", "show", "s", "--json").json()["turns"]] == [1]
    kept = chatflow("sessions", "show", "s", "--json", "--all").json()["turns"]
    assert [[a["name"] for m in t["messages"] for a in m.get("attachments", [])] for t in kept] == [
        ["red.png"], ["notes.md"], ["blue.png", "red.png"]]
    assert used_by(database, "s") == {sha(red), sha(notes), sha(blue)} and len(stored(database)) == 3

    assert chatflow("sessions", "delete", "s", "--yes").returncode == 0
    assert stored(database) == {sha(red): red} and used_by(database, "s") == set()  # f still uses it
    assert chatflow("sessions", "delete", "f", "--yes").returncode == 0
    assert stored(database) == {} and database.execute("SELECT count(*) FROM chatflow_attachment_refs") == [(0,)]
