"""``/search``, ``/fork`` and ``/title`` in the REPL (the real REPL on a pipe-driven terminal)."""

from __future__ import annotations


def test_search_fork_and_title(repl_driver) -> None:
    def script(d) -> None:
        d.wait_text("Enter sends")
        d.type("the zeppelin plan\r")
        d.wait_text("ok: the zeppelin plan")
        d.type("second step\r")
        d.wait_text("ok: second step")
        d.type("/search zeppelin\r")
        d.wait_text("turn 1")
        d.type('/search "\r')
        d.wait_text("unbalanced")
        d.type("/title Airship\r")
        d.wait_text("title: Airship")
        d.type("/fork 0\r")
        d.wait_text("N is a turn number 1..2")
        d.type("/fork 1\r")
        d.wait_text("forked")
        d.type("branch message\r")
        d.wait_text("ok: branch message")

    repl_driver.run(script)
    store = repl_driver.store()
    summaries = {s.session_id: s for s in store.list_sessions()}
    [fork] = [s for s in summaries.values() if s.forked_from]
    source = summaries[fork.forked_from["session_id"]]
    assert fork.forked_from["turn"] == 1 and source.title == "Airship"
    assert [r.number for r in store.load_turns(fork.session_id)] == [1, 2]
    assert [m.content for m in store.load_turns(fork.session_id)[1].messages][0] == "branch message"
    assert source.turn_count == 2  # the source is untouched
    assert len(summaries) == 2  # /fork 0 made nothing
    assert fork.title == "Airship (fork)"
    assert store.session_endpoint(source.session_id)[0] is not None
    assert store.session_endpoint(fork.session_id) == store.session_endpoint(source.session_id)
