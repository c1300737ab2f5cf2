"""Async twins of store methods, derived from the synchronous method so its signature is
written once.

``aget = async_twin(get)`` in a mixin's class body gives the store ``await store.aget(...)``
with exactly ``get``'s parameters and ``Coroutine[..., <get's return type>]`` for a type
checker (``mypy --strict`` checks the arguments and infers the result). At run time the twin
calls the method *by name* on the store, so a backend that overrides ``get`` (PostgreSQL's
``begin_turn`` renewing leases) is what its twin runs, and runs it through the store's hooks:
:meth:`_StoreCore._run_blocking` for reads and for writes that may wait for another write
(``begin_turn``), :meth:`_StoreCore._run_writing` for writes that never wait (``writes=True``:
an on-disk SQLite store queues them on its writer thread).

A method generic in a type variable (``edit``) or taking ``**kwargs`` (``release``) is
written with a positional-only ``self`` (``def edit(self, /, ...)``), so the twin's
parameters can leave ``self`` out; mypy says so otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from ..typevars import T

if TYPE_CHECKING:  # pragma: no cover
    from ._core import _StoreCore

__all__ = ["async_twin"]

_S = TypeVar("_S", bound="_StoreCore")
_P = ParamSpec("_P")


def async_twin(
    method: Callable[Concatenate[_S, _P], T], *, writes: bool = False
) -> Callable[Concatenate[_S, _P], Coroutine[Any, Any, T]]:
    """The async twin of the store method ``method``: the same parameters, the same result,
    awaited; the same errors, raised from the ``await``.

    ``writes``: the method writes and never waits for another write of the store (run by
    ``_run_writing``); otherwise it is run by ``_run_blocking``.
    """
    name = method.__name__
    if writes:
        async def twin(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> T:
            result: T = await self._run_writing(getattr(self, name), *args, **kwargs)
            return result
    else:
        async def twin(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> T:
            result: T = await self._run_blocking(getattr(self, name), *args, **kwargs)
            return result
    twin.__name__ = f"a{name}"
    twin.__qualname__ = f"{method.__qualname__.rpartition('.')[0]}.a{name}".lstrip(".")
    twin.__module__ = method.__module__
    twin.__doc__ = f"Async twin of :meth:`{name}`: the same arguments, result and errors."
    twin.__wrapped__ = method  # type: ignore[attr-defined]  # inspect.signature shows the method's
    return twin
