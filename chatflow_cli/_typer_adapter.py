"""Everything chatflow takes from typer's private modules, in one place.

typer >= 0.26 carries its own copy of click as ``typer._click`` and keeps its completion
scripts and value coercion in private modules. chatflow needs a few of their names: click's
exception classes (the error boundary), the ``--help`` option decorator and the runtime
coercer class (:mod:`chatflow_cli._typer_fast`), the completion scripts and the completion
classes (``chatflow completion``, shell completion). This module is the only one that imports
them (a test in ``tests/test_layering.py`` checks it), so a typer release that moves them
means one file to change. :func:`lazy_group` builds the command tree from typer's own build
functions, each command when it is first looked up.

Every function imports its typer module when called, never at import time: the modules
are loaded on the paths that need them only, as before (``chatflow --help`` start-up is
measured by ``tests/cli/test_lazy_imports.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, MutableMapping
from types import ModuleType
from typing import Any

__all__ = [
    "LazyCommands",
    "bad_parameter",
    "click_exceptions",
    "completion_init",
    "completion_script",
    "help_option",
    "lazy_group",
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
def signatures_read_once(read: dict[Callable[..., Any], Any] | None = None) -> Iterator[None]:
    """While typer builds a click command, read each command function's parameters once.

    typer reads them twice per command (for the command's parameters, then for its callback's
    parameter names), each time with ``inspect.signature`` and an ``eval`` of every string
    annotation: about 30 ms of the build on every chatflow run. Within this block the second
    read returns the first one's result (typer only reads it); ``read`` keeps them across
    blocks (the completion functions many options share). If typer has no such function
    any more, nothing is changed."""
    import typer.main

    main: Any = typer.main  # the function is not among typer.main's exported names
    original = getattr(main, "get_params_from_function", None)
    if original is None:
        yield
        return
    if read is None:
        read = {}

    def once(func: Callable[..., Any]) -> Any:
        if func not in read:
            read[func] = original(func)
        return read[func]

    main.get_params_from_function = once
    try:
        yield
    finally:
        main.get_params_from_function = original


#: Called with each command :class:`LazyCommands` builds and the group it belongs to.
Shaper = Callable[[Any, Any], None]


class LazyCommands(MutableMapping[str, Any]):
    """A group's subcommands by name, in typer's order, each built by its maker the first
    time it is looked up (``group.commands[name]``, ``.get(name)``), then given to
    ``shape(command, group)``. Names, ``in`` and ``len`` build nothing: a run builds the
    commands it invokes (a group's help builds the group's commands, to list them)."""

    def __init__(self, makers: dict[str, Callable[[], Any]], shape: Shaper,
                 read: dict[Callable[..., Any], Any]) -> None:
        self._makers = makers
        self._built: dict[str, Any] = {}
        self._shape = shape
        self._read = read  # the parameters typer read, shared by the whole tree
        self.group: Any = None  # the group these are the commands of (set by lazy_group)

    def __getitem__(self, name: str) -> Any:
        if name not in self._built:
            maker = self._makers[name]  # KeyError: no such command
            with signatures_read_once(self._read):
                command = maker()
            self._shape(command, self.group)
            self._built[name] = command
        return self._built[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self._makers[name] = lambda: command
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        del self._makers[name]
        self._built.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._makers

    def __iter__(self) -> Iterator[str]:
        return iter(self._makers)

    def __len__(self) -> int:
        return len(self._makers)


def lazy_group(typer_app: Any, shape: Shaper) -> Any:
    """The click group ``typer.main.get_command(typer_app)`` builds, with the same
    commands, options and help, but each subcommand (and each subgroup's) built and given
    to ``shape`` only when it is first looked up (:class:`LazyCommands`): typer reads every
    command function's parameters to build it, about 10 ms for chatflow's whole tree on
    every run, of which a run needs its own command's. The root itself is not shaped here.

    Raises:
        TypeError: ``typer_app`` adds completion options or has a subgroup without a name
            (typer merges those into their parent; chatflow has none).
    """
    import typer.models

    if typer_app._add_completion:
        raise TypeError("lazy_group: an app with add_completion is not supported")
    options = {"pretty_exceptions_short": typer_app.pretty_exceptions_short,
               "rich_markup_mode": typer_app.rich_markup_mode}
    read: dict[Callable[..., Any], Any] = {}
    with signatures_read_once(read):
        return _lazy_group(typer.models.TyperInfo(typer_app), options, typer_app.suggest_commands, shape, read)


def _lazy_group(info: Any, options: dict[str, Any], suggest: bool, shape: Shaper,
                read: dict[Callable[..., Any], Any]) -> Any:
    """typer's ``get_group_from_info`` for ``info`` with no subcommand, then the
    subcommands as :class:`LazyCommands`, named and ordered as typer names and orders them."""
    import copy
    import functools

    import typer.main

    app = info.typer_instance
    makers: dict[str, Callable[[], Any]] = {}
    for command_info in app.registered_commands:
        name = command_info.name or typer.main.get_command_name(command_info.callback.__name__)
        makers[name] = functools.partial(typer.main.get_command_from_info, command_info, **options)
    for group_info in app.registered_groups:
        name = typer.main.solve_typer_info_defaults(group_info).name
        if not name:
            raise TypeError("lazy_group: a subgroup without a name is not supported")
        makers[name] = functools.partial(_lazy_group, group_info, options, suggest, shape, read)
    alone = copy.copy(app)  # the group's own options and help, without its commands
    alone.registered_commands = []
    alone.registered_groups = []
    bare = copy.copy(info)
    bare.typer_instance = alone
    group = typer.main.get_group_from_info(bare, suggest_commands=suggest, **options)
    commands = LazyCommands(makers, shape, read)
    commands.group = group
    group.commands = commands
    return group

