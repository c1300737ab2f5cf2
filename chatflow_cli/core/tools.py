"""Tools an agent may call: :func:`tool` turns a Python function into a :class:`Tool`.

The JSON Schema of the parameters comes from the type hints, the descriptions from the
docstring::

    @tool
    def check_order_status(order_id: str, verbose: bool = False) -> dict:
        \"\"\"Check shipment tracking for an order ID.

        Args:
            order_id: The order to look up.
            verbose: Include every tracking step.
        \"\"\"

Type mapping (a parameter with a default is not ``required``; its default is shown in the
schema when it is JSON):

==========================  =========================================================
hint                        schema
==========================  =========================================================
``str`` ``int`` ``float``   ``{"type": "string" | "integer" | "number" | "boolean"}``
``bool``
``None``                    ``{"type": "null"}``
``X | None``/``Optional``   ``{"type": [<X>, "null"]}`` for a simple X, else ``anyOf``
``list[X]`` ``tuple[X,...]``  ``{"type": "array", "items": <X>}``
``set[X]``                  ``{"type": "array", "items": <X>, "uniqueItems": true}``
``dict`` ``dict[str, X]``   ``{"type": "object"[, "additionalProperties": <X>]}``
``Literal["a", "b"]``       ``{"type": "string", "enum": ["a", "b"]}``
an ``Enum`` subclass        ``{"type": <type of the values>, "enum": [values]}``
``Any`` / no hint           ``{}`` (anything)
==========================  =========================================================

Secrets: a parameter annotated ``Annotated[str, Secret("github_token")]`` is filled from the
vaults mounted on the session (:mod:`chatflow_cli.core.resources.vaults`), never by the model::

    @tool
    def open_issues(repo: str, token: Annotated[str, Secret("github_token")]) -> list[str]:
        \"\"\"List the open issues of a GitHub repository.\"\"\"

It is left out of the JSON Schema the model sees (an argument of that name from the model is
refused as unknown), must be a ``str`` with no default, and at call time gets the value of the
entry (here ``github_token``) from the first mounted vault that holds it. When none does, the
tool does not run: the call gets an error result naming the vaults searched and the entry, and
the turn goes on. Every value read is scrubbed (``[redacted]``) from the tool's result and error
text before it is stored or sent. :attr:`Tool.secrets` lists a tool's secret parameters.

Descriptions: the tool's description is the docstring's first paragraph (normally its
first line); each parameter's description comes from a Google-style ``Args:`` section
(``Arguments:``/``Parameters:`` too, ``name (type): text`` with indented continuation
lines) or from Sphinx ``:param name: text`` lines.

:meth:`Tool.invoke` parses the model's JSON arguments, checks them against the hints
(converting Enum values to members and lists to tuples/sets where the hint says so),
calls the function — an ``async def`` one runs to completion — and returns text: a
``str`` result stays as it is, anything else is strict JSON by :func:`to_json_text` (sets
and tuples as arrays, Enums as their values, bytes as UTF-8 text or base64, dataclasses and
pydantic-like models as objects, NaN/Infinity as ``null``). Bad arguments raise :class:`ToolArgumentsError`; an exception the function
raises propagates unchanged (the Runner turns both into an error result the model sees).

:meth:`Tool.custom` declares a tool with a schema and no implementation (a custom
tool, answered by the caller): the Runner stops the turn when the model calls one and waits for
``submit_tool_result``.
"""

from __future__ import annotations

import base64
import collections.abc
import dataclasses
import enum
import functools
import inspect
import json
import math
import re
import types
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, Union, get_args, get_origin, get_type_hints

from .errors import UsageError

if TYPE_CHECKING:  # pragma: no cover
    import asyncio
    from concurrent.futures import Future

__all__ = ["Secret", "Tool", "ToolArgumentsError", "ToolCallFailed", "ToolDefinitionError", "ToolText", "function_schema",
           "tool"]

_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ToolDefinitionError(UsageError, TypeError):
    """A function that cannot become a tool (``*args``, an unsupported hint, a bad name)."""


@dataclasses.dataclass(frozen=True)
class Secret:
    """Marks a tool parameter filled from a mounted vault: ``Annotated[str, Secret("entry")]``.

    Attributes:
        entry: The vault entry whose value the parameter gets (a vault entry name).
    """

    entry: str

    def __post_init__(self) -> None:
        if not isinstance(self.entry, str) or not (re.match(r"^[a-z0-9][a-z0-9_.-]{0,63}$", self.entry)
                                                   or re.match(r"^[A-Z0-9][A-Z0-9_.-]{0,63}$", self.entry)):
            raise ToolDefinitionError("Secret(...): an entry name is 1-64 letters, digits, '_', '-' or '.', "
                                      "starting with a letter or digit, its letters all lowercase (github_token) "
                                      "or all uppercase (GITHUB_TOKEN)")


def _secret_of(hint: Any) -> Secret | None:
    if get_origin(hint) is typing.Annotated:
        return next((a for a in get_args(hint)[1:] if isinstance(a, Secret)), None)
    return None


class ToolArgumentsError(ValueError):
    """The model's arguments are not JSON, or do not fit the tool's parameters.

    The message is written for the model, which sees it as the tool's error result.
    """


class ToolCallFailed(Exception):
    """A tool call that did not give a result; ``str()`` is the whole error text the model
    sees after ``Error:`` (a tool server that failed, or answered with an error result)."""


class ToolText(str):
    """A tool's result text as the model sees it, with :attr:`whole`: the complete result
    when the text shown was cut (None when nothing was cut), and :attr:`attachments`: the
    images the tool returned (:class:`~chatflow_cli.core.attachments.Attachment` with their
    bytes), which the text names. The Runner stores ``whole`` in the session's log beside the
    call, and the images with the call's TOOL message."""

    whole: str | None
    attachments: tuple[Any, ...]

    def __new__(cls, text: str, whole: str | None = None, attachments: tuple[Any, ...] = ()) -> ToolText:
        made = super().__new__(cls, text)
        made.whole = whole
        made.attachments = attachments
        return made


# --------------------------------------------------------------------------------------
# Docstrings
# --------------------------------------------------------------------------------------
# compiled by the first docstring read (re caches them): a run that makes no tool from a
# function does not compile them
_SECTION = (r"^\s*(Args|Arguments|Parameters|Params|Returns?|Yields?|Raises|Examples?|Notes?|"
            r"See Also|Warnings?|Attributes|Keyword Args|Keyword Arguments)\s*:\s*$")
_ARG_LINE = r"^(\*{0,2}[A-Za-z_][A-Za-z0-9_]*)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$"
_SPHINX_PARAM = r"^\s*:param\s+(?:[^:]*\s)?([A-Za-z_][A-Za-z0-9_]*)\s*:\s*(.*)$"


@dataclasses.dataclass(frozen=True)
class _Doc:
    summary: str
    params: dict[str, str]


def _parse_docstring(doc: str | None) -> _Doc:
    """Summary (first paragraph) and per-parameter descriptions of a docstring."""
    if not doc:
        return _Doc("", {})
    section_re, arg_line_re, sphinx_re = re.compile(_SECTION), re.compile(_ARG_LINE), re.compile(_SPHINX_PARAM)
    lines = inspect.cleandoc(doc).splitlines()
    summary_lines: list[str] = []
    for line in lines:
        if not line.strip() or section_re.match(line) or sphinx_re.match(line):
            break
        summary_lines.append(line.strip())
    params: dict[str, str] = {}
    section: str | None = None
    section_indent = 0
    current: str | None = None
    current_indent = 0
    for line in lines:
        sphinx = sphinx_re.match(line)
        if sphinx:
            current, section = sphinx.group(1), None
            params[current] = sphinx.group(2).strip()
            current_indent = len(line) - len(line.lstrip())
            continue
        header = section_re.match(line)
        if header:
            section = header.group(1).lower()
            section_indent = len(line) - len(line.lstrip())
            current = None
            continue
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if section is None:
            if current is not None and indent > current_indent:
                params[current] = f"{params[current]} {line.strip()}".strip()
            continue
        if indent <= section_indent:  # text back at the section's level ends the section
            section, current = None, None
            continue
        if section not in {"args", "arguments", "parameters", "params", "keyword args", "keyword arguments"}:
            continue
        match = arg_line_re.match(line.strip())
        if match and (current is None or indent <= current_indent):
            current = match.group(1).lstrip("*")
            current_indent = indent
            params[current] = match.group(3).strip()
        elif current is not None:
            params[current] = f"{params[current]} {line.strip()}".strip()
    return _Doc(" ".join(summary_lines), params)


# --------------------------------------------------------------------------------------
# Type hints -> JSON Schema, and argument checking
# --------------------------------------------------------------------------------------
_ARRAY_ORIGINS = (list, tuple, set, frozenset, collections.abc.Sequence, collections.abc.MutableSequence,
                  collections.abc.Iterable, collections.abc.Collection, collections.abc.Set, collections.abc.MutableSet)
_OBJECT_ORIGINS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)
_SIMPLE: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}


def _json_type_of(value: Any) -> str | None:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    return None


def _enum_schema(values: list[Any]) -> dict[str, Any]:
    kinds = {_json_type_of(v) for v in values}
    schema: dict[str, Any] = {}
    if len(kinds) == 1 and None not in kinds:
        schema["type"] = kinds.pop()
    schema["enum"] = values
    return schema


def _is_union(origin: Any) -> bool:
    return origin is Union or origin is types.UnionType


def _schema_for(hint: Any, where: str) -> dict[str, Any]:
    """The JSON Schema of one type hint; ``where`` names the parameter for error messages."""
    if hint is inspect.Parameter.empty or hint is Any or hint is object:
        return {}
    if hint is None or hint is type(None):
        return {"type": "null"}
    if hint in _SIMPLE:
        return {"type": _SIMPLE[hint]}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum_schema([member.value for member in hint])
    if hint is list or hint is tuple:
        return {"type": "array"}
    if hint is set or hint is frozenset:
        return {"type": "array", "uniqueItems": True}
    if hint is dict:
        return {"type": "object"}
    origin = get_origin(hint)
    args = get_args(hint)
    if origin is typing.Annotated:
        schema = _schema_for(args[0], where)
        extra = next((a for a in args[1:] if isinstance(a, str)), None)
        return {**schema, "description": extra} if extra else schema
    if origin is Literal:
        return _enum_schema([a.value if isinstance(a, enum.Enum) else a for a in args])
    if _is_union(origin):
        parts = [_schema_for(a, where) for a in args]
        if any(not p for p in parts):
            return {}
        if all(set(p) == {"type"} and isinstance(p["type"], str) for p in parts):
            kinds = list(dict.fromkeys(p["type"] for p in parts))
            return {"type": kinds[0] if len(kinds) == 1 else kinds}
        return {"anyOf": parts}
    if origin in _ARRAY_ORIGINS:
        schema = {"type": "array"}
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            # a fixed-length tuple: each position has its own type
            schema["prefixItems"] = [_schema_for(a, where) for a in args]
            schema["minItems"] = schema["maxItems"] = len(args)
            return schema
        if args:
            schema["items"] = _schema_for(args[0], where)
        if origin in (set, frozenset, collections.abc.Set, collections.abc.MutableSet):
            schema["uniqueItems"] = True
        return schema
    if origin in _OBJECT_ORIGINS:
        schema = {"type": "object"}
        if args:
            if args[0] is not str:
                raise ToolDefinitionError(f"{where}: JSON object keys are strings, not {args[0]!r}")
            value_schema = _schema_for(args[1], where)
            if value_schema:
                schema["additionalProperties"] = value_schema
        return schema
    raise ToolDefinitionError(f"{where}: type hint {hint!r} has no JSON Schema mapping")


def _fail(path: str, expected: str, value: Any) -> ToolArgumentsError:
    return ToolArgumentsError(f"argument {path!r}: expected {expected}, got {json.dumps(value)[:80]}")


def _coerce(hint: Any, value: Any, path: str) -> Any:
    """Check one parsed JSON value against a hint; return it as the function should see it."""
    if hint is inspect.Parameter.empty or hint is Any or hint is object:
        return value
    if hint is None or hint is type(None):
        if value is not None:
            raise _fail(path, "null", value)
        return None
    if hint is bool:
        if not isinstance(value, bool):
            raise _fail(path, "a boolean", value)
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _fail(path, "an integer", value)
        if isinstance(value, float):
            if not value.is_integer():
                raise _fail(path, "an integer", value)
            return int(value)
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _fail(path, "a number", value)
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise _fail(path, "a string", value)
        return value
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        for member in hint:
            if member.value == value and type(member.value) is type(value):
                return member
        raise _fail(path, f"one of {[m.value for m in hint]}", value)
    if hint in (list, tuple, set, frozenset):
        if not isinstance(value, list):
            raise _fail(path, "an array", value)
        return hint(value)
    if hint is dict:
        if not isinstance(value, dict):
            raise _fail(path, "an object", value)
        return value
    origin = get_origin(hint)
    args = get_args(hint)
    if origin is typing.Annotated:
        return _coerce(args[0], value, path)
    if origin is Literal:
        for allowed in args:
            plain = allowed.value if isinstance(allowed, enum.Enum) else allowed
            if plain == value and type(plain) is type(value):
                return allowed
        raise _fail(path, f"one of {[a.value if isinstance(a, enum.Enum) else a for a in args]}", value)
    if _is_union(origin):
        errors: list[str] = []
        # try the exact JSON kind first, so 1 stays an int for `int | float` and True a bool
        for option in sorted(args, key=lambda a: 0 if _SIMPLE.get(a) == _json_type_of(value) else 1):
            try:
                return _coerce(option, value, path)
            except ToolArgumentsError as exc:
                errors.append(str(exc))
        raise ToolArgumentsError(errors[0] if len(errors) == 1 else f"argument {path!r}: no type of {hint} fits")
    if origin in _ARRAY_ORIGINS:
        if not isinstance(value, list):
            raise _fail(path, "an array", value)
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            if len(value) != len(args):
                raise _fail(path, f"an array of {len(args)} items", value)
            return tuple(_coerce(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
        items = [_coerce(args[0], v, f"{path}[{i}]") for i, v in enumerate(value)] if args else list(value)
        if origin in (tuple, set, frozenset):
            return origin(items)
        if origin in (collections.abc.Set, collections.abc.MutableSet):
            return set(items)
        return items
    if origin in _OBJECT_ORIGINS:
        if not isinstance(value, dict):
            raise _fail(path, "an object", value)
        if len(args) == 2:
            return {k: _coerce(args[1], v, f"{path}.{k}") for k, v in value.items()}
        return value
    return value


@dataclasses.dataclass(frozen=True)
class _Param:
    name: str
    hint: Any
    required: bool
    kind: inspect._ParameterKind
    secret: str | None = None  # the vault entry that fills it (never the model)


def function_schema(func: Callable[..., Any]) -> tuple[str, dict[str, Any], list[_Param]]:
    """``(description, parameters schema, parameters)`` of ``func`` from its hints and docstring.

    Raises :class:`ToolDefinitionError` for ``*args``/``**kwargs`` or a hint with no mapping.
    """
    signature = inspect.signature(func)
    # only the parameters' hints matter: an unresolvable return hint must not break the tool
    annotations = {k: v for k, v in getattr(func, "__annotations__", {}).items() if k != "return"}
    holder = type("_Hints", (), {"__annotations__": annotations})
    try:
        hints = get_type_hints(holder, globalns=getattr(func, "__globals__", None),
                               localns=dict(inspect.getclosurevars(func).nonlocals) if inspect.isfunction(func)
                               else None, include_extras=True)
    except Exception as exc:  # an unresolvable forward reference
        raise ToolDefinitionError(f"tool {func.__name__!r}: cannot resolve type hints: {exc}") from exc
    doc = _parse_docstring(inspect.getdoc(func))
    properties: dict[str, Any] = {}
    required: list[str] = []
    params: list[_Param] = []
    for name, parameter in signature.parameters.items():
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise ToolDefinitionError(f"tool {func.__name__!r}: *args/**kwargs cannot be described to a model")
        hint = hints.get(name, parameter.annotation)
        secret = _secret_of(hint)
        if secret is not None:
            if get_args(hint)[0] is not str or parameter.default is not inspect.Parameter.empty:
                raise ToolDefinitionError(f"tool {func.__name__!r}, parameter {name!r}: a Secret parameter is a "
                                          "str with no default")
            params.append(_Param(name, hint, True, parameter.kind, secret.entry))
            continue
        schema = dict(_schema_for(hint, f"tool {func.__name__!r}, parameter {name!r}"))
        if doc.params.get(name):
            schema["description"] = doc.params[name]
        is_required = parameter.default is inspect.Parameter.empty
        if is_required:
            required.append(name)
        else:
            default = parameter.default.value if isinstance(parameter.default, enum.Enum) else parameter.default
            try:
                json.dumps(default)
            except (TypeError, ValueError):
                pass
            else:
                schema["default"] = default
        properties[name] = schema
        params.append(_Param(name, hint, is_required, parameter.kind))
    parameters: dict[str, Any] = {"type": "object", "properties": properties, "required": required,
                                  "additionalProperties": False}
    return doc.summary, parameters, params


# --------------------------------------------------------------------------------------
# Tool
# --------------------------------------------------------------------------------------
def to_json_text(result: Any) -> str:
    """A tool's return value as the text the model sees.

    A ``str`` stays as it is. Anything else is converted, recursively, then written as
    strict JSON (``allow_nan=False``, non-ASCII kept):

    * mappings -> objects (keys: an Enum key becomes its value, other keys ``str(key)``);
      lists, tuples, sets, frozensets and other iterables of known kinds -> arrays (a set's
      items sorted when they can be, so the text is stable);
    * an ``Enum`` member -> its ``value`` (at any depth: never ``"Color.RED"``);
    * ``bytes``/``bytearray``/``memoryview`` -> the UTF-8 text, or when they are not UTF-8
      ``{"base64": "<standard base64>"}``;
    * a dataclass instance -> its fields; a pydantic-like object -> ``model_dump(mode="json")``;
    * ``float`` NaN and +/-Infinity -> ``null`` (bare ``NaN`` is not JSON);
    * ``datetime``/``date``/``time`` -> ISO 8601; anything else -> ``str(value)``;
      a value that contains itself -> ``"[circular]"`` at the repeat.
    """
    if isinstance(result, str):
        return result
    return json.dumps(_jsonable(result, set()), ensure_ascii=False, allow_nan=False)


def _jsonable(value: Any, active: set[int]) -> Any:
    if isinstance(value, enum.Enum):  # first: an IntEnum/StrEnum member is an int/str too
        return _jsonable(value.value, active)
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(raw).decode("ascii")}
    marker = id(value)
    if marker in active:
        return "[circular]"
    active.add(marker)
    try:
        if isinstance(value, collections.abc.Mapping):
            return {_key(k): _jsonable(v, active) for k, v in value.items()}
        if isinstance(value, (set, frozenset)):
            items = [_jsonable(v, active) for v in value]
            try:
                return sorted(items)
            except TypeError:  # mixed kinds: keep iteration order
                return items
        if isinstance(value, (list, tuple, collections.abc.KeysView, collections.abc.ValuesView,
                              collections.abc.Iterator, types.GeneratorType, range)):
            return [_jsonable(v, active) for v in value]
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: _jsonable(getattr(value, f.name), active) for f in dataclasses.fields(value)}
        dump = getattr(value, "model_dump", None)
        if callable(dump) and not isinstance(value, type):
            try:
                dumped = dump(mode="json")
            except TypeError:
                dumped = dump()
            return _jsonable(dumped, active)
        iso = getattr(value, "isoformat", None)
        if callable(iso) and not isinstance(value, type):
            return str(iso())
        return str(value)
    finally:
        active.discard(marker)


def _key(key: Any) -> str:
    if isinstance(key, enum.Enum):
        key = key.value
    return key if isinstance(key, str) else str(key)


_to_text = to_json_text


class Tool:
    """A tool offered to the model.

    Attributes:
        name: the function name the model calls (``^[A-Za-z0-9_-]{1,64}$``).
        description: what the tool does, for the model.
        parameters: the JSON Schema (an ``object``) of the arguments.
        function: the Python callable, or ``None`` for a custom tool.
        is_custom: declared with a schema only; results come from ``submit_tool_result``.
        is_async: the function is ``async def``.
        sequential: the tool's calls of one model reply run one after another, in the order
            the model gave them (each sees what the one before it did); the other tools' calls
            run at the same time, each on its own thread. The memory tools are sequential.

    A ``Tool`` made by :func:`tool` is still callable like the function it wraps.
    """

    def __init__(
        self,
        name: str,
        description: str,
        parameters: dict[str, Any],
        function: Callable[..., Any] | None = None,
        *,
        sequential: bool = False,
        _params: list[_Param] | None = None,
    ) -> None:
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise ToolDefinitionError(f"tool name {name!r}: use 1-64 letters, digits, '_' or '-'")
        if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
            raise ToolDefinitionError(f"tool {name!r}: parameters must be a JSON Schema of type 'object'")
        self.name = name
        self.description = description or ""
        self.parameters = parameters
        self.function = function
        self.is_async = function is not None and (
            inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(type(function).__call__)
        )
        self.sequential = bool(sequential)
        self._params = _params
        if function is not None:
            functools.update_wrapper(self, function, updated=())

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def from_function(
        cls, function: Callable[..., Any], *, name: str | None = None, description: str | None = None,
        sequential: bool = False,
    ) -> Tool:
        """A tool from a sync or async function (what :func:`tool` does)."""
        if not callable(function):
            raise ToolDefinitionError(f"@tool needs a function, got {function!r}")
        summary, parameters, params = function_schema(function)
        return cls(
            name or function.__name__,
            summary if description is None else description,
            parameters,
            function,
            sequential=sequential,
            _params=params,
        )

    @classmethod
    def custom(cls, name: str, description: str = "", parameters_schema: dict[str, Any] | None = None) -> Tool:
        """A custom tool: offered to the model, answered later by ``Runner.submit_tool_result``.

        ``parameters_schema`` is a JSON Schema object; ``None`` means no parameters.
        """
        schema = parameters_schema if parameters_schema is not None else {"type": "object", "properties": {}}
        return cls(name, description, dict(schema), None)

    # -- properties -----------------------------------------------------------------------
    @property
    def is_custom(self) -> bool:
        return self.function is None

    @property
    def secrets(self) -> dict[str, str]:
        """``{parameter: vault entry}`` of the parameters filled from a vault (empty: none)."""
        return {p.name: p.secret for p in self._params or () if p.secret is not None}

    def to_wire(self) -> dict[str, Any]:
        """The Chat Completions ``tools`` entry: ``{"type": "function", "function": {...}}``."""
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}

    def __repr__(self) -> str:
        kind = "custom" if self.is_custom else ("async" if self.is_async else "sync")
        return f"Tool(name={self.name!r}, {kind})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.function is None:
            raise TypeError(f"custom tool {self.name!r} has no implementation to call")
        return self.function(*args, **kwargs)

    # -- invocation -----------------------------------------------------------------------
    def parse_arguments(self, arguments: str | dict[str, Any] | None) -> dict[str, Any]:
        """Parse and check the model's arguments; raises :class:`ToolArgumentsError`.

        An empty string or ``None`` means no arguments. Unknown names and missing required
        ones are errors (the model is told which).
        """
        if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
            data: Any = {}
        elif isinstance(arguments, str):
            try:
                data = json.loads(arguments)
            except json.JSONDecodeError as exc:
                raise ToolArgumentsError(f"arguments are not valid JSON ({exc.msg} at position {exc.pos})") from None
        else:
            data = arguments
        if not isinstance(data, dict):
            raise ToolArgumentsError(f"arguments must be a JSON object, got {type(data).__name__}")
        if self._params is None:  # custom tool or hand-made schema: no Python signature to check
            return data
        params = [p for p in self._params if p.secret is None]  # a secret never comes from the model
        known = {p.name for p in params}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ToolArgumentsError(f"unknown argument(s) {unknown}; parameters are {sorted(known)}")
        missing = [p.name for p in params if p.required and p.name not in data]
        if missing:
            raise ToolArgumentsError(f"missing required argument(s) {missing}")
        return {p.name: _coerce(p.hint, data[p.name], p.name) for p in params if p.name in data}

    def _with_secrets(self, kwargs: dict[str, Any], secrets: collections.abc.Mapping[str, str] | None) -> None:
        for param, entry in self.secrets.items():
            if secrets is None or entry not in secrets:
                raise LookupError(f"tool {self.name!r} needs the secret {entry!r}, which was not given")
            kwargs[param] = secrets[entry]

    def _call(self, kwargs: dict[str, Any]) -> Any:
        assert self.function is not None and self._params is not None
        positional = [kwargs.pop(p.name) for p in self._params
                      if p.kind is inspect.Parameter.POSITIONAL_ONLY and p.name in kwargs]
        return self.function(*positional, **kwargs)

    def invoke(
        self, arguments: str | dict[str, Any] | None, *, loop: asyncio.AbstractEventLoop | None = None,
        secrets: collections.abc.Mapping[str, str] | None = None,
    ) -> str:
        """Run the tool on the model's arguments and return its result as text.

        ``loop``: for an async tool called from a worker thread, the event loop to run it on
        (the Runner passes the caller's loop in ``run_async``); otherwise it runs in a fresh
        loop. ``secrets``: ``{vault entry: value}`` for the tool's :attr:`secrets` parameters.
        Raises :class:`ToolArgumentsError` for bad arguments, ``LookupError`` for a secret not
        in ``secrets``, ``TypeError`` for a custom tool, and whatever the function raises.
        """
        if self.function is None:
            raise TypeError(f"custom tool {self.name!r} is answered with submit_tool_result, not invoked")
        kwargs = self.parse_arguments(arguments)
        self._with_secrets(kwargs, secrets)
        if self.is_async:
            import asyncio  # here: a sync tool's call needs none of it

            coroutine = self._call(kwargs)
            if loop is not None and loop.is_running() and not _in_loop(loop):
                future: Future[Any] = asyncio.run_coroutine_threadsafe(coroutine, loop)
                try:
                    return _to_text(future.result())
                except BaseException:
                    future.cancel()
                    raise
            return _to_text(asyncio.run(coroutine))
        result = self._call(kwargs)
        if inspect.isawaitable(result):  # a sync callable that returned a coroutine
            import asyncio

            result = asyncio.run(_await(result))
        return _to_text(result)

    async def ainvoke(self, arguments: str | dict[str, Any] | None, *,
                      secrets: collections.abc.Mapping[str, str] | None = None) -> str:
        """Async twin of :meth:`invoke`: async tools are awaited, sync ones run in a thread."""
        if self.function is None:
            raise TypeError(f"custom tool {self.name!r} is answered with submit_tool_result, not invoked")
        kwargs = self.parse_arguments(arguments)
        self._with_secrets(kwargs, secrets)
        if self.is_async:
            return _to_text(await self._call(kwargs))
        import asyncio

        result = await asyncio.to_thread(self._call, kwargs)
        if inspect.isawaitable(result):
            result = await result
        return _to_text(result)


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _in_loop(loop: asyncio.AbstractEventLoop) -> bool:
    import asyncio

    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


@typing.overload
def tool(function: Callable[..., Any], /) -> Tool: ...
@typing.overload
def tool(*, name: str | None = None, description: str | None = None,
         sequential: bool = False) -> Callable[[Callable[..., Any]], Tool]: ...
def tool(
    function: Callable[..., Any] | None = None, /, *, name: str | None = None, description: str | None = None,
    sequential: bool = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a :class:`Tool` of a sync or async function: ``@tool``, ``@tool()`` or ``@tool(name=..., description=...)``.

    ``name`` defaults to the function's name, ``description`` to the docstring's first
    paragraph. ``sequential``: the tool's calls of one reply run one after another, in the
    order given (see :class:`Tool`). See the module docstring for the type mapping.
    """
    if function is not None:
        return Tool.from_function(function, name=name, description=description, sequential=sequential)

    def decorate(func: Callable[..., Any]) -> Tool:
        return Tool.from_function(func, name=name, description=description, sequential=sequential)

    return decorate
