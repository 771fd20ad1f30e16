"""The extended description requires everything the newest ``openrouter`` SDK requires.

For each route the simulator serves, the SDK's response model is walked field by
field against the description's schema for that route (with the SDK overlay
applied). A field the SDK requires that the description lacks, or leaves optional,
means OpenRouter moved on: add it to tests/data/openrouter-openapi-sdk-overlay.yaml
and docs/records.md, and make the simulator send it. The SDK test
(test_sim_openrouter_sdk.py) proves the simulator satisfies the SDK; this one keeps
our validation copy of the contract in step with it.
"""

from __future__ import annotations

import os
import typing
from typing import Any

import pytest
from _sim_contract import contract, field_omissions
from pydantic import BaseModel

if not os.environ.get("PROVIDER_ROUTER_REQUIRE_OPENROUTER_SDK"):
    pytest.importorskip("openrouter", reason="the openrouter SDK is not installed")
from openrouter import components, operations

ROUTES: list[tuple[str, str, str, Any]] = [
    ("/models/{author}/{slug}/endpoints", "get", "application/json", "ListEndpointsResponse"),
    ("/models", "get", "application/json", "ModelsListResponse"),
    ("/model/{author}/{slug}", "get", "application/json", "ModelResponse"),
    ("/models/count", "get", "application/json", "ModelsCountResponse"),
    ("/providers", "get", "application/json", "ListProvidersResponse"),
    ("/credits", "get", "application/json", "GetCreditsResponse"),
    ("/key", "get", "application/json", "GetCurrentKeyResponse"),
    ("/generation", "get", "application/json", "GenerationResponse"),
    ("/chat/completions", "post", "application/json", "ChatResult"),
    ("/chat/completions", "post", "text/event-stream", "ChatStreamingResponse"),
]
SDK_ARTIFACTS = {"UnknownReasoningDetailUnion"}
"""The SDK's own forward-compatibility wrappers: not wire shapes."""
FIELD_OMITS = field_omissions()
"""Fields the SDK requires that real answers omit (openrouter-openapi-field-overlay.yaml):
the simulator omits them too, and the SDK fails on them as it fails on the real service."""


def _sdk_model(name: str) -> type[BaseModel]:
    # Operation responses wrap routes the components do not (endpoints, providers, ...).
    model = getattr(operations, name, None) or getattr(components, name)
    assert isinstance(model, type)
    assert issubclass(model, BaseModel)
    return model


def _resolve(schema: Any) -> Any:
    doc = contract().doc
    while isinstance(schema, dict) and "$ref" in schema:
        node: Any = doc
        for part in schema["$ref"].removeprefix("#/").split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        schema = node
    return schema


def _shape(schema: Any) -> tuple[dict[str, Any], set[str]]:
    """Properties and required names of an object schema, ``allOf`` merged."""
    schema = _resolve(schema)
    properties: dict[str, Any] = {}
    required: set[str] = set()
    if not isinstance(schema, dict):
        return properties, required
    for part in schema.get("allOf", []):
        more, needed = _shape(part)
        properties.update(more)
        required |= needed
    properties.update(schema.get("properties", {}))
    required |= set(schema.get("required", []))
    return properties, required


def _variants(schema: Any) -> list[Any]:
    schema = _resolve(schema)
    found = [v for key in ("anyOf", "oneOf") for s in schema.get(key, []) for v in _variants(s)]
    return found or [schema]


def _models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _element(schema: Any) -> Any:
    schema = _resolve(schema)
    if isinstance(schema, dict) and "items" in schema:
        return schema["items"]
    extra = schema.get("additionalProperties") if isinstance(schema, dict) else None
    if isinstance(extra, dict) and not schema.get("properties"):
        return extra
    return schema


def _gaps(model: type[BaseModel], schema: Any, where: str, seen: set[Any]) -> list[str]:
    if model.__name__ in SDK_ARTIFACTS or (model, id(schema)) in seen:
        return []
    seen.add((model, id(schema)))
    fields = set(model.model_fields)
    best = max(_variants(schema), key=lambda v: len(set(_shape(v)[0]) & fields))
    properties, required = _shape(best)
    gaps = []
    omitted = FIELD_OMITS.get(model.__name__, frozenset())
    for name, field in model.model_fields.items():
        key = field.alias or name
        if key in omitted:
            continue
        if key not in properties:
            if field.is_required():
                gaps.append(f"{where}.{key}: required by the SDK, absent from the description")
            continue
        if field.is_required() and key not in required:
            gaps.append(f"{where}.{key}: required by the SDK, optional in the description")
        for inner in _models(field.annotation):
            gaps += _gaps(inner, _element(properties[key]), f"{where}.{key}", seen)
    return gaps


@pytest.mark.parametrize(("path", "method", "content_type", "model"), ROUTES)
def test_the_description_requires_what_the_sdk_requires(
    path: str, method: str, content_type: str, model: str
) -> None:
    response = contract().doc["paths"][path][method]["responses"]["200"]
    schema = response["content"][content_type]["schema"]
    gaps = _gaps(_sdk_model(model), schema, f"{method.upper()} {path}", set())
    assert not gaps, "update the SDK overlay and docs/records.md:\n" + "\n".join(gaps)


KEPT_AS_SENT = {"perf_last_30m_by_workload"}
"""Fields we keep untyped (``record.model_extra``): nothing here reads them."""


@pytest.mark.parametrize(
    ("sdk_name", "ours"),
    [
        ("PublicEndpoint", "Endpoint"),
        ("PublicPricing", "Pricing"),
        ("PricingOverride", "PricingOverride"),
        ("PercentileStats", "PercentileStats"),
        ("ToolChoiceSupport", "ToolChoiceSupport"),
        ("Model", "Model"),
        ("TopProviderInfo", "TopProvider"),
        ("ModelArchitecture", "Architecture"),
    ],
)
def test_our_records_type_every_field_the_sdk_knows(sdk_name: str, ours: str) -> None:
    from provider_router.catalog import records

    def names(model: type[BaseModel]) -> set[str]:
        return {field.alias or name for name, field in model.model_fields.items()}

    missing = names(_sdk_model(sdk_name)) - names(getattr(records, ours)) - KEPT_AS_SENT
    assert not missing, f"records.{ours} lacks {sorted(missing)} (SDK {sdk_name})"
