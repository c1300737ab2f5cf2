"""Where the message comes from: the argument, piped stdin, or both joined; empty input is
one usage error on every path."""

from __future__ import annotations

import pytest


def test_message_and_piped_stdin_are_joined(chatflow, provider):
    diff = "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-old\n+new\n"
    r = chatflow("chat", "-s", "rev", "review this", input=diff)
    assert r.returncode == 0, r
    assert provider.requests[0]["messages"][-1] == {"role": "user", "content": "review this\n\n" + diff.rstrip("\n")}


def test_message_with_empty_stdin_is_the_message_alone(chatflow, provider):
    r = chatflow("chat", "-s", "alone", "just this")  # stdin is /dev/null
    assert r.returncode == 0, r
    assert provider.requests[0]["messages"][-1]["content"] == "just this"


@pytest.mark.parametrize("args", [[], ["chat"], ["chat", "-"], ["chat", "-s", "e"], ["-s", "e"]])
def test_empty_input_is_one_usage_error_everywhere(chatflow, provider, args):
    r = chatflow(*args, input="  \n")
    assert r.returncode == 2, r
    assert "nothing to send: stdin was empty" in r.stderr
    assert provider.requests == []


@pytest.mark.parametrize("stdin", ["", "\n", "  \n\n"])
@pytest.mark.parametrize("output", [[], ["--json"]])
def test_empty_jsonl_input_is_a_usage_error_and_stores_nothing(chatflow, provider, stdin, output):
    r = chatflow("chat", "-s", "ej", "--input", "jsonl", *output, input=stdin)
    assert r.returncode == 2, r
    assert "--input jsonl: nothing to send: stdin had no lines" in (r.stdout if output else r.stderr)
    assert provider.requests == []
    assert chatflow("sessions", "show", "ej").returncode == 3
