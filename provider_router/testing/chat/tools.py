"""Tool calls: read ``tools`` and ``tool_choice``, decide the calls, fake their arguments.

Shapes follow captured OpenRouter responses (docs/simulator.md, "Tool calls"): a JSON
answer's ``message.tool_calls[]`` with ``finish_reason: "tool_calls"``, a stream's
first ``delta.tool_calls[]`` entry per call then pieces of its ``arguments``. The
decision is seeded by the request's random stream (``required`` always calls, ``auto``
with probability :data:`AUTO_CALL_SHARE`, never right after a tool result), and what
the serving endpoint lists decides what it honours (:func:`honoured`). Arguments are a
JSON value generated to fit the function's ``parameters`` schema (not ``pattern``),
billed as completion tokens.
"""

from __future__ import annotations

import json
import random
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from provider_router.testing.chat.synth import filler

__all__ = [
    "PlannedCall",
    "ToolError",
    "ToolRequest",
    "honoured",
    "parse_tool_request",
    "plan_calls",
    "preamble_tokens",
]

AUTO_CALL_SHARE = 0.5
"""Probability that ``tool_choice: "auto"`` calls a tool (outside a tool-result turn)."""
PARALLEL_SHARE = 0.25
"""Probability that a call is two parallel calls, when ``parallel_tool_calls`` allows."""
PREAMBLE_SHARE = 0.5
"""Probability that an ``auto`` call is preceded by a few words of text, as captured
("I'll check the weather in Florence, Italy for you." then the call)."""
_PREAMBLE_TOKENS = (4, 12)
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# Pieces a BPE tokenizer would plausibly cut: short words, digit runs, punctuation pairs.
_PIECE = re.compile(r"\s*[A-Za-z]{1,6}|\s*\d{1,3}|\s*[^\sA-Za-z\d]{1,2}|\s+")
_ID_ALPHABET = string.ascii_letters + string.digits
_MAX_DEPTH = 4
_STRING_FORMATS = {
    "date": "2026-11-30",
    "date-time": "2026-11-30T12:00:00Z",
    "time": "12:00:00",
    "email": "user@example.com",
    "uri": "https://example.com/item",
    "uuid": "00000000-0000-4000-8000-000000000000",
}


class ToolError(ValueError):
    """A malformed ``tools``, ``tool_choice`` or tool message: a 400 with this message."""


@dataclass(frozen=True, slots=True)
class Function:
    name: str
    parameters: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ToolRequest:
    """What a request asks of tools: the callable functions and the choice."""

    functions: tuple[Function, ...]
    choice: str | Function
    parallel: bool


@dataclass(frozen=True, slots=True)
class PlannedCall:
    """One tool call the model will make; ``pieces`` join to ``arguments``."""

    id: str
    name: str
    arguments: str
    pieces: tuple[str, ...]

    @property
    def tokens(self) -> int:
        """Completion tokens of the call: one for the name, one per argument piece."""
        return 1 + len(self.pieces)


def _function(tool: object, where: str) -> Function | None:
    if not isinstance(tool, Mapping):
        raise ToolError(f"{where}: expected a tool object")
    kind = tool.get("type")
    if kind != "function":
        if isinstance(kind, str) and kind:
            return None  # an OpenRouter server tool: run by the platform, never called here
        raise ToolError(f"{where}.type: expected 'function'")
    spec = tool.get("function")
    if not isinstance(spec, Mapping):
        raise ToolError(f"{where}.function: expected an object with a name")
    name = spec.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ToolError(
            f"{where}.function.name: expected 1-64 letters, digits, '_' or '-', got {name!r}"
        )
    parameters = spec.get("parameters", {})
    if parameters is None:
        parameters = {}
    if not isinstance(parameters, Mapping):
        raise ToolError(f"{where}.function.parameters: expected a JSON Schema object")
    return Function(name, parameters)


def _choice(raw: object, functions: tuple[Function, ...]) -> str | Function:
    if raw is None:
        return "auto"
    if raw in ("none", "auto", "required"):
        assert isinstance(raw, str)
        return raw
    if isinstance(raw, Mapping) and raw.get("type") == "function":
        spec = raw.get("function")
        name = spec.get("name") if isinstance(spec, Mapping) else None
        if not isinstance(name, str):
            raise ToolError("tool_choice.function.name: expected the name of a function")
        for function in functions:
            if function.name == name:
                return function
        raise ToolError(f"tool_choice: function {name!r} is not among the request's tools")
    if isinstance(raw, Mapping) and isinstance(raw.get("type"), str):
        raise ToolError(f"tool_choice: server tool {raw['type']!r} is not simulated")
    raise ToolError(
        "tool_choice: expected 'none', 'auto', 'required' or "
        f'{{"type": "function", "function": {{"name": ...}}}}, got {raw!r}'
    )


def check_tool_messages(messages: Sequence[Any]) -> None:
    """Tool results must name the call they answer (``tool_call_id``)."""
    for i, message in enumerate(messages):
        if type(message) is dict and message.get("role") != "tool":
            continue  # the common case, without the ABC check
        if isinstance(message, Mapping) and message.get("role") == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise ToolError(f"messages[{i}].tool_call_id: a tool message needs the call's id")


def parse_tool_request(body: Mapping[str, Any]) -> ToolRequest | None:
    """The request's tools, or None when it has none.

    Raises:
        ToolError: malformed tools, a tool_choice without tools, or a named
            function that is not among the tools.
    """
    tools = body.get("tools")
    raw_choice = body.get("tool_choice")
    if tools is None:
        if raw_choice is not None and raw_choice != "none":
            raise ToolError("tool_choice: only allowed when tools are specified")
        return None
    if not isinstance(tools, list) or not tools:
        raise ToolError("tools: expected a non-empty array of tools")
    found = (_function(tool, f"tools[{i}]") for i, tool in enumerate(tools))
    functions = tuple(f for f in found if f is not None)
    parallel = body.get("parallel_tool_calls", True)
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        raise ToolError(f"parallel_tool_calls: expected a boolean, got {parallel!r}")
    choice = _choice(raw_choice, functions)
    if choice == "required" and not functions:
        raise ToolError("tool_choice: 'required' needs at least one function tool")
    return ToolRequest(functions, choice, parallel)


def honoured(
    request: ToolRequest, supported_parameters: Sequence[str], flags: Mapping[str, bool]
) -> ToolRequest | None:
    """What an endpoint makes of the request's tools: ``None`` when it does not take
    tools at all; ``auto`` in place of a ``tool_choice`` variant that failed its
    testing (``flags`` is its ``supports_tool_choice``)."""
    if supported_parameters and "tools" not in supported_parameters:
        return None
    choice = request.choice
    variant = "function" if isinstance(choice, Function) else choice
    if choice != "auto" and not flags.get(variant, True):
        return ToolRequest(request.functions, "auto", request.parallel)
    return request


def _prior_calls(messages: Sequence[Any]) -> int:
    count = 0
    for message in messages:
        if isinstance(message, Mapping) and isinstance(message.get("tool_calls"), list):
            count += len(message["tool_calls"])
    return count


def plan_calls(
    request: ToolRequest, messages: Sequence[Any], model_id: str, rng: random.Random
) -> tuple[PlannedCall, ...]:
    """The calls the model makes for this request (empty: it answers in text)."""
    choice = request.choice
    if choice == "none" or not request.functions:
        return ()
    if choice == "auto":
        last = messages[-1] if messages else None
        after_results = isinstance(last, Mapping) and last.get("role") == "tool"
        if after_results or rng.random() >= AUTO_CALL_SHARE:
            return ()
    if isinstance(choice, Function):
        chosen = [choice]
    else:
        count = 2 if request.parallel and rng.random() < PARALLEL_SHARE else 1
        chosen = [rng.choice(request.functions) for _ in range(count)]
    # Kimi numbers its calls across the conversation ("functions.NAME:N"), as captured.
    kimi = model_id.startswith("moonshotai/")
    first = _prior_calls(messages)
    calls = []
    for i, function in enumerate(chosen):
        if kimi:
            call_id = f"functions.{function.name}:{first + i}"
        else:
            call_id = "call_" + "".join(rng.choices(_ID_ALPHABET, k=24))
        arguments = json.dumps(fake_value(function.parameters, rng), ensure_ascii=False)
        calls.append(PlannedCall(call_id, function.name, arguments, split_pieces(arguments)))
    return tuple(calls)


def preamble_tokens(request: ToolRequest, calls: Sequence[PlannedCall], rng: random.Random) -> int:
    """Content tokens the model writes before its calls: only when it chose to call
    (``auto``), sometimes; a forced call starts at once, as the captures show."""
    if not calls or request.choice != "auto" or rng.random() >= PREAMBLE_SHARE:
        return 0
    return rng.randint(*_PREAMBLE_TOKENS)


def split_pieces(text: str) -> tuple[str, ...]:
    """``text`` cut as a tokenizer would, roughly; the pieces join back to ``text``."""
    return tuple(_PIECE.findall(text))


# --- arguments that fit a JSON Schema ----------------------------------------------------


def _words(rng: random.Random, low: int, high: int) -> str:
    start = rng.randrange(4096)
    return filler(start, start + rng.randint(low, high)).strip()


def _string(schema: Mapping[str, Any], rng: random.Random) -> str:
    fmt = schema.get("format")
    if isinstance(fmt, str) and fmt in _STRING_FORMATS:
        return _STRING_FORMATS[fmt]
    low = schema.get("minLength")
    high = schema.get("maxLength")
    low = low if isinstance(low, int) and low > 0 else 0
    high = high if isinstance(high, int) and high >= low else None
    text = _words(rng, 1, 3)
    while len(text) < low:
        text += " " + _words(rng, 1, 3)
    if high is not None:
        text = text[:high]
    return text


def _bounds(schema: Mapping[str, Any], integer: bool) -> tuple[float, float]:
    step = 1 if integer else 0.01
    low: float = 0
    high: float | None = None
    if isinstance(schema.get("minimum"), (int, float)):
        low = schema["minimum"]
    if isinstance(schema.get("exclusiveMinimum"), (int, float)):
        low = schema["exclusiveMinimum"] + step
    if isinstance(schema.get("maximum"), (int, float)):
        high = schema["maximum"]
    if isinstance(schema.get("exclusiveMaximum"), (int, float)):
        high = schema["exclusiveMaximum"] - step
    if high is None:
        high = max(low, 0) + 100
    if low > high:  # an unsatisfiable range: stay inside its lower edge
        high = low
    return low, high


def _merged(parts: Sequence[Any]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    properties: dict[str, Any] = {}
    required: list[Any] = []
    for part in parts:
        if isinstance(part, Mapping):
            merged.update(part)
            properties.update(part.get("properties") or {})
            required.extend(part.get("required") or [])
    merged.pop("allOf", None)
    if properties:
        merged["properties"] = properties
    if required:
        merged["required"] = required
    return merged


def _type_of(schema: Mapping[str, Any], rng: random.Random) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        options = [k for k in kind if isinstance(k, str) and k != "null"]
        return rng.choice(options) if options else "null"
    if isinstance(kind, str):
        return kind
    if "properties" in schema:
        return "object"
    if "items" in schema:
        return "array"
    return "string"


def fake_value(schema: object, rng: random.Random, depth: int = 0) -> Any:
    """A JSON value that fits ``schema`` (a JSON Schema), drawn from ``rng``."""
    if not isinstance(schema, Mapping):
        return _words(rng, 1, 2)
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return rng.choice(enum)
    for key in ("anyOf", "oneOf"):
        options = [o for o in schema.get(key) or () if isinstance(o, Mapping)]
        if options:
            rest = {k: v for k, v in schema.items() if k != key}
            return fake_value({**rest, **rng.choice(options)}, rng, depth)
    if isinstance(schema.get("allOf"), list):
        return fake_value(_merged([schema, *schema["allOf"]]), rng, depth)
    kind = _type_of(schema, rng)
    if kind == "object":
        return _object(schema, rng, depth)
    if kind == "array":
        low = schema.get("minItems")
        low = low if isinstance(low, int) and low > 0 else 0
        high = schema.get("maxItems")
        high = high if isinstance(high, int) and high >= low else max(low, 3)
        count = rng.randint(max(low, min(1, high)), high) if depth < _MAX_DEPTH else low
        return [fake_value(schema.get("items"), rng, depth + 1) for _ in range(count)]
    if kind in ("integer", "number"):
        low, high = _bounds(schema, kind == "integer")
        if kind == "integer":
            return rng.randint(int(low), int(high))
        return round(rng.uniform(low, high), 2) if high > low else low
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    return _string(schema, rng)


def _object(schema: Mapping[str, Any], rng: random.Random, depth: int) -> dict[str, Any]:
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    required = schema.get("required")
    required = {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
    value: dict[str, Any] = {}
    for name, sub in properties.items():
        if name in required or (depth < _MAX_DEPTH and rng.random() < 0.5):
            value[name] = fake_value(sub, rng, depth + 1)
    for name in sorted(required - value.keys()):  # required but not described: any string
        value[name] = _words(rng, 1, 2)
    return value


# --- rendering ---------------------------------------------------------------------------


def message_calls(calls: Sequence[PlannedCall], tokens: int) -> list[dict[str, Any]]:
    """``message.tool_calls`` for the first ``tokens`` tool tokens (all when enough)."""
    out: list[dict[str, Any]] = []
    base = 0
    for index, call in enumerate(calls):
        if tokens <= base:
            break
        pieces = call.pieces[: max(0, tokens - base - 1)]
        out.append(
            {
                "type": "function",
                "index": index,
                "id": call.id,
                "function": {"name": call.name, "arguments": "".join(pieces)},
            }
        )
        base += call.tokens
    return out


def stream_deltas(calls: Sequence[PlannedCall], start: int, stop: int) -> list[dict[str, Any]]:
    """The ``delta.tool_calls`` entries for tool tokens ``start`` to ``stop``, one per chunk:
    a call's first entry names it (empty arguments), each later one carries one
    token-sized piece of its arguments, as the captured Chutes stream does (``{"``,
    ``location``, ``":``, `` "``, ``Fl``, ``ore``...)."""
    entries: list[dict[str, Any]] = []
    base = 0
    for index, call in enumerate(calls):
        low, high = max(start, base), min(stop, base + call.tokens)
        if low < high:
            if low == base:
                entries.append(
                    {
                        "index": index,
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": ""},
                    }
                )
                low += 1
            for piece in call.pieces[low - base - 1 : high - base - 1]:
                entries.append({"index": index, "function": {"arguments": piece}})
        base += call.tokens
    return entries
