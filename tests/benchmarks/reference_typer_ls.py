"""The reference script of issue 2: one typer app whose ``ls`` opens the SQLite file,
selects 50 rows and prints them in a ``rich.table.Table``.

``chatflow sessions ls`` and ``chatflow --help`` are benchmarked against
``python reference_typer_ls.py ls`` and ``python reference_typer_ls.py --help``
(tests/benchmarks/bench_cli.py). The database is chatflow's: ``$CHATFLOW_HOME/chatflow.db``.
"""

import os
import sqlite3

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer()


@app.command()
def ls() -> None:
    """List the 50 most recently updated sessions."""
    path = os.path.join(os.environ["CHATFLOW_HOME"], "chatflow.db")
    conn = sqlite3.connect(path)
    cursor = conn.execute(
        "SELECT session_id, active_agent_name, status, turn_count, updated_at_utc"
        " FROM chatflow_sessions ORDER BY updated_at_utc DESC LIMIT 50"
    )
    table = Table()
    for column in cursor.description:
        table.add_column(column[0])
    for row in cursor:
        table.add_row(*(str(value) for value in row))
    Console().print(table)


@app.command()
def show() -> None:
    """A second command, so that typer builds a group as chatflow's does."""


if __name__ == "__main__":
    app()
