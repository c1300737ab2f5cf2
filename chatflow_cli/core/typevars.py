"""The type variable the library's generic functions share: one, in a leaf every core room
may import, rather than a copy in each room."""

from __future__ import annotations

from typing import TypeVar

__all__ = ["T"]

#: Any one type, the same wherever it appears in one signature (a callable's result and what
#: the caller gets back).
T = TypeVar("T")
