"""Everything chatflow takes from typer's private modules, in one place.

typer >= 0.26 carries its own copy of click as ``typer._click`` and keeps its completion
scripts and value coercion in private modules. chatflow needs a few of their names: click's
exception classes (the error boundary), the ``--help`` option decorator and the runtime
coercer class (:mod:`chatflow_cli._typer_fast`), the completion scripts and the completion
classes (``chatflow completion``, shell completion). This module is the only one that imports
them (a test in ``tests/test_layering.py`` checks it), so a typer release that moves them
means one file to change.

Every function imports its typer module when called, never at import time: the modules
are loaded on the paths that need them only, as before (``chatflow --help`` start-up is
measured by ``tests/cli/test_lazy_imports.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

__all__ = [
    "bad_parameter",
    "click_exceptions",
    "completion_init",
    "completion_script",
    "help_option",
    "lite_runtime_param_class",
    "signatures_read_once",
    "usage_error",
]


def click_exceptions() -> ModuleType:
    """typer's click exception module (``UsageError``, ``NoArgsIsHelpError``,
    ``ClickException``, ``BadParameter``...), for ``except`` clauses."""
    from typer._click import exceptions

    return exceptions


def usage_error(message: str, ctx: Any) -> Exception:
    """click's ``UsageError`` for ``message`` in the context ``ctx`` (exit 2 at the
    boundary, with a ``--help`` hint naming the command)."""
    error: Exception = click_exceptions().UsageError(message, ctx=ctx)
    return error


def bad_parameter(message: str, param: Any, ctx: Any) -> Exception:
    """click's ``BadParameter`` for ``message`` about ``param`` (exit 2 at the boundary,
    the message naming the option)."""
    error: Exception = click_exceptions().BadParameter(message, ctx=ctx, param=param)
    return error


def help_option(names: list[str]) -> Any:
    """click's ``help_option`` decorator for the option names ``names``: applied to a
    command, it appends the ``--help`` option to the command's parameters."""
    from typer._click.decorators import help_option as make

    return make(names)


_LITE: Any = None


def lite_runtime_param_class() -> Any:
    """A subclass of typer's ``RuntimeParam`` (a frozen dataclass that coerces one
    parameter's values) whose coercion is its ``fn(value, param, ctx)`` field, made once:
    what :mod:`chatflow_cli._typer_fast` installs instead of typer's pydantic coercer.

    Raises:
        ImportError: this typer has no such class (another version).
    """
    global _LITE
    if _LITE is None:
        from typer._coercion import RuntimeParam

        @dataclasses.dataclass(frozen=True)
        class LiteRuntimeParam(RuntimeParam):
            fn: Callable[[Any, Any, Any], Any] = dataclasses.field(default=lambda v, p, c: v)

            def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
                return self.fn(value, param, ctx)

        _LITE = LiteRuntimeParam
    return _LITE


def completion_script(*, prog_name: str, complete_var: str, shell: str) -> str:
    """typer's completion script for ``shell`` (``bash``, ``zsh`` or ``fish``), for the
    program ``prog_name`` completed through the environment variable ``complete_var``."""
    from typer._completion_shared import get_completion_script

    script: str = get_completion_script(prog_name=prog_name, complete_var=complete_var, shell=shell)
    return script


def completion_init() -> None:
    """Register typer's shell completion classes with its click, as typer does before it
    answers a completion request (the completion variable is set)."""
    from typer._completion_classes import completion_init as init

    init()


@contextlib.contextmanager
def signatures_read_once() -> Iterator[None]:
    """While typer builds a click command, read each command function's parameters once.

    typer reads them twice per command (for the command's parameters, then for its callback's
    parameter names), each time with ``inspect.signature`` and an ``eval`` of every string
    annotation: about 30 ms of the build on every chatflow run. Within this block the second
    read returns the first one's result (typer only reads it). If typer has no such function
    any more, nothing is changed."""
    import typer.main

    main: Any = typer.main  # the function is not among typer.main's exported names
    original = getattr(main, "get_params_from_function", None)
    if original is None:
        yield
        return
    read: dict[Callable[..., Any], Any] = {}

    def once(func: Callable[..., Any]) -> Any:
        if func not in read:
            read[func] = original(func)
        return read[func]

    main.get_params_from_function = once
    try:
        yield
    finally:
        main.get_params_from_function = original
