"""The package's public surface: a sorted ``__all__`` whose every name resolves."""

import subprocess
import sys

import chatflow_cli


def test_all_is_sorted_and_complete() -> None:
    assert chatflow_cli.__all__ == sorted(chatflow_cli.__all__)
    assert set(chatflow_cli.__all__) == set(chatflow_cli._EXPORTS) | {"__version__"}
    for name in chatflow_cli.__all__:
        assert getattr(chatflow_cli, name) is not None


def test_the_documented_import_paths_resolve_and_the_dedup_ttl_is_192_hours() -> None:
    from chatflow_cli import Agent, Runner, SessionStore, SQLiteSessionStore, tool  # noqa: F401
    from chatflow_cli.core.memory import (  # noqa: F401
        DEFAULT_DEDUP_TTL_HOURS,
        BaseSessionStore,
        SessionContext,
        SessionDeletedError,
    )

    assert DEFAULT_DEDUP_TTL_HOURS == 192
    assert SessionStore is chatflow_cli.core.memory.SessionStore


def test_importing_the_library_loads_no_front_end_or_heavy_package() -> None:
    code = (
        "import sys; from chatflow_cli import Agent, Runner, SQLiteSessionStore, tool; "
        "print(sorted(m for m in ('typer', 'rich', 'prompt_toolkit', 'llama_cpp', 'openai') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_public_errors_are_exported() -> None:
    import chatflow_cli
    from chatflow_cli.core.errors import InvalidToolCallError, StreamBrokenError

    assert chatflow_cli.StreamBrokenError is StreamBrokenError
    assert chatflow_cli.InvalidToolCallError is InvalidToolCallError
