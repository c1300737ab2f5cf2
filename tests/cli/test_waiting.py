"""What a one-shot chat shows while it waits: the spinner, a rate-limit retry, a busy session."""

from __future__ import annotations

import os

from tests.conftest import COMMAND, REPO
from tests.helpers.stored import session_running
from tests.helpers.terminal import pexpect_module, spawn_chatflow
from tests.helpers.wait import wait_until


SPINNER_FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


def test_busy_session_error_mentions_wait(chatflow, provider):
    import subprocess

    provider.add_text("slow answer", chunks=["slow", " answer"], delay=[0, 15, 0, 0])
    env = dict(os.environ, PYTHONPATH=str(REPO))
    first = subprocess.Popen([*COMMAND, "chat", "-s", "busy", "first"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
    try:
        wait_until(lambda: session_running(chatflow, "busy"), 30, "the first turn to run")
        r = chatflow("chat", "-s", "busy", "second")
        assert r.returncode == 4, r
        assert "is busy" in r.stderr and "--wait SECONDS" in r.stderr
    finally:
        first.communicate(timeout=30)


def test_one_shot_spinner_animates_and_names_a_rate_limit_retry(provider):
    pexpect = pexpect_module()
    provider.add_error(429, headers={"Retry-After": "2"}, message="slow down")
    provider.add_text("finally here")
    child = spawn_chatflow(["chat", "-s", "rl", "hi"])
    child.expect("rate limited, retrying in [12] s \\(2/3\\)")
    child.expect("finally here")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert len(provider.requests) == 2  # the retry was made


def test_one_shot_spinner_frames_change_while_waiting(provider):
    pexpect = pexpect_module()
    provider.add_text("late", chunks=["late"], delay=[1.5, 0, 0])
    child = spawn_chatflow(["chat", "-s", "spin", "hi"])
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    text = child.before.decode("utf-8", "replace")
    frames = {c for c in text if c in SPINNER_FRAMES}
    assert len(frames) >= 3, text  # the spinner advanced while nothing arrived
    assert "thinking" in text and "late" in text


def test_one_shot_wait_names_the_busy_session_and_its_pid(provider, chatflow):
    import subprocess

    pexpect = pexpect_module()
    provider.add_text("slow answer", chunks=["slow", " answer"], delay=[0, 8, 0, 0])
    provider.add_text("second answer")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    first = subprocess.Popen([*COMMAND, "chat", "-s", "bw", "first"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
    try:
        wait_until(lambda: session_running(chatflow, "bw"), 30, "the first turn to run")
        child = spawn_chatflow(["chat", "-s", "bw", "--wait", "30", "second"])
        # a turn runs: its owner's pid is named, also when this run joins the turn queue
        child.expect(f"session busy \\(pid {first.pid}\\), waiting up to 30 s")
        child.expect("second answer")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0
    finally:
        first.communicate(timeout=30)
