"""The shape of chatflow's command line, applied to each click command typer builds.

Global options anywhere (``chatflow sessions ls --db x``), no silent repeats of a
single-value option (exit 2), plain argument names in help (``ID``, ``[MESSAGE]``), and
``--tool-result ID OUTPUT`` repeatable as a list of pairs. :func:`shape` applies them all to
one command: the root first, then each subcommand when it is built (a run builds the
commands it invokes, :func:`chatflow_cli._typer_adapter.lazy_group`).
"""

from __future__ import annotations

from typing import Any

from ._console import Env
from ._typer_adapter import lite_runtime_param_class, usage_error
from .context import state_of

__all__ = ["GLOBAL_OPTIONS", "add_global_options", "plain_argument_help", "refuse_repeats", "repeatable_pairs",
           "set_global", "shape"]

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
    from ._typer_fast import install

    install(command)
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
    from ._typer_fast import _str

    for param in sub.params:
        if (sub.name, param.name) in _REPEATABLE_PAIRS:
            param.multiple = True
            param.default = None

            def pairs(value: Any, p: Any, c: Any) -> Any:
                return [tuple(_str(v, p, c) for v in pair) for pair in value or ()] or None

            desc = param.type_descriptor
            param._runtime_param = lite_runtime_param_class()(parameter_info=desc.parameter_info,
                                                              annotation=desc.annotation, fn=pairs)
