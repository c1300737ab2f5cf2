"""Behaviour only the in-memory SessionStore has: how its de-duplication scales."""

from __future__ import annotations

import pytest

from chatflow_cli.core.memory import DEFAULT_DEDUP_TTL_HOURS, SessionStore

from tests.helpers.clock import FakeClock

TTL_S = DEFAULT_DEDUP_TTL_HOURS * 3600.0


@pytest.mark.timeout(60)  # a scan of every live id per call takes minutes for 50,000 ids
def test_dedup_with_50000_ids_examines_each_entry_a_bounded_number_of_times() -> None:
    store = SessionStore()
    clock = FakeClock()
    store.clock = clock
    t0 = clock.now
    step = 20.0  # 50,000 ids over 1,000,000 s: the first ~15,000 expire on the way
    n = 50_000
    for i in range(n):
        assert store.claim_message(f"id-{i}") is True
        if i % 2:
            store.mark_message_processed(f"id-{i}")  # a re-mark of a live id
        clock.advance(step)
    last_purge = clock.now - step
    expected_live = {f"id-{i}" for i in range(n) if last_purge < t0 + i * step + TTL_S}
    assert 0 < len(expected_live) < n
    assert set(store._processed.at) == expected_live  # expired ids were purged, live ones kept
    # each queue entry (one per claim or mark) is examined at most once by the purges
    assert store._processed.scanned <= n + n // 2
    assert not store.is_message_processed("id-0")
    assert store.is_message_processed(f"id-{n - 1}")


def test_dedup_purge_stays_right_when_the_clock_goes_back() -> None:
    store = SessionStore()
    clock = FakeClock()
    store.clock = clock
    t0 = clock.now
    for i in range(100):
        store.mark_message_processed(f"late-{i}")
    clock.now = t0 - 1000.0  # a wall-clock step back: the marking order is no longer time order
    for i in range(100):
        store.mark_message_processed(f"early-{i}")
    clock.now = t0 - 1000.0 + TTL_S  # the early ids expired, the late ones are still live
    for i in range(300):  # enough calls for the periodic full sweep
        store.claim_message(f"new-{i}")
    assert not any(k.startswith("early-") for k in store._processed.at)
    assert all(store.is_message_processed(f"late-{i}") for i in range(100))
    assert not store.is_message_processed("early-0")
