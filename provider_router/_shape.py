"""Reading a JSON document we wrote and someone may have edited: each value's shape checked.

A file such as ``verify.json`` is read back field by field; a value of the wrong shape
raises :class:`ShapeError` naming where it is (``endpoints[0].agreement``) and what it
should be, instead of Python's own words about the code that met it (``'str' object
has no attribute 'get'``). The caller adds the file's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ShapeError", "at", "integer", "items", "member", "obj", "text"]


class ShapeError(ValueError):
    """A value of a document is not of the shape its field needs (the message says where)."""


def _shown(value: object) -> str:
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return f"an array of {len(value)} items"
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def at(where: str, key: str | int) -> str:
    """The path of ``key`` inside ``where`` (``endpoints`` + 0 → ``endpoints[0]``)."""
    if isinstance(key, int):
        return f"{where}[{key}]"
    return f"{where}.{key}" if where else key


def obj(value: object, where: str) -> Mapping[str, Any]:
    """``value`` if it is an object."""
    if not isinstance(value, Mapping):
        raise ShapeError(f"{where} must be an object, got {_shown(value)}")
    return value


def items(value: object, where: str) -> list[Any]:
    """``value`` if it is an array."""
    if not isinstance(value, list):
        raise ShapeError(f"{where} must be a list, got {_shown(value)}")
    return value


def member(raw: Mapping[str, Any], name: str, where: str = "") -> Any:
    """The field ``name`` of ``raw`` (at ``where``), which must be there."""
    try:
        return raw[name]
    except KeyError:
        raise ShapeError(f"{at(where, name)} is missing") from None


def text(value: object, where: str) -> str:
    """``value`` if it is a string."""
    if not isinstance(value, str):
        raise ShapeError(f"{where} must be a string, got {_shown(value)}")
    return value


def integer(value: object, where: str) -> int:
    """``value`` if it is an integer (a bool is not)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ShapeError(f"{where} must be an integer, got {_shown(value)}")
    return value
