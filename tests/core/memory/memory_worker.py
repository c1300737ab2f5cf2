"""A worker process writing one memory document, for the concurrent-writers test.

``python -m tests.core.memory.memory_worker PLACE WORKER ROUNDS``: PLACE is a SQLite file or
a PostgreSQL URL. Each round reads ``shared.md`` and writes it back with one more line
``w{WORKER}-r{ROUND}`` (expecting the version it read), or, every third round, replaces
the passage ``tally`` it read (a stale read makes either fail). Prints one JSON line:
``{"accepted": {tag: seq}, "rejected": {tag: error message}}``.
"""

from __future__ import annotations

import json
import sys


def main(place: str, worker: int, rounds: int) -> None:
    from chatflow_cli.core.errors import MemoryConflictError
    from chatflow_cli.core.resources.documents import Author

    if place.startswith("postgresql://"):
        from chatflow_cli.core.memory.postgres import PostgresSessionStore

        store: object = PostgresSessionStore(place)
    else:
        from chatflow_cli.core.sqlite_store import SQLiteSessionStore

        store = SQLiteSessionStore(place)
    accepted: dict[str, int] = {}
    rejected: dict[str, str] = {}
    who = Author(f"worker-{worker}", 1, "writer")
    for round_ in range(rounds):
        tag = f"w{worker}-r{round_}"
        doc = store.read_document("notes", "shared.md")  # type: ignore[attr-defined]
        try:
            if round_ % 3 == 2:
                tally = doc.text.splitlines()[0]
                v = store.replace_in_document("notes", "shared.md", tally + "\n",  # type: ignore[attr-defined]
                                              f"{tally}|{tag}\n", author=who)
            else:
                v = store.write_document("notes", "shared.md", doc.text + tag + "\n",  # type: ignore[attr-defined]
                                         expected_version=doc.version, author=who)
            accepted[tag] = v.seq
        except MemoryConflictError as exc:
            rejected[tag] = exc.message
    print(json.dumps({"accepted": accepted, "rejected": rejected}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
