"""Router metadata: ``openrouter_metadata``, asked for with ``X-OpenRouter-Metadata: enabled``.

As OpenRouter's router-metadata guide describes it: opt in per request with the
header (its value compared case-insensitively; ``disabled``, a typo or no header mean
off), the legacy ``X-OpenRouter-Experimental-Metadata`` accepted too. The object has
the fields the description's ``OpenRouterMetadata`` requires (``requested``,
``strategy``, ``region``, ``summary``, ``attempt``, ``is_byok``, ``endpoints``), plus
``attempts`` (one ``{provider, model, status}`` per upstream attempt, fallbacks
included) and ``pipeline`` (the stages that changed something, such as context
compression). A JSON answer carries it at the top level; a stream in its final chunk
before ``[DONE]``; an error OpenRouter relays from upstream (502, 503, 504, 529)
beside ``error``, with no endpoint selected.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from provider_router.testing.market.listing import EndpointSpec, ModelSpec

__all__ = [
    "LEGACY_METADATA_HEADER",
    "METADATA_HEADER",
    "METADATA_ON_ERRORS",
    "router_metadata",
    "wants_metadata",
]

METADATA_HEADER: Final = "X-OpenRouter-Metadata"
LEGACY_METADATA_HEADER: Final = "X-OpenRouter-Experimental-Metadata"
METADATA_ON_ERRORS: Final = frozenset({502, 503, 504, 529})
"""Error statuses that keep ``openrouter_metadata`` (the guide: omitted on a 500, on
auth, rate-limit and validation failures, kept on upstream failures)."""


def wants_metadata(headers: Mapping[str, str]) -> bool:
    """Whether the request opted in (either header, ``enabled`` in any case)."""
    for name in (METADATA_HEADER, LEGACY_METADATA_HEADER):
        value = headers.get(name)
        if value is not None and value.strip().lower() == "enabled":
            return True
    return False


def router_metadata(
    body: Mapping[str, Any],
    model: ModelSpec,
    candidates: Sequence[EndpointSpec],
    served: EndpointSpec | None,
    attempts: Sequence[tuple[str, int]],
    pipeline: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The ``openrouter_metadata`` object of one request.

    ``attempts`` are the ``(tag, status)`` pairs tried so far, the serving one last;
    ``served`` is None when every attempt failed.
    """
    requested = body.get("model")
    names = {e.tag: e.provider_name for e in candidates}
    selected = served.provider_name if served is not None else "none"
    served_tag = served.tag if served is not None else None
    metadata: dict[str, Any] = {
        "requested": requested if isinstance(requested, str) else model.id,
        "strategy": "fallback" if body.get("models") else "direct",
        "region": None,
        "summary": f"available={len(candidates)}, selected={selected}",
        "attempt": len(attempts),
        "is_byok": False,
        "endpoints": {
            "total": len(model.endpoints),
            "available": [
                {"model": model.id, "provider": e.provider_name, "selected": e.tag == served_tag}
                for e in candidates
            ],
        },
    }
    if attempts:
        metadata["attempts"] = [
            {"provider": names.get(tag, tag), "model": model.id, "status": status}
            for tag, status in attempts
        ]
    if pipeline:
        metadata["pipeline"] = [dict(stage) for stage in pipeline]
    return metadata
