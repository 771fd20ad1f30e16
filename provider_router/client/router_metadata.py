"""What OpenRouter says it did with a request: ``openrouter_metadata``, read tolerantly.

Asked for with ``X-OpenRouter-Metadata: enabled`` (``Router(headers=METADATA_HEADERS)``),
OpenRouter's answer carries its routing trace: each upstream attempt (fallbacks
included) and the pipeline stages that changed the request or the answer (context
compression, guardrails, response healing...). A stage appears only when it changed
something, so a ``context_compression`` stage means the middle of the prompt was
dropped before the model saw it (:attr:`RouterMetadata.compressed`). The shape is
documented as additive: unknown fields are kept in :attr:`RouterMetadata.raw`, unknown
stage types as they are, and a malformed entry is left out, never fatal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from provider_router._types import JSONObject

__all__ = [
    "COMPRESSION_STAGE",
    "METADATA_HEADERS",
    "PipelineStage",
    "RouteAttempt",
    "RouterMetadata",
    "parse_router_metadata",
]

METADATA_HEADERS: Final[Mapping[str, str]] = MappingProxyType({"X-OpenRouter-Metadata": "enabled"})
"""``Router(headers=METADATA_HEADERS)``: OpenRouter's routing trace on every answer."""
COMPRESSION_STAGE: Final = "context_compression"
"""The ``pipeline`` stage type of OpenRouter's context compression (middle-out)."""


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True, slots=True)
class RouteAttempt:
    """One upstream attempt (``openrouter_metadata.attempts[i]``).

    Attributes:
        provider: the provider's display name.
        model: the model it was asked for.
        status: the HTTP status it answered (200 for the one that served).
    """

    provider: str
    model: str | None
    status: int | None

    def to_json(self) -> JSONObject:
        """As OpenRouter writes it."""
        return {"provider": self.provider, "model": self.model, "status": self.status}


@dataclass(frozen=True, slots=True)
class PipelineStage:
    """A stage that changed the request or the answer (``openrouter_metadata.pipeline[i]``).

    Attributes:
        type: ``context_compression``, ``guardrail``, ``plugin``, ``server_tools``,
            ``response_healing``, or a newer one (kept as sent).
        name: the plugin that ran (``context-compression``, ``web-search``...).
        summary: OpenRouter's one line on what it did, when given.
        data: the stage's details as sent (for compression: ``engine``,
            ``original_count``, ``compressed_count``).
    """

    type: str
    name: str
    summary: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> JSONObject:
        """As OpenRouter writes it (``summary`` and ``data`` only when given)."""
        out: JSONObject = {"type": self.type, "name": self.name}
        if self.summary is not None:
            out["summary"] = self.summary
        if self.data:
            out["data"] = dict(self.data)
        return out


@dataclass(frozen=True, slots=True)
class RouterMetadata:
    """OpenRouter's routing trace of one answer.

    Attributes:
        attempt: which attempt served it (1 = the first; 0: none reached a provider).
        attempts: every upstream attempt, in order, the serving one last.
        pipeline: the stages that changed something, in order.
        strategy: how the model was chosen (``direct``, ``fallback``, ``auto``...).
        raw: the object as sent.
    """

    attempt: int | None
    attempts: tuple[RouteAttempt, ...] = ()
    pipeline: tuple[PipelineStage, ...] = ()
    strategy: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def compressed(self) -> bool:
        """Whether context compression dropped part of the prompt."""
        return any(stage.type == COMPRESSION_STAGE for stage in self.pipeline)

    @property
    def fallbacks(self) -> int:
        """Attempts that failed before the one that served."""
        return max(0, len(self.attempts) - 1)

    def to_json(self) -> JSONObject:
        """What a job keeps of it: ``attempt``, ``attempts`` and ``pipeline``."""
        return {
            "attempt": self.attempt,
            "attempts": [a.to_json() for a in self.attempts],
            "pipeline": [s.to_json() for s in self.pipeline],
        }


def _attempt(raw: object) -> RouteAttempt | None:
    if not isinstance(raw, Mapping):
        return None
    provider = _str(raw.get("provider"))
    if provider is None:
        return None
    return RouteAttempt(provider, _str(raw.get("model")), _int(raw.get("status")))


def _stage(raw: object) -> PipelineStage | None:
    if not isinstance(raw, Mapping):
        return None
    kind, name = _str(raw.get("type")), _str(raw.get("name"))
    if kind is None:
        return None
    data = raw.get("data")
    return PipelineStage(
        kind,
        name or kind,
        _str(raw.get("summary")),
        dict(data) if isinstance(data, Mapping) else {},
    )


def parse_router_metadata(raw: object) -> RouterMetadata | None:
    """Read an ``openrouter_metadata`` object; None when it is not one."""
    if not isinstance(raw, Mapping):
        return None
    attempts = raw.get("attempts")
    pipeline = raw.get("pipeline")
    parsed_attempts = (_attempt(a) for a in attempts) if isinstance(attempts, list) else ()
    parsed_stages = (_stage(s) for s in pipeline) if isinstance(pipeline, list) else ()
    return RouterMetadata(
        attempt=_int(raw.get("attempt")),
        attempts=tuple(a for a in parsed_attempts if a is not None),
        pipeline=tuple(s for s in parsed_stages if s is not None),
        strategy=_str(raw.get("strategy")),
        raw=raw,
    )
