"""Read hand-written JSON or YAML data files and remember where each value came from.

Market and fault files are written by people, so every complaint about them must
name the file and the line. YAML's composer knows the line of every node; JSON is
parsed strictly first (so a JSON syntax error is reported by the JSON parser, with
its line) and then read through the same YAML composer, since JSON is YAML.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import yaml

from provider_router._exceptions import DataFileError
from provider_router._money import to_decimal

T = TypeVar("T")


class LineDict(dict[str, Any]):
    """A mapping read from a data file; ``line`` is where it starts (1-based)."""

    line: int | None = None
    key_lines: dict[str, int]


class LineList(list[Any]):
    """A sequence read from a data file; ``line`` is where it starts (1-based)."""

    line: int | None = None
    item_lines: list[int]


class _LineLoader(yaml.SafeLoader):
    """SafeLoader whose mappings and sequences carry their line numbers."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> LineDict:
    result = LineDict()
    result.line = node.start_mark.line + 1
    result.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            raise yaml.constructor.ConstructorError(
                None, None, f"keys must be strings, got {key!r}", key_node.start_mark
            )
        result[key] = loader.construct_object(value_node, deep=True)
        result.key_lines[key] = key_node.start_mark.line + 1
    return result


def _construct_sequence(loader: _LineLoader, node: yaml.SequenceNode) -> LineList:
    result = LineList(loader.construct_object(child, deep=True) for child in node.value)
    result.line = node.start_mark.line + 1
    result.item_lines = [child.start_mark.line + 1 for child in node.value]
    return result


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def load_data_file(path: str | Path) -> Any:
    """Parse a ``.json``, ``.yaml`` or ``.yml`` file into LineDict/LineList values.

    Raises:
        DataFileError: the file is missing, unreadable or not valid JSON/YAML.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataFileError(path, "no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataFileError(path, f"cannot read the file: {exc}") from None
    return parse_data_text(text, path)


def parse_data_text(text: str, path: str | Path) -> Any:
    """Parse already-read text; ``path`` decides JSON vs YAML and names errors."""
    path = Path(path)
    if path.suffix.lower() == ".json":
        try:
            json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataFileError(path, f"invalid JSON: {exc.msg}", line=exc.lineno) from None
    try:
        return yaml.load(text, Loader=_LineLoader)  # noqa: S506 - _LineLoader is a SafeLoader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        raise DataFileError(path, f"invalid YAML: {exc.problem or exc}", line=line) from None
    except yaml.YAMLError as exc:
        raise DataFileError(path, f"invalid YAML: {exc}") from None


class Fields:
    """Typed access to one mapping of a data file, with file:line errors.

    ``Fields(path, mapping, "endpoints[2]")`` reads values and, when one is
    missing or of the wrong type, raises a DataFileError naming the file, the
    line of the offending key and its dotted location.
    """

    def __init__(self, path: Path, data: object, where: str, *, line: int | None = None) -> None:
        self.path = path
        self.where = where
        if not isinstance(data, Mapping):
            raise DataFileError(path, f"{where}: expected a mapping", line=line)
        self.data: Mapping[str, Any] = data
        self.line = getattr(data, "line", line)
        self._key_lines: dict[str, int] = getattr(data, "key_lines", {})

    def line_of(self, key: str) -> int | None:
        return self._key_lines.get(key, self.line)

    def error(self, key: str | None, message: str) -> DataFileError:
        location = f"{self.where}.{key}" if key else self.where
        line = self.line_of(key) if key else self.line
        return DataFileError(self.path, f"{location}: {message}", line=line)

    def reject_unknown(self, allowed: Sequence[str]) -> None:
        for key in self.data:
            if key not in allowed:
                raise self.error(key, f"unknown field (expected one of: {', '.join(allowed)})")

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def raw(self, key: str) -> Any:
        return self.data.get(key)

    def text(self, key: str, default: str | None = None) -> str:
        value = self.data.get(key, default)
        if value is None:
            raise self.error(key, "is required")
        if not isinstance(value, str) or not value.strip():
            raise self.error(key, f"must be a non-empty string, got {value!r}")
        return value

    def opt_text(self, key: str) -> str | None:
        return self.text(key) if self.has(key) else None

    def integer(self, key: str, default: int | None = None, *, minimum: int | None = None) -> int:
        value = self.data.get(key, default)
        if value is None:
            raise self.error(key, "is required")
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"must be an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise self.error(key, f"must be at least {minimum}, got {value}")
        return value

    def opt_integer(self, key: str, *, minimum: int | None = None) -> int | None:
        return self.integer(key, minimum=minimum) if self.has(key) else None

    def number(
        self,
        key: str,
        default: float | None = None,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
    ) -> float:
        value = self.data.get(key, default)
        if value is None:
            raise self.error(key, "is required")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(key, f"must be a number, got {value!r}")
        if minimum is not None and value < minimum:
            raise self.error(key, f"must be at least {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise self.error(key, f"must be at most {maximum}, got {value}")
        return float(value)

    def opt_number(
        self, key: str, *, minimum: float | None = None, maximum: float | None = None
    ) -> float | None:
        if not self.has(key):
            return None
        return self.number(key, minimum=minimum, maximum=maximum)

    def decimal(self, key: str, *, minimum: Decimal | None = None) -> Decimal:
        value = self.data.get(key)
        if value is None:
            raise self.error(key, "is required")
        try:
            result = to_decimal(value, what="value")
        except ValueError as exc:
            raise self.error(key, str(exc)) from None
        if minimum is not None and result < minimum:
            raise self.error(key, f"must be at least {minimum}, got {result}")
        return result

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, got {value!r}")
        return value

    def items(self, key: str, *, required: bool = False) -> list[Any]:
        value = self.data.get(key)
        if value is None:
            if required:
                raise self.error(key, "is required")
            return []
        if not isinstance(value, list):
            raise self.error(key, f"must be a list, got {type(value).__name__}")
        return value

    def text_list(self, key: str) -> list[str]:
        items = self.items(key)
        for item in items:
            if not isinstance(item, str) or not item:
                raise self.error(key, f"must be a list of non-empty strings, got item {item!r}")
        return items

    def item_line(self, key: str, index: int) -> int | None:
        value = self.data.get(key)
        lines = getattr(value, "item_lines", None)
        if lines is not None and index < len(lines):
            return int(lines[index])
        return self.line_of(key)

    def parse_each(
        self,
        key: str,
        parse: Callable[[Path, object, str, int | None], T],
        *,
        prefix: str,
        noun: str,
        unique: tuple[str, Callable[[T], str]] | None = None,
    ) -> list[T]:
        """Parse every item of a required, non-empty list, optionally with unique values.

        ``prefix`` starts each item's location (``"models"`` → ``models[2]``);
        ``unique`` is (field name, getter): a repeated value is an error at its item.
        """
        items = self.items(key, required=True)
        if not items:
            raise self.error(key, f"must list at least one {noun}")
        parsed = [
            parse(self.path, item, f"{prefix}[{i}]", self.item_line(key, i))
            for i, item in enumerate(items)
        ]
        if unique is not None:
            field, value_of = unique
            seen: set[str] = set()
            for i, value in enumerate(map(value_of, parsed)):
                if value in seen:
                    raise DataFileError(
                        self.path,
                        f"{prefix}[{i}].{field}: duplicate {noun} {field} {value!r}",
                        line=self.item_line(key, i),
                    )
                seen.add(value)
        return parsed
