"""The command line over typer and click: the adapter to typer's private modules, option
coercion without pydantic, the global options, repeated options refused.

The adapter. typer >= 0.26 carries its own copy of click as ``typer._click`` and keeps its
completion scripts and value coercion in private modules. chatflow needs a few of their
names: click's exception classes (the error boundary), the ``--help`` option decorator and
the runtime coercer class (the light coercion below), the completion scripts and the
completion classes (``chatflow completion``, shell completion). This module is the only one
that imports them (a test in ``tests/test_layering.py`` checks it), so a typer release that
moves them means one file to change. :func:`lazy_group` builds the command tree from typer's
own build functions, each command when it is first looked up.

Every function imports its typer module when called, never at import time: the modules
are loaded on the paths that need them only, as before (``chatflow --help`` start-up is
measured by ``tests/cli/test_lazy_imports.py``).

Light coercion. typer 0.29 coerces every non-flag option value through a pydantic
``TypeAdapter`` built on first use (``_TyperParameter.get_runtime_param``); importing
pydantic for that costs about 70-100 ms on every run, more than the rest of ``chatflow
sessions ls`` (see the README's performance table). chatflow's options only use ``str``,
``int``, ``float``, ``bool``, ``Enum`` choices, ``list[str]`` and ``tuple[str, str]``: for
those, :func:`install_light_coercion` pre-sets the parameter's runtime coercer to a small one
with the same behaviour (the same ``BadParameter`` errors for bad numbers, ranges and
choices). Anything else keeps typer's own coercion. If typer's internals change shape,
nothing is installed and typer works as usual (only slower): it never changes behaviour.

The shape of chatflow's command line, applied to each click command typer builds: global
options anywhere (``chatflow sessions ls --db x``), no silent repeats of a single-value
option (exit 2), plain argument names in help (``ID``, ``[MESSAGE]``), and ``--tool-result
ID OUTPUT`` repeatable as a list of pairs. :func:`shape` applies them all to one command:
the root first, then each subcommand when it is built (a run builds the commands it
invokes, :func:`lazy_group`).

Option values typer has no type for: ``--metadata KEY=VALUE`` (:func:`parse_metadata`) and
durations such as ``30d`` (:func:`parse_duration`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, MutableMapping
from enum import Enum
from types import ModuleType
from typing import Any, get_args, get_origin

from .context import Env, state_of
from .core.errors import UsageError

__all__ = [
    "GLOBAL_OPTIONS",
    "LazyCommands",
    "add_global_options",
    "bad_parameter",
    "click_exceptions",
    "completion_init",
    "completion_script",
    "help_option",
    "install_light_coercion",
    "lazy_group",
    "lite_runtime_param_class",
    "parse_duration",
    "parse_metadata",
    "plain_argument_help",
    "refuse_repeats",
    "repeatable_pairs",
    "set_global",
    "shape",
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
    what :func:`install_light_coercion` installs instead of typer's pydantic coercer.

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
    ``shaper(command, group)``. Names, ``in`` and ``len`` build nothing: a run builds the
    commands it invokes (a group's help builds the group's commands, to list them)."""

    def __init__(self, makers: dict[str, Callable[[], Any]], shaper: Shaper,
                 read: dict[Callable[..., Any], Any]) -> None:
        self._makers = makers
        self._built: dict[str, Any] = {}
        self._shaper = shaper
        self._read = read  # the parameters typer read, shared by the whole tree
        self.group: Any = None  # the group these are the commands of (set by lazy_group)

    def __getitem__(self, name: str) -> Any:
        if name not in self._built:
            maker = self._makers[name]  # KeyError: no such command
            with signatures_read_once(self._read):
                command = maker()
            self._shaper(command, self.group)
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


def lazy_group(typer_app: Any, shaper: Shaper) -> Any:
    """The click group ``typer.main.get_command(typer_app)`` builds, with the same
    commands, options and help, but each subcommand (and each subgroup's) built and given
    to ``shaper`` only when it is first looked up (:class:`LazyCommands`): typer reads every
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
        return _lazy_group(typer.models.TyperInfo(typer_app), options, typer_app.suggest_commands, shaper, read)


def _lazy_group(info: Any, options: dict[str, Any], suggest: bool, shaper: Shaper,
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
        makers[name] = functools.partial(_lazy_group, group_info, options, suggest, shaper, read)
    alone = copy.copy(app)  # the group's own options and help, without its commands
    alone.registered_commands = []
    alone.registered_groups = []
    bare = copy.copy(info)
    bare.typer_instance = alone
    group = typer.main.get_group_from_info(bare, suggest_commands=suggest, **options)
    commands = LazyCommands(makers, shaper, read)
    commands.group = group
    group.commands = commands
    return group


# ---------------------------------------------------------------------------------------
# light coercion: typer's option values without pydantic
# ---------------------------------------------------------------------------------------
def _str(value: Any, param: Any, ctx: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _number(kind: type, info: Any) -> Callable[[Any, Any, Any], Any]:
    label = "integer" if kind is int else "float"

    def coerce(value: Any, param: Any, ctx: Any) -> Any:
        try:
            number = kind(value)
        except (TypeError, ValueError):
            raise bad_parameter(f"{value!r} is not a valid {label}.", param, ctx) from None
        low, high = info.min, info.max
        if (low is not None and number < low) or (high is not None and number > high):
            if getattr(info, "clamp", False):
                return kind(low) if low is not None and number < low else kind(high)
            bounds = " and ".join(
                b for b in (f"x>={low}" if low is not None else "", f"x<={high}" if high is not None else "") if b
            )
            raise bad_parameter(f"{value} is not in the range {bounds}.", param, ctx)
        return number

    return coerce


def _bool(value: Any, param: Any, ctx: Any) -> Any:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in {"1", "true", "t", "yes", "y", "on"}:
        return True
    if text in {"0", "false", "f", "no", "n", "off", ""}:
        return False
    raise bad_parameter(f"{value!r} is not a valid boolean.", param, ctx)


def _enum(kind: type[Enum], info: Any) -> Callable[[Any, Any, Any], Any]:
    case_sensitive = getattr(info, "case_sensitive", True)

    def coerce(value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, kind):
            return value
        for member in kind:
            wanted = str(member.value)
            if wanted == value or (not case_sensitive and wanted.lower() == str(value).lower()):
                return member
        choices = ", ".join(repr(str(m.value)) for m in kind)
        raise bad_parameter(f"{value!r} is not one of {choices}.", param, ctx)

    return coerce


def _coercer(annotation: Any, info: Any) -> Callable[[Any, Any, Any], Any] | None:
    if getattr(info, "parser", None) is not None or getattr(info, "formats", None):
        return None
    if annotation is str:
        return _str
    if annotation is bool:
        return _bool
    if annotation in (int, float):
        return _number(annotation, info)
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return _enum(annotation, info)
    origin = get_origin(annotation)
    if origin is list:
        (item,) = get_args(annotation) or (str,)
        inner = _coercer(item, info)
        if inner is None:
            return None
        return lambda value, p, c: [inner(v, p, c) for v in value]
    if origin is tuple:
        found = [_coercer(t, info) for t in get_args(annotation)]
        inners = [i for i in found if i is not None]
        if not inners or len(inners) != len(found) or Ellipsis in get_args(annotation):
            return None

        def coerce_tuple(value: Any, p: Any, c: Any) -> Any:
            if len(value) != len(inners):
                raise bad_parameter(f"{len(inners)} values are required, but {len(value)} given.", p, c)
            return tuple(fn(v, p, c) for fn, v in zip(inners, value))

        return coerce_tuple
    return None


def _help_param(cmd: Any, names: tuple[str, ...]) -> Any:
    """The command's ``--help`` option, made now as click would make it on first use."""
    if not getattr(cmd, "add_help_option", False) or not hasattr(cmd, "_help_option"):
        return None
    if cmd._help_option is None:
        taken = {opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts)}
        wanted = [n for n in names if n not in taken]
        if not wanted:
            return None
        help_option(wanted)(cmd)
        cmd._help_option = cmd.params.pop()
    return cmd._help_option


def install_light_coercion(cmd: Any, help_names: tuple[str, ...] = ("-h", "--help")) -> int:
    """Give every simple parameter of the command ``cmd`` (not its subcommands: each is
    given its own when built) a light coercer.

    ``help_names`` are the context's help option names (chatflow: ``-h``, ``--help``).
    Returns how many parameters got one (0 when typer's internals are not as expected).
    """
    try:
        lite = lite_runtime_param_class()
    except Exception:  # pragma: no cover - another typer version: keep its coercion
        return 0
    count = 0
    try:
        help_param = _help_param(cmd, help_names)
    except Exception:  # pragma: no cover
        help_param = None
    for param in [*cmd.params, *([help_param] if help_param is not None else [])]:
        desc = getattr(param, "type_descriptor", None)
        if desc is None or getattr(param, "_runtime_param", 1) is not None:
            continue
        if getattr(desc, "file_annotation", None) is not None:
            continue
        fn = _coercer(desc.annotation, desc.parameter_info)
        if fn is None:
            continue
        try:
            param._runtime_param = lite(parameter_info=desc.parameter_info, annotation=desc.annotation, fn=fn)
        except Exception:  # pragma: no cover
            return count
        count += 1
    return count


# ---------------------------------------------------------------------------------------
# the shape of the command line: global options, repeats refused, argument help
# ---------------------------------------------------------------------------------------
#: The root options that every command accepts too, wherever the user types them.
GLOBAL_OPTIONS = ("--db", "--config", "--debug", "--no-color")


def set_global(ctx: Any, param: Any, value: Any) -> None:
    """A global option given after the command: update the run's :class:`State`.

    ``--db`` or ``--config`` given already (before the command, or to an enclosing group) is a
    usage error naming the option; the flags ``--debug`` and ``--no-color`` may repeat."""
    if ctx.resilient_parsing or value in (None, False):
        return
    state = state_of(ctx)
    if param.name in ("db", "config") and getattr(state, param.name) is not None:
        # given before the command (or in an enclosing group) and again after it: which one
        # was meant is a guess, so it is refused as a repeat in one place is
        raise usage_error(
            f"--{param.name} was given more than once (before and after the command); it takes one value", ctx)
    if param.name == "db":
        state.db = value
    elif param.name == "config":
        state.config = value
        state.forget_settings()
    elif param.name == "debug":
        state.debug = True
    elif param.name == "no_color":
        state.no_color = True
        state.env = Env.from_sys(no_color=True)


def shape(command: Any, parent: Any, root: Any) -> None:
    """Give ``command``, just built, chatflow's shape: light coercion, ``--tool-result``
    pairs, the global options (from ``root``), repeats refused, plain argument help.
    ``parent``: the group it belongs to (None for the root itself)."""
    install_light_coercion(command)
    if parent is not None:
        if parent is root:
            repeatable_pairs(command)
        add_global_options(command, root)
    refuse_repeats(command)
    plain_argument_help(command)


def add_global_options(sub: Any, root: Any) -> None:
    """Give the subcommand ``sub`` the root's ``--db``, ``--config``, ``--debug`` and
    ``--no-color``, so ``chatflow sessions ls --db x`` works as ``chatflow --db x sessions ls``
    does (they stay out of each command's help; the root's help says they may follow the
    command)."""
    import copy

    root_params = {p.name: p for p in root.params}
    taken = {opt for p in sub.params for opt in (*p.opts, *p.secondary_opts)}
    for flag in GLOBAL_OPTIONS:
        if flag in taken:
            continue
        name = flag.lstrip("-").replace("-", "_")
        option = copy.copy(root_params[name])
        option.expose_value = False
        option.callback = set_global
        option.hidden = True
        sub.params.append(option)


def refuse_repeats(cmd: Any) -> None:
    """An option that takes one value and is given twice is a usage error (exit 2), never a
    silent "the last one wins": ``--session a --session b`` or ``-m x -m y`` names the option.
    Repeatable options (``--metadata``, ``--tool-result``) and flags are not affected."""
    original = cmd.make_parser

    def make_parser(ctx: Any, _original: Any = original) -> Any:
        parser = _original(ctx)
        parse = parser.parse_args

        def parse_args(args: list[str]) -> Any:
            opts, rest, order = parse(args=args)
            seen: set[int] = set()
            for param in order:
                if not getattr(param, 'param_type_name', '') == 'option' or param.multiple or param.is_flag or param.count:
                    continue
                if id(param) in seen and not ctx.resilient_parsing:
                    names = "/".join(sorted(param.opts, key=len, reverse=True))
                    raise usage_error(f"{names} was given more than once; it takes one value", ctx)
                seen.add(id(param))
            return opts, rest, order

        parser.parse_args = parse_args
        return parser

    cmd.make_parser = make_parser


def plain_argument_help(cmd: Any) -> None:
    """Arguments in help as ``ID``, ``[MESSAGE]`` and ``[ID]...``: no Python types
    (``<str>``, ``<list[str]>``) and no ``{ID}`` braces."""
    for param in cmd.params:
        if getattr(param, "param_type_name", "") != "argument" or not hasattr(param, "_usage_display_name"):
            continue
        name = (param.metavar or param.name.upper()).rstrip(".")

        def usage(_param: Any = param, _name: str = name) -> str:
            shown = _name if _param.required else f"[{_name}]"
            return shown + ("..." if _param.nargs != 1 else "")

        param._usage_display_name = usage
        param.display_type_rich = lambda ctx=None: ""
        param._rich_display_name = lambda _name=name, _param=param: _name + ("..." if _param.nargs != 1 else "")


#: Options taking a pair of values that may be repeated (typer has no list-of-tuples type).
_REPEATABLE_PAIRS = {("chat", "tool_result")}


def repeatable_pairs(sub: Any) -> None:
    """``--tool-result ID OUTPUT`` may be given once per pending call: the value is a list of
    pairs (``sub``: a command of the root)."""
    for param in sub.params:
        if (sub.name, param.name) in _REPEATABLE_PAIRS:
            param.multiple = True
            param.default = None

            def pairs(value: Any, p: Any, c: Any) -> Any:
                return [tuple(_str(v, p, c) for v in pair) for pair in value or ()] or None

            desc = param.type_descriptor
            param._runtime_param = lite_runtime_param_class()(parameter_info=desc.parameter_info,
                                                              annotation=desc.annotation, fn=pairs)


# ---------------------------------------------------------------------------------------
# option values: KEY=VALUE pairs and durations
# ---------------------------------------------------------------------------------------
def parse_metadata(items: list[str] | None) -> dict[str, str] | None:
    """``["k=v", ...]`` -> ``{"k": "v"}``; a missing ``=`` or empty key -> :class:`UsageError`."""
    if not items:
        return None
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--metadata {item!r}: expected KEY=VALUE")
        out[key.strip()] = value
    return out


def parse_duration(text: str) -> float:
    """``"90s"``, ``"30m"``, ``"12h"``, ``"7d"``, ``"2w"`` (or a bare number of days) -> seconds."""
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text or "")
    if not m:
        raise UsageError(f"invalid duration {text!r}: use a number with s, m, h, d or w (like 30d)")
    unit = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "": 86400}[m.group(2)]
    return float(m.group(1)) * unit
