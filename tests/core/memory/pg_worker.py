"""A worker process on a shared PostgreSQL store, for the cross-process tests.

``python -m tests.core.memory.pg_worker MODE DSN BASE_URL [ARGS...]`` runs a real Runner on a real
:class:`PostgresSessionStore` against the fake model server at ``BASE_URL`` and prints one
JSON line with what it did. ``CHATFLOW_TEST_HOST`` makes its turn owners claim another host
name (a "host" whose pids the other workers cannot see); ``CHATFLOW_TEST_LEASE`` sets the
store's lease in seconds.

Modes:

* ``turns P N``: N turns on session ``own-P`` and N on ``shared``, interleaved (waiting up
  to 120 s for the shared session);
* ``claim I MESSAGE_ID``: one turn on ``hook-I`` under a webhook message id;
* ``hold SESSION``: begin one turn and print ``{"begun": turn}``, then sleep (the test kills it);
* ``fleet W N S``: N webhook deliveries ``w{W}-m{k}`` on sessions ``c0``..``c{S-1}`` with
  ``run(message_id=...)``, each failure delivered again (up to 60 times, 0.2 s apart) and
  each success delivered a second time (it must replay the same answer); prints
  ``{"answers": {message id: content}, "errors": [each error, once per kind]}``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


_CURRENT: Any = None


def _owner() -> Any:
    from chatflow_cli.core.memory import Owner

    me = _CURRENT() if _CURRENT is not None else Owner.current()
    host = os.environ.get("CHATFLOW_TEST_HOST")
    return Owner(me.pid, me.start_time, host, me.token) if host else me


def main(argv: list[str]) -> int:
    mode, dsn, base_url, *rest = argv
    from chatflow_cli.core import memory
    from chatflow_cli.core.agents import Agent
    from chatflow_cli.core.messages import Message
    from chatflow_cli.core.model import ModelClient
    from chatflow_cli.core.memory.postgres import PostgresSessionStore
    from chatflow_cli.core.runner import Runner

    global _CURRENT
    if os.environ.get("CHATFLOW_TEST_HOST"):
        _CURRENT = memory.Owner.current
        memory.Owner.current = classmethod(lambda cls: _owner())  # type: ignore[method-assign,assignment]
    lease = float(os.environ.get("CHATFLOW_TEST_LEASE", "30"))
    store = PostgresSessionStore(dsn, lease_s=lease)
    agent = Agent(name="Assistant", instructions="Be brief.", model="fake-model")
    runner = Runner(agent, store, model_client=ModelClient(base_url=base_url, api_key="test-key"))
    if mode == "turns":
        p, n = int(rest[0]), int(rest[1])
        errors: list[str] = []
        done = 0
        for k in range(n):
            for session, text in ((f"own-{p}", f"p{p} own t{k}"), ("shared", f"p{p} shared t{k}")):
                try:
                    result = runner.run(session, text, wait=120)
                    assert result.content == f"ok: {text}", result.content
                    done += 1
                except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on it
                    errors.append(f"{type(exc).__name__}: {exc}")
        print(json.dumps({"done": done, "errors": errors}), flush=True)
    elif mode == "claim":
        i, message_id = int(rest[0]), rest[1]
        result = runner.run(f"hook-{i}", "order status?", message_id=message_id, wait=120)
        print(json.dumps({"content": result.content, "replayed": bool(result.replayed)}), flush=True)
    elif mode == "fleet":
        w, n, sessions = int(rest[0]), int(rest[1]), int(rest[2])
        answers: dict[str, str] = {}
        seen: set[str] = set()
        for k in range(n):
            message_id, session = f"w{w}-m{k}", f"c{(w + k) % sessions}"
            text = f"message {message_id}"
            for _attempt in range(60):
                try:
                    result = runner.run(session, text, message_id=message_id, wait=30)
                    again = runner.run(session, text, message_id=message_id, wait=30)
                    if again.content != result.content or not again.replayed:
                        seen.add(f"redelivery differs: {result.content!r} then {again.content!r}")
                    answers[message_id] = str(result.content)
                    break
                except Exception as exc:  # noqa: BLE001 - the platform delivers it again
                    kind = f"{type(exc).__name__}: {str(exc)[:160]}"
                    seen.add(kind)
                    time.sleep(0.2)
        print(json.dumps({"answers": answers, "errors": sorted(seen)}), flush=True)
    elif mode == "hold":
        start = store.begin_turn(rest[0], default_agent=agent, user_message=Message.user("a long question"),
                                 owner=_owner())
        print(json.dumps({"begun": start.turn, "pid": os.getpid()}), flush=True)
        session = start.session  # held: the lease is renewed while this process lives
        while session is not None:
            time.sleep(1)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
