"""Light value coercion for typer parameters, so that a chatflow command does not import pydantic.

typer 0.29 coerces every non-flag option value through a pydantic ``TypeAdapter``
built on first use (``_TyperParameter.get_runtime_param``); importing pydantic for that
costs about 70-100 ms on every run, more than the rest of ``chatflow sessions ls``
(see the README's performance table). chatflow's options only use ``str``, ``int``, ``float``,
``bool``, ``Enum`` choices, ``list[str]`` and ``tuple[str, str]``: for those,
:func:`install` pre-sets the parameter's runtime coercer to a small one with the same
behaviour (the same ``BadParameter`` errors for bad numbers, ranges and choices).

Anything else keeps typer's own coercion. If typer's internals change shape, nothing is
installed and typer works as usual (only slower): this module never changes behaviour.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Callable, get_args, get_origin

from ._typer_adapter import bad_parameter, help_option, lite_runtime_param_class

__all__ = ["install"]


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


def install(cmd: Any, help_names: tuple[str, ...] = ("-h", "--help")) -> int:
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
