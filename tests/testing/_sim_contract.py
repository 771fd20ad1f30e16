"""Validate simulator responses against OpenRouter's OpenAPI description.

The description (tests/data/openrouter-openapi.yaml, OpenAPI 3.1) is loaded once;
each response is checked against the schema the spec gives for its path, method,
status and content type, with ``$ref``s resolved inside the document. OpenAPI 3.1
schemas are JSON Schema 2020-12, so the nullable types (``type: [x, "null"]``) and
``anyOf`` need no translation; ``discriminator`` is advisory and the ``oneOf`` it
annotates is still checked. When a route does not list a status (OpenRouter
documents only some per route), the generic error schema for that status is used.

The description is extended by tests/data/openrouter-openapi-sdk-overlay.yaml: what
the newest official ``openrouter`` SDK requires beyond it (docs/records.md lists each
addition and the SDK model it comes from); then tests/data/openrouter-openapi-field-
overlay.yaml makes optional what real answers omit though the description or the SDK
requires it (each patch names its captures).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SPEC_PATH = Path(__file__).parents[1] / "data" / "openrouter-openapi.yaml"
OVERLAY_PATH = Path(__file__).parents[1] / "data" / "openrouter-openapi-sdk-overlay.yaml"
FIELD_OVERLAY_PATH = Path(__file__).parents[1] / "data" / "openrouter-openapi-field-overlay.yaml"
_BASE = "urn:openrouter-openapi"
_ERROR_SCHEMAS = {
    400: "BadRequestResponse",
    401: "UnauthorizedResponse",
    402: "PaymentRequiredResponse",
    403: "ForbiddenResponse",
    404: "NotFoundResponse",
    408: "RequestTimeoutResponse",
    429: "TooManyRequestsResponse",
    500: "InternalServerResponse",
    502: "BadGatewayResponse",
    503: "ServiceUnavailableResponse",
    524: "EdgeNetworkTimeoutResponse",
    529: "ProviderOverloadedResponse",
}


def _pointer(*parts: str) -> str:
    return "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


def _load_yaml(path: Path) -> Any:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with path.open(encoding="utf-8") as handle:
        return yaml.load(handle, Loader=loader)  # noqa: S506


def apply_overlay(doc: dict[str, Any], overlay: dict[str, Any]) -> None:
    """Apply the SDK overlay's patches to ``doc`` in place.

    A ``schema`` patch defines a new schema (refusing to replace an existing one,
    so the description never silently loses a definition); a ``properties`` /
    ``required`` patch extends an existing schema (its target must exist); an
    ``optional`` patch takes names out of its ``required`` list (each must be there).
    """
    for patch in overlay["patches"]:
        *parents, name = [
            p.replace("~1", "/").replace("~0", "~") for p in patch["target"].split("/")[1:]
        ]
        node = doc
        for part in parents:
            node = node[part]
        if "schema" in patch:
            if name in node:
                raise AssertionError(f"overlay would replace {patch['target']}")
            node[name] = patch["schema"]
            continue
        target = node[name]
        target.setdefault("properties", {}).update(patch.get("properties", {}))
        required = target.setdefault("required", [])
        required.extend(r for r in patch.get("required", []) if r not in required)
        for optional in patch.get("optional", []):
            required.remove(optional)  # a ValueError: the overlay is stale


def field_omissions() -> dict[str, frozenset[str]]:
    """The fields the field overlay makes optional, by the SDK model that requires them."""
    overlay = _load_yaml(FIELD_OVERLAY_PATH)
    return {p["sdk_model"]: frozenset(p["optional"]) for p in overlay["patches"]}


class Contract:
    def __init__(
        self,
        path: Path = SPEC_PATH,
        overlay: Path | None = OVERLAY_PATH,
        field_overlay: Path | None = FIELD_OVERLAY_PATH,
    ) -> None:
        self.doc: dict[str, Any] = _load_yaml(path)
        for extension in (overlay, field_overlay):
            if extension is not None:
                apply_overlay(self.doc, _load_yaml(extension))
        resource = Resource.from_contents(self.doc, default_specification=DRAFT202012)
        self.registry: Registry[Any] = Registry().with_resource(_BASE, resource)

    def schema_ref(self, path: str, method: str, status: int, content_type: str) -> str:
        operation = self.doc["paths"][path][method]
        response = operation["responses"].get(str(status))
        if response is not None and content_type in response.get("content", {}):
            pointer = _pointer(
                "paths", path, method, "responses", str(status), "content", content_type, "schema"
            )
            return f"{_BASE}#/{pointer}"
        if content_type == "application/json" and status in _ERROR_SCHEMAS:
            return f"{_BASE}#/components/schemas/{_ERROR_SCHEMAS[status]}"
        raise AssertionError(
            f"the spec has no {status} {content_type} response for {method.upper()} {path}"
        )

    @functools.cache  # noqa: B019 - one Contract per session
    def validator(self, ref: str) -> jsonschema.Draft202012Validator:
        return jsonschema.Draft202012Validator({"$ref": ref}, registry=self.registry)

    def validate(
        self, path: str, method: str, status: int, body: Any, content_type: str = "application/json"
    ) -> None:
        """Raise AssertionError listing every violation of the spec by ``body``."""
        validator = self.validator(self.schema_ref(path, method, status, content_type))
        errors = sorted(validator.iter_errors(body), key=lambda e: list(e.absolute_path))
        if errors:
            lines = [
                f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message[:300]}"
                for e in errors[:10]
            ]
            raise AssertionError(
                f"{method.upper()} {path} {status} violates the spec:\n" + "\n".join(lines)
            )

    def validate_chunk(self, chunk: Any) -> None:
        """One SSE ``data:`` payload of a chat completion stream."""
        self.validate("/chat/completions", "post", 200, {"data": chunk}, "text/event-stream")


@functools.cache
def contract() -> Contract:
    return Contract()
