"""The REPL's slash commands: /show --full, /sessions at 80 columns, /rollback 0, /retry,
suggestions for unknown commands, /switch and /new with each session's own model."""

from __future__ import annotations

import pytest

from tests.helpers.pty_driver import leave
from tests.helpers.repl_driver import recording_output, turn_done
from tests.helpers.sent import sent
from tests.helpers.stored import open_store
from tests.helpers.vt import Terminal, written_rows
from tests.repl import tools_for_repl
from tests.repl.tools_for_repl import lookup_agent


def test_show_full_prints_a_folded_tool_result_whole(repl_driver) -> None:
    d = repl_driver
    d.write_config(lookup_agent("slow_lookup"))
    tools_for_repl.release.set()
    long_query = "q" * 700 + "END"
    d.server.add_tool_calls([("call_q", "slow_lookup", '{"query": "' + long_query + '"}')])
    d.server.add_text("Done looking.")
    marks = {}

    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("find it\r")
        turn_done(d, "Done looking.")
        marks["folded"] = d.screen()
        d.type("/show\r")
        d.wait_text("Turn 1")
        marks["show"] = d.screen()
        d.type("/show --full\r")
        d.wait_text("Turn 1", count=2)
        d.wait_prompt()  # /show --full has printed everything
        marks["full"] = d.screen()

    d.run(script)
    joined = " ".join(marks["folded"].split())
    assert "/show has them all with --full" in joined  # the fold says how to see everything
    assert "END" not in marks["show"]  # /show folds like the live lines
    full = marks["full"][len(marks["show"]) :]
    assert "error" not in full
    assert long_query in "".join(full.split()), "/show --full must print the whole argument and result"
    term = Terminal(80, 24)
    term.feed(d.out.getvalue())
    padded = [row for row in written_rows(term) if row and row[-1] == " "]
    assert not padded, "REPL output is padded with spaces: " + "".join(c or " " for c in padded[0])


def test_sessions_list_keeps_whole_ids_at_80_columns(repl_driver) -> None:
    d = repl_driver
    d.write_config('[[agents]]\nname = "CustomerSupportEscalations"\ninstructions = "You help."\n')
    ids = []

    def script(d) -> None:
        d.wait_text("Enter sends")
        for n in range(3):
            text = f"question number {n} " + "with a long preview that cannot fit " * 4
            d.type(text + "\r")
            turn_done(d, f"ok: question number {n}")
            ids.append(d.store().latest_session_id())
            d.type("/new\r")
            d.wait_text("new session", count=n + 1)
        d.type("/sessions\r")
        d.wait_text(ids[0], count=2)
        d.wait_prompt()  # the whole listing is printed

    d.run(script)
    screen = d.screen()
    listing = screen[screen.rindex("/sessions") :] if "/sessions" in screen else screen
    term = Terminal(80, 24)
    term.feed(d.out.getvalue())
    rows = term.lines()
    for sid in ids:
        assert any(sid in row for row in rows), f"{sid} is cut in the list:\n{listing}"
        row = next(row for row in rows if sid in row and "turn" in row)
        assert "CustomerS" in row and "1 turn" in row and f"question number {ids.index(sid)}" in row
        assert len(row) <= 80


def test_session_lines_drop_the_preview_before_cutting_an_id() -> None:
    from chatflow_cli.core.memory import SessionSummary
    from chatflow_cli.core.events import SessionStatus  # noqa: F401 - the status type
    from chatflow_cli.render import sessions_lines

    summaries = [
        SessionSummary(
            f"2024{n}101-120000-abcdef-with-a-long-suffix",
            "Agent" * 5,
            "idle",
            n,
            40,
            0.0,
            1000.0,
            "a preview " * 10,
            {},
        )
        for n in range(3)
    ]
    for width in (80, 60, 40):
        lines = [line.plain for line in sessions_lines(summaries, width=width, now=1060.0, compact=True)]
        for s, line in zip(summaries, lines):
            assert s.session_id in line
            assert len(line) <= max(width, len(s.session_id) + 2)
            assert line == line.rstrip()
    wide = [line.plain for line in sessions_lines(summaries, width=120, now=1060.0, compact=True)]
    assert all("a preview" in line for line in wide)


def test_a_lone_slash_gets_no_far_fetched_suggestion(repl_driver) -> None:
    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("/ hello\r")
        d.wait_text("unknown command")
        d.type("/shwo\r")
        d.wait_text("did you mean /show?")

    repl_driver.run(script)
    screen = repl_driver.screen()
    first = next(line for line in screen.splitlines() if "unknown command /" in line and "shwo" not in line)
    assert "did you mean" not in first and "/help lists them" in first
    assert repl_driver.requests() == []


def test_rollback_0_asks_to_remove_every_turn(repl_driver) -> None:
    drawn, output = recording_output(repl_driver)

    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("one\r")
        turn_done(d, "ok: one")
        d.type("/rollback 0\r")
        d.wait_for(lambda: "[y/N]" in drawn.getvalue(), what="the question")
        d.type("n\r")
        d.wait_text("nothing was changed")

    repl_driver.run(script, output=output)
    question = drawn.getvalue()
    assert "Remove every turn" in question and "keep only system messages" in question
    assert "1..0" not in question


# ------------------------------------------------------------------ /show marks interrupted turns
def test_show_marks_an_interrupted_turn_as_sessions_show_does(repl_driver) -> None:
    d = repl_driver
    d.server.add_text("Half an ans", chunks=["Half ", "an ans"], finish_reason=None)
    marks = {}

    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("hello\r")
        d.wait_text("did not finish")
        d.type("/show\r")
        d.wait_text("Turn 1 · interrupted")
        marks["show"] = d.screen()

    d.run(script)
    assert "Half an ans" in marks["show"].split("Turn 1 · interrupted", 1)[1]


def test_retry_after_reopening_sends_the_failed_message_and_keeps_the_good_turn(provider, chatflow, pty_chatflow) -> None:
    assert chatflow("chat", "-s", "r1", "first").returncode == 0
    provider.add_error(400, {"error": {"message": "bad request", "type": "invalid_request_error"}})
    repl = pty_chatflow("chat", "-s", "r1")
    repl.wait_prompt()
    repl.send("the message that failed\r")
    repl.wait_prompt_after("error:")
    repl.send("/exit\r")
    assert repl.wait_exit() == 0

    repl = pty_chatflow("chat", "-s", "r1")
    repl.wait_text("your last message failed: /retry sends it again")
    repl.wait_prompt()
    repl.send("/retry\r")
    repl.wait_prompt_after("ok: the message that failed")
    screen = repl.screen()
    assert "rolled back" not in screen and "retrying turn 1" not in screen
    assert sent(provider.requests) == ["first", "the message that failed", "the message that failed"]
    with open_store() as st:
        session = st.get("r1")
        assert session.turn_count == 2
        assert [t.messages[0].content for t in session.turns] == ["first", "the message that failed"]

    # Nothing failed now: /retry says so, and a completed turn is rolled back only when asked.
    repl.send("/retry\r")
    repl.wait_text("Nothing failed: turn 2 completed")
    repl.send("n\r")
    repl.wait_text("nothing was changed")
    leave(repl)
    assert len(sent(provider.requests)) == 3
    with open_store() as st:
        assert st.get("r1").turn_count == 2


def test_retry_of_a_completed_turn_removes_the_newest_turn_as_stored_when_confirmed(
        provider, chatflow, pty_chatflow) -> None:
    """/retry asks before it rolls back; a turn another process adds while the question is
    open is the one removed and sent again (the store picks the newest turn as it writes),
    and the turn the question named stays."""
    assert chatflow("chat", "-s", "rr", "first").returncode == 0
    repl = pty_chatflow("chat", "-s", "rr")
    repl.wait_prompt()
    repl.send("/retry\r")
    repl.wait_text("Nothing failed: turn 1 completed")
    assert chatflow("chat", "-s", "rr", "second").returncode == 0  # meanwhile, another process
    repl.send("y\r")
    repl.wait_prompt_after("ok: second")
    assert "turn 2 rolled back; sending its message again" in repl.screen()
    leave(repl)
    assert sent(provider.requests) == ["first", "second", "second"]
    with open_store() as st:
        session = st.get("rr")
        assert [t.messages[0].content for t in session.turns] == ["first", "second"]


def test_retry_in_a_new_session_with_nothing_sent_says_nothing_failed(provider, pty_chatflow) -> None:
    repl = pty_chatflow("chat", "-s", "empty")
    repl.wait_prompt()
    repl.send("/retry\r")
    repl.wait_text("nothing failed: there is nothing to retry")
    leave(repl)
    assert sent(provider.requests) == []


def test_did_you_mean_reads_as_a_sentence(provider, pty_chatflow) -> None:
    repl = pty_chatflow("chat", "-s", "typo")
    repl.wait_prompt()
    repl.send("/claer\r")
    repl.wait_text("did you mean /clear?")
    leave(repl)
    rows = repl.screen().splitlines()
    at = next(i for i, row in enumerate(rows) if "did you mean" in row)
    assert "?;" not in rows[at]
    # wrapped between words at the 100 columns, like every notice
    assert [row.rstrip() for row in rows[at:at + 2]] == [
        "error: unknown command /claer — did you mean /clear? (/help lists them; start a message with // to",
        "send a slash)",
    ]
    assert sent(provider.requests) == []


# ------------------------------------------------------------------ /switch and /new: the session's model
def test_switch_talks_to_the_other_sessions_model_and_new_to_the_default(provider, chatflow, pty_chatflow) -> None:
    """``/switch ID`` uses the model stored with ID (as ``chatflow chat -s ID`` does) and says
    so; ``/new`` goes back to the configured model; each session keeps its own."""
    assert chatflow("chat", "-s", "sa", "-m", "model-a", "one").returncode == 0
    assert chatflow("chat", "-s", "sb", "-m", "model-b", "two").returncode == 0
    repl = pty_chatflow("chat", "-s", "sa")
    repl.wait_prompt()
    repl.send("/switch sb\r")
    repl.wait_prompt_after("model: model-b (session sb)")
    repl.send("three\r")
    repl.wait_for(lambda: sent(provider.requests)[-1:] == ["three"], what="the message after /switch")
    repl.wait_prompt(count=3)
    assert provider.requests[-1]["model"] == "model-b"
    repl.send("/switch sa\r")
    repl.wait_prompt_after("model: model-a (session sa)")
    repl.send("four\r")
    repl.wait_for(lambda: sent(provider.requests)[-1:] == ["four"], what="the message after /switch back")
    assert provider.requests[-1]["model"] == "model-a"
    repl.wait_prompt(count=5)
    repl.send("/new\r")
    repl.wait_prompt_after("model: fake-model (a new session)")
    repl.send("five\r")
    repl.wait_for(lambda: sent(provider.requests)[-1:] == ["five"], what="the message in the new session")
    assert provider.requests[-1]["model"] == "fake-model"
    repl.wait_prompt(count=7)
    leave(repl)
    assert open_store().session_endpoint("sa")[0] == "model-a"
    assert open_store().session_endpoint("sb")[0] == "model-b"


def test_error_lines_wrap_between_words_on_a_narrow_terminal(provider, pty_chatflow) -> None:
    repl = pty_chatflow("chat", "-s", "narrow-errors", width=40)
    repl.wait_prompt()
    repl.send("/show --everything-at-once\r")
    repl.wait_prompt_after("--full")
    rows = [row.rstrip() for row in repl.rows()]
    leave(repl)
    at = next(i for i, row in enumerate(rows) if row.startswith("error: "))
    assert rows[at:at + 2] == ["error: /show --everything-at-once: the", "only option is --full"]


def test_switch_talks_to_the_other_sessions_endpoint_and_back(provider, chatflow, pty_chatflow) -> None:
    """``/switch ID`` to a session made with another ``--base-url`` sends the next message to
    that server (and says so); switching back and ``/new`` return to the default server."""
    from tests.helpers.fakeserver import FakeServer

    with FakeServer() as other:
        assert chatflow("chat", "-s", "far", "--base-url", other.url, "-m", "model-far", "one").returncode == 0
        assert chatflow("chat", "-s", "near", "zero").returncode == 0
        repl = pty_chatflow("chat", "-s", "near")
        repl.wait_prompt()
        repl.send("/switch far\r")
        repl.wait_prompt_after("model: model-far (session far)")
        assert f"endpoint: {other.url} (session far)" in " ".join(repl.screen().split())
        repl.send("two\r")
        repl.wait_prompt_after("ok: two")
        assert sent(other.requests) == ["one", "two"] and other.requests[-1]["model"] == "model-far"
        repl.send("/switch near\r")
        repl.wait_prompt_after("model: fake-model (session near)")
        repl.send("three\r")
        repl.wait_prompt_after("ok: three")
        assert sent(provider.requests) == ["zero", "three"]
        repl.send("/switch far\r")
        repl.wait_prompt_after("model: model-far (session far)")
        repl.send("/new\r")
        repl.wait_prompt_after("model: fake-model (a new session)")
        assert f"endpoint: {provider.url} (a new session)" in " ".join(repl.screen().split())
        repl.send("four\r")
        repl.wait_prompt_after("ok: four")
        assert sent(provider.requests) == ["zero", "three", "four"] and sent(other.requests) == ["one", "two"]
        leave(repl)
    assert open_store().session_endpoint("far") == ("model-far", other.url)
    assert open_store().session_endpoint("near") == ("fake-model", provider.url)


def test_switch_keeps_the_credentials_of_the_base_url_given_and_never_shows_them(provider, chatflow,
                                                                                 pty_chatflow) -> None:
    """A session stored without the ``user:password@`` of its endpoint: ``/switch`` back to it
    in a REPL given that endpoint with credentials talks to it with them; no announcement
    shows the password, and the sessions keep the URL without it."""
    from tests.helpers.fakeserver import FakeServer

    with FakeServer() as other:
        secret_url = other.url.replace("http://", "http://u:S3cretPw@")
        assert chatflow("chat", "-s", "far", "--base-url", secret_url, "one").returncode == 0
        assert chatflow("chat", "-s", "near", "zero").returncode == 0
        repl = pty_chatflow("chat", "-s", "far", "--base-url", secret_url)
        repl.wait_prompt()
        repl.send("/switch near\r")
        repl.wait_prompt_after(f"endpoint: {provider.url} (session near)")
        repl.send("/switch far\r")
        repl.wait_prompt_after(f"endpoint: {other.url} (session far)")
        repl.send("two\r")
        repl.wait_prompt_after("ok: two")
        assert sent(other.requests) == ["one", "two"]
        assert other.log[-1].headers.get("authorization", "").startswith("Basic "), "the credentials were dropped"
        repl.send("/switch near\r")
        repl.wait_prompt_after(f"endpoint: {provider.url} (session near)")
        repl.send("/new\r")
        repl.wait_prompt_after(f"endpoint: {other.url} (a new session)")
        leave(repl)
        assert "S3cretPw" not in repl.raw
    assert open_store().session_endpoint("far")[1] == other.url


def test_yes_no_questions_wrap_between_words_on_a_narrow_terminal(provider, chatflow, pty_chatflow) -> None:
    """``/rollback 0`` in the REPL and ``sessions delete`` on a terminal ask at 40 columns
    with every word whole, as notices are wrapped."""
    assert chatflow("chat", "-s", "ask40", "hello").returncode == 0
    repl = pty_chatflow("chat", "-s", "ask40", width=40)
    repl.wait_prompt()
    repl.send("/rollback 0\r")
    repl.wait_text("[y/N]")
    rows = [row.rstrip() for row in repl.rows()]
    repl.send("n\r")
    repl.wait_prompt_after("nothing was changed")  # not "n": the toolbar drawn after the prompt has one
    leave(repl)
    end = next(i for i, row in enumerate(rows) if "[y/N]" in row)
    start = next(i for i in range(end, -1, -1) if rows[i].startswith("Remove every turn"))
    assert all(len(row) <= 40 for row in rows[start:end + 1])
    assert " ".join(rows[start:end + 1]).split() == "Remove every turn (turn 1; keep only system messages)? [y/N]".split()

    delete = pty_chatflow("sessions", "delete", "ask40", width=40)
    delete.wait_text("[y/N]")
    asked = [row.rstrip() for row in delete.rows() if row.strip()]
    delete.send("n\r")
    assert delete.wait_exit() == 0
    assert all(len(row) <= 40 for row in asked)
    words = " ".join(asked).split()
    assert words[words.index("events?") - 1:words.index("[y/N]") + 1] == "and events? This cannot be undone. [y/N]".split()


def test_attach_sends_a_file_with_the_next_message_only(repl_driver, tmp_path) -> None:
    d = repl_driver
    (tmp_path / "notes.md").write_text("# Plan\nship it\n", encoding="utf-8")
    (tmp_path / "empty.txt").write_bytes(b"")

    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type(f"/attach {tmp_path / 'empty.txt'}\r")
        d.wait_text("the file is empty")
        d.type(f"/attach {tmp_path / 'notes.md'}\r")
        d.wait_text("sent with your next message")
        d.type("read it\r")
        turn_done(d, "ok: read it")
        d.type("and now?\r")
        turn_done(d, "ok: and now?")

    d.run(script)
    first, second = [r["messages"][-1]["content"] for r in d.server.requests]
    assert first == [{"type": "text", "text": "read it"},
                     {"type": "text", "text": "File notes.md:\n```\n# Plan\nship it\n```"}]
    assert second == "and now?"  # sent once; the first turn keeps it in the window


def test_retry_after_reopening_sends_the_failed_message_with_its_files(provider, chatflow, pty_chatflow,
                                                                        tmp_path) -> None:
    """A model that refuses images fails the turn and keeps the message; the REPL opened
    again sends it with /retry, files included, without attaching them again (their bytes
    come from the database, where they are still one copy): refused again in one line on the
    same model, then sent by /retry after /model switches to a vision model."""
    import base64
    import io
    import os
    import sqlite3
    from pathlib import Path

    Image = pytest.importorskip("PIL.Image")
    buffer = io.BytesIO()
    Image.new("RGB", (16, 8), (0, 0, 255)).save(buffer, format="PNG")
    (tmp_path / "shot.png").write_bytes(buffer.getvalue())
    r = chatflow("chat", "-s", "v1", "-m", "fake-text-only", "-f", str(tmp_path / "shot.png"), "what is it?")
    assert r.returncode == 5 and "does not accept images" in r.stderr, r
    repl = pty_chatflow("chat", "-s", "v1", "-m", "fake-text-only")
    repl.wait_text("your last message failed: /retry sends it again")
    repl.wait_prompt()
    repl.send("/retry\r")
    repl.wait_prompt_after("does not accept images")
    assert "error: model fake-text-only does not accept images (the provider said: " in repl.screen()
    repl.send("/model fake-model\r")
    repl.wait_prompt_after("model: fake-model (from the next message)")  # the toolbar names it too
    repl.send("/retry\r")
    repl.wait_prompt_after("ok: what is it?")
    leave(repl)
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    assert [r["model"] for r in provider.requests] == ["fake-text-only", "fake-text-only", "fake-model"]
    parts = {"role": "user", "content": [{"type": "text", "text": "what is it?"},
                                         {"type": "image_url", "image_url": {"url": url}}]}
    assert [r["messages"][-1] for r in provider.requests] == [parts] * 3
    with open_store() as st:
        [turn] = st.get("v1").turns
        assert turn.messages[0].attachments[0].name == "shot.png"
    with sqlite3.connect(Path(os.environ["CHATFLOW_HOME"]) / "chatflow.db") as conn:
        assert conn.execute("SELECT count(*) FROM chatflow_attachments").fetchone()[0] == 1
