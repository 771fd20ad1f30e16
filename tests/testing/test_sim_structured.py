"""Structured outputs: ``response_format`` json_schema (strict) answered with JSON that
fits the schema (JSON and stream) where ``structured_outputs`` is listed, json_object with
a JSON object, text where the endpoint lists neither; the openai SDK's ``parse`` works."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest
from _sim_client import MODEL, SimClient
from pydantic import BaseModel

from provider_router.testing import COMPLETION_TOKENS_HEADER

FIXED = {COMPLETION_TOKENS_HEADER: "40"}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 3},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "rating": {"$ref": "#/$defs/Rating"},
    },
    "required": ["title", "year", "tags", "rating"],
    "additionalProperties": False,
    "$defs": {"Rating": {"type": "string", "enum": ["good", "bad"]}},
}
FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "film", "strict": True, "schema": SCHEMA},
}
ASK = [{"role": "user", "content": "Describe a film as JSON."}]


async def test_json_schema_answers_fit_the_schema(client: SimClient) -> None:
    for n in range(5):
        messages = [{"role": "user", "content": f"Film {n} as JSON."}]
        body = {"model": MODEL, "messages": messages, "response_format": FORMAT}
        reply = await client.post("/chat/completions", body, FIXED)
        assert reply.status == 200, reply.text
        content = reply.json["choices"][0]["message"]["content"]
        jsonschema.validate(json.loads(content), SCHEMA)
        assert reply.json["choices"][0]["finish_reason"] == "stop"
        usage = reply.json["usage"]
        assert usage["completion_tokens"] > 0


async def test_a_stream_carries_the_same_json(client: SimClient) -> None:
    body = {"model": MODEL, "messages": ASK, "response_format": FORMAT, "stream": True}
    reply = await client.post("/chat/completions", body, FIXED)
    text = "".join(
        e["choices"][0]["delta"].get("content") or "" for e in reply.events if e.get("choices")
    )
    jsonschema.validate(json.loads(text), SCHEMA)


async def test_json_object_and_endpoints_that_ignore_it(client: SimClient) -> None:
    body = {"model": MODEL, "messages": ASK, "response_format": {"type": "json_object"}}
    reply = await client.post("/chat/completions", body, FIXED)
    assert isinstance(json.loads(reply.json["choices"][0]["message"]["content"]), dict)
    # Parasail lists neither response_format nor structured_outputs: it answers in text.
    only = {**body, "provider": {"only": ["parasail"]}}
    reply = await client.post("/chat/completions", only, FIXED)
    assert reply.status == 200, "a valid only is never a 404 for a soft filter"
    assert reply.json["provider"] == "Parasail"
    with pytest.raises(json.JSONDecodeError):
        json.loads(reply.json["choices"][0]["message"]["content"])
    # require_parameters makes it a hard filter.
    strict = {**only, "provider": {"only": ["parasail"], "require_parameters": True}}
    reply = await client.post("/chat/completions", strict, FIXED)
    assert reply.status == 404
    # max_tokens cuts the JSON short, as a real provider does.
    cut = {"model": MODEL, "messages": ASK, "response_format": FORMAT, "max_tokens": 3}
    reply = await client.post("/chat/completions", cut, FIXED)
    assert reply.json["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("response_format", "field"),
    [
        ("json", "response_format"),
        ({"type": "yaml"}, "response_format.type"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        ({"type": "json_schema", "json_schema": {"schema": {}}}, "json_schema.name"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": []}}, "schema"),
        ({"type": "json_schema", "json_schema": {"name": "x", "strict": "yes"}}, "strict"),
    ],
)
async def test_a_malformed_response_format_is_a_400_naming_the_field(
    client: SimClient, response_format: Any, field: str
) -> None:
    body = {"model": MODEL, "messages": ASK, "response_format": response_format}
    reply = await client.post("/chat/completions", body, FIXED)
    assert reply.status == 400
    assert field in reply.json["error"]["message"]


class Film(BaseModel):
    title: str
    year: int
    tags: list[str]


async def test_openai_sdk_parse_works(openai_client: openai.AsyncOpenAI) -> None:
    completion = await openai_client.chat.completions.parse(
        model=MODEL, messages=ASK, response_format=Film, max_tokens=200
    )
    assert isinstance(completion.choices[0].message.parsed, Film)
    async with openai_client.chat.completions.stream(
        model=MODEL, messages=ASK, response_format=Film, max_tokens=200
    ) as stream:
        final = await stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Film)


async def test_only_a_tool_less_endpoint_with_tools_answers_in_text(client: SimClient) -> None:
    """Item 8 of #24: a soft filter never makes a valid ``only`` a 404 ``allowed_providers``."""
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {}}}
    body = {"model": MODEL, "messages": ASK, "tools": [tool], "provider": {"only": ["parasail"]}}
    reply = await client.post("/chat/completions", body, FIXED)
    assert reply.status == 200, reply.text
    assert reply.json["provider"] == "Parasail"
    assert reply.json["choices"][0]["message"].get("tool_calls") is None
