"""Structured outputs: ``response_format`` answered with JSON, as OpenRouter documents it.

``json_schema`` on an endpoint listing ``structured_outputs`` is answered with a JSON
value drawn to fit the schema (:func:`~provider_router.testing.chat.tools.fake_value`,
``$ref`` to ``#/$defs`` or ``#/definitions`` resolved, as the ``openai`` SDK's
``parse`` sends them); ``json_object``, or ``json_schema`` where only
``response_format`` is listed, with a small JSON object; an endpoint listing neither
ignores it and answers in text (both assumptions). Content is completion tokens, and
``max_tokens`` can cut it short (``finish_reason: "length"``, JSON that does not
parse). A malformed ``response_format`` is a 400 naming the field.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from provider_router.testing.chat import tools

__all__ = ["OutputFormat", "StructuredError", "parse_response_format", "structured_pieces"]

_MAX_REF_DEPTH = 16
_KINDS = ("text", "json_object", "json_schema")
_PLAIN_OBJECT = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "confidence": {"type": "number"}},
    "required": ["answer"],
}


class StructuredError(ValueError):
    """A malformed ``response_format`` (the message names the field)."""


@dataclass(frozen=True, slots=True)
class OutputFormat:
    """What a request's ``response_format`` asks for."""

    kind: str
    schema: Mapping[str, Any] | None = None
    strict: bool = False


def parse_response_format(body: Mapping[str, Any]) -> OutputFormat | None:
    """The request's output format; None for plain text.

    Raises:
        StructuredError: ``response_format`` is not one of the documented shapes.
    """
    raw = body.get("response_format")
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise StructuredError("response_format: expected an object")
    kind = raw.get("type")
    if kind not in _KINDS:
        raise StructuredError(f"response_format.type: expected one of {list(_KINDS)}, got {kind!r}")
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputFormat("json_object")
    spec = raw.get("json_schema")
    if not isinstance(spec, Mapping):
        raise StructuredError("response_format.json_schema: expected an object")
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise StructuredError("response_format.json_schema.name: expected a non-empty string")
    schema = spec.get("schema", {})
    if not isinstance(schema, Mapping):
        raise StructuredError("response_format.json_schema.schema: expected an object")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise StructuredError("response_format.json_schema.strict: expected a boolean")
    return OutputFormat("json_schema", schema, bool(strict))


def _resolved(node: Any, root: Mapping[str, Any], depth: int = 0) -> Any:
    """``node`` with local ``$ref`` s replaced by what they point at (bounded depth)."""
    if isinstance(node, list):
        return [_resolved(item, root, depth) for item in node]
    if not isinstance(node, Mapping):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/") and depth < _MAX_REF_DEPTH:
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, Mapping) else None
        rest = {k: v for k, v in node.items() if k != "$ref"}
        merged = {**target, **rest} if isinstance(target, Mapping) else rest
        return _resolved(merged, root, depth + 1)
    return {k: _resolved(v, root, depth) for k, v in node.items() if k not in ("$defs",)}


def structured_pieces(
    output: OutputFormat, supported: frozenset[str] | tuple[str, ...], rng: random.Random
) -> tuple[str, ...]:
    """The answer's JSON text, cut into token pieces; empty when the endpoint ignores it."""
    if "response_format" not in supported and "structured_outputs" not in supported:
        return ()
    schema: Mapping[str, Any] = _PLAIN_OBJECT
    if output.kind == "json_schema" and "structured_outputs" in supported:
        assert output.schema is not None
        schema = _resolved(output.schema, output.schema)
    value = tools.fake_value(schema, rng)
    return tools.split_pieces(json.dumps(value, ensure_ascii=False))
