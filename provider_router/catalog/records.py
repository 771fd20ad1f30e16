"""Typed, frozen records of OpenRouter's model and endpoint metadata.

Tolerant going in, frozen once built: unknown fields are kept as sent
(``record.model_extra``) and never fatal, fields that appeared over time are optional,
and ``null`` stays unknown (``None``, never 0). Prices are exact
:class:`~decimal.Decimal` USD per token; the wire facts they encode (omitted fees,
unpriced caching, the ``"-1"`` of dynamically priced routers, open enums) are in
docs/records.md.

Prices and the cost formula live in ``_pricing``, the open enums in ``_record_enums``;
every name stays importable from here, the documented path
(``provider_router.catalog.records.Pricing``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import IntEnum, StrEnum
from typing import Any, Final, NoReturn

from pydantic import BaseModel, ValidationError, field_validator, model_validator

from provider_router._exceptions import InvalidResponseError
from provider_router.catalog._pricing import DYNAMIC_PRICE_SENTINEL as DYNAMIC_PRICE_SENTINEL
from provider_router.catalog._pricing import RECORD_CONFIG as _RECORD
from provider_router.catalog._pricing import Pricing, PricingOverride

__all__ = [
    "Architecture",
    "Endpoint",
    "EndpointHealth",
    "EndpointStatus",
    "Model",
    "ModelEndpoints",
    "NativeTool",
    "PercentileStats",
    "Pricing",
    "PricingOverride",
    "Quantization",
    "ToolChoiceSupport",
    "TopProvider",
    "describe_json",
    "parse_endpoints_response",
    "parse_model_entries",
    "parse_models_response",
]


class Quantization(StrEnum):
    """Weight precision an endpoint declares: the spec's enum, and ``unrecognized``.

    The wire field may also be ``null`` (``None`` on :class:`Endpoint`); ``unknown``
    is the provider saying it does not declare one. A string the spec does not list
    (``q4_k_m``, ``w4a16``, ``int3``) becomes ``UNRECOGNIZED``, never silently
    ``UNKNOWN``: the raw string is kept in :attr:`Endpoint.quantization_raw`, and
    the policy judges it by the bit width it can read from it, or rejects it.
    """

    INT4 = "int4"
    INT8 = "int8"
    FP4 = "fp4"
    MXFP4 = "mxfp4"
    NVFP4 = "nvfp4"
    FP6 = "fp6"
    FP8 = "fp8"
    MXFP8 = "mxfp8"
    FP16 = "fp16"
    BF16 = "bf16"
    FP32 = "fp32"
    UNKNOWN = "unknown"
    UNRECOGNIZED = "unrecognized"
    """Not a wire value: what a string the spec does not list parses to."""

    @classmethod
    def parse(cls, value: object) -> Quantization | None:
        """Map a wire value to a member; ``None`` stays ``None``, unseen → ``UNRECOGNIZED``."""
        if value is None:
            return None
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            return cls.UNRECOGNIZED


class EndpointHealth(StrEnum):
    """What an endpoint's ``status`` means for routing."""

    OK = "ok"
    DEGRADED = "degraded"
    DOWN = "down"
    UNKNOWN = "unknown"


class EndpointStatus(IntEnum):
    """OpenRouter's endpoint status codes (spec: ``0, -1, -2, -3, -5, -10``).

    The spec gives no meaning. ``0`` is seen on healthy endpoints and ``-2`` on
    endpoints with 87–91 % uptime; OpenRouter's provider guide speaks of normal,
    degraded (deprioritised) and down (fallback only). We read it as "more
    negative is more deranked": 0 is OK, -1..-4 degraded, -5 and below down.
    Unseen codes are kept as plain ints and classified by the same rule
    (:meth:`health_of`).
    """

    OK = 0
    DEPRIORITISED = -1
    DEGRADED = -2
    DEGRADED_SEVERELY = -3
    DOWN = -5
    DISABLED = -10

    @property
    def health(self) -> EndpointHealth:
        return self.health_of(int(self))

    @staticmethod
    def health_of(code: int | None) -> EndpointHealth:
        """The meaning of any status code, including ones the spec does not list."""
        if code is None:
            return EndpointHealth.UNKNOWN
        if code >= 0:
            return EndpointHealth.OK
        if code > -5:
            return EndpointHealth.DEGRADED
        return EndpointHealth.DOWN


_UPTIME_SLACK: Final = 1e-6
_STATUS_BY_CODE: Final = {int(member): member for member in EndpointStatus}


class PercentileStats(BaseModel):
    """p50/p75/p90/p99 over the last 30 minutes (latency in ms to first token, or tok/s)."""

    model_config = _RECORD

    p50: float | None = None
    p75: float | None = None
    p90: float | None = None
    p99: float | None = None


class ToolChoiceSupport(BaseModel):
    """Which ``tool_choice`` values passed OpenRouter's testing (not in the spec; 2026)."""

    model_config = _RECORD

    none: bool | None = None
    auto: bool | None = None
    required: bool | None = None
    function: bool | None = None


class NativeTool(BaseModel):
    """A server tool the endpoint runs as the provider's own (``native_tools``, 2026).

    ``name`` is OpenRouter's canonical ``openrouter:*`` name, ``type`` the provider
    tool type the request is translated to (``web_search_20260209``, ``google_search``).
    """

    model_config = _RECORD

    name: str
    type: str | None = None


class Architecture(BaseModel):
    """Model architecture: modalities, tokenizer, instruct type."""

    model_config = _RECORD

    modality: str | None = None
    input_modalities: tuple[str, ...] = ()
    output_modalities: tuple[str, ...] = ()
    tokenizer: str | None = None
    instruct_type: str | None = None


# --- endpoints ------------------------------------------------------------------


class Endpoint(BaseModel):
    """One provider endpoint of a model (``PublicEndpoint`` plus fields seen in the wild).

    Attributes beyond the wire: :attr:`quantization_raw` keeps the quantization
    string as sent (``quantization`` is ``UNKNOWN`` for values we do not know);
    :attr:`status` is an :class:`EndpointStatus` for known codes and a plain int
    otherwise; :attr:`health` says what it means.
    """

    model_config = _RECORD

    name: str
    provider_name: str
    pricing: Pricing
    tag: str | None = None
    """Routing slug (``chutes``, ``deepinfra/fp4``); absent before late May 2025."""
    model_id: str | None = None
    model_name: str | None = None
    context_length: int | None = None
    quantization: Quantization | None = None
    quantization_raw: str | None = None
    max_completion_tokens: int | None = None
    max_prompt_tokens: int | None = None
    supported_parameters: tuple[str, ...] = ()
    status: EndpointStatus | int | None = None
    uptime_last_30m: float | None = None
    uptime_last_5m: float | None = None
    uptime_last_1d: float | None = None
    supports_implicit_caching: bool | None = None
    latency_last_30m: PercentileStats | None = None
    throughput_last_30m: PercentileStats | None = None
    supports_voice_cloning: bool = False
    supports_tool_choice: ToolChoiceSupport | None = None
    """Which ``tool_choice`` values passed OpenRouter's testing; None: not reported."""
    supports_multiple_audio_references: bool | None = None
    supports_image_reference: bool | None = None
    supports_diarization: bool | None = None
    service_tier: str | None = None
    """The tier the endpoint sells (``flex``, ``priority``, ``ultrafast``, or a newer
    one, kept as sent); None for a standard endpoint or when not reported."""
    native_tools: tuple[NativeTool, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _open_enums(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        out = dict(data)
        raw = out.get("quantization")
        if "quantization_raw" not in out:
            out["quantization_raw"] = None if raw is None else str(raw)
        out["quantization"] = Quantization.parse(raw)
        if out.get("supported_parameters") is None:
            out["supported_parameters"] = ()
        if out.get("supports_voice_cloning") is None:
            out["supports_voice_cloning"] = False
        tools = out.get("native_tools")
        if tools is None:
            out["native_tools"] = ()
        elif isinstance(tools, Mapping):
            out["native_tools"] = tuple(_native_tool(name, spec) for name, spec in tools.items())
        return out

    @field_validator("status", mode="before")
    @classmethod
    def _status(cls, value: Any) -> Any:
        if value is None or isinstance(value, bool):
            return None if value is None else _bad_status(value)
        if isinstance(value, int | str | float):
            try:
                code = int(value)
            except ValueError:
                return _bad_status(value)
            if code != value and str(code) != str(value).strip():
                return _bad_status(value)
            return _STATUS_BY_CODE.get(code, code)
        return _bad_status(value)

    @field_validator("uptime_last_30m", "uptime_last_5m", "uptime_last_1d")
    @classmethod
    def _percent(cls, value: float | None) -> float | None:
        if value is None:
            return None
        # Float noise just past 100 is clamped; anything else off-scale is an error.
        if not -_UPTIME_SLACK <= value <= 100 + _UPTIME_SLACK:
            raise ValueError(f"uptime must be a percentage in [0, 100], got {value}")
        return min(max(value, 0.0), 100.0)

    @property
    def health(self) -> EndpointHealth:
        """OK, degraded, down, or unknown (no status sent)."""
        return EndpointStatus.health_of(None if self.status is None else int(self.status))

    def supports_tool_choice_value(self, value: object) -> bool | None:
        """Whether this endpoint honours a request's ``tool_choice`` (None: not reported).

        ``"none"``/``"auto"``/``"required"`` name their flag; a mapping naming a
        function (``{"type": "function", ...}``) is the ``function`` flag.
        """
        support = self.supports_tool_choice
        if support is None:
            return None
        if isinstance(value, Mapping):
            return support.function
        if value in ("none", "auto", "required"):
            return getattr(support, str(value))  # type: ignore[no-any-return]
        return None

    @property
    def uptime(self) -> float | None:
        """The best uptime figure we have: last 30 min, else last day, else last 5 min."""
        for value in (self.uptime_last_30m, self.uptime_last_1d, self.uptime_last_5m):
            if value is not None:
                return value
        return None

    @property
    def slug(self) -> str:
        """The routing slug: the ``tag``, or the provider name lower-cased without spaces."""
        if self.tag:
            return self.tag
        return "".join(self.provider_name.lower().split())

    @property
    def provider_slug(self) -> str:
        """The provider part of the slug (``deepinfra`` for ``deepinfra/fp4``)."""
        return self.slug.split("/", 1)[0]

    @property
    def sort_key(self) -> tuple[str, str, str]:
        """A stable identity for deterministic ordering."""
        return (self.slug, self.provider_name, self.name)


def _native_tool(name: object, spec: object) -> dict[str, Any]:
    # {"openrouter:web_search": {"type": "..."}} as the SDK has it; a bare string
    # is read as the type, anything else keeps just the name (never fatal).
    if isinstance(spec, Mapping):
        return {**spec, "name": name}
    return {"name": name, "type": spec if isinstance(spec, str) else None}


def _bad_status(value: object) -> NoReturn:
    raise ValueError(f"status must be an integer code, got {value!r}")


class ModelEndpoints(BaseModel):
    """The ``data`` of ``GET /models/{author}/{slug}/endpoints``: a model and its endpoints."""

    model_config = _RECORD

    id: str
    name: str | None = None
    created: int | None = None
    description: str | None = None
    architecture: Architecture | None = None
    endpoints: tuple[Endpoint, ...]


# --- /models --------------------------------------------------------------------


class TopProvider(BaseModel):
    """``top_provider`` of a ``/models`` entry."""

    model_config = _RECORD

    context_length: int | None = None
    max_completion_tokens: int | None = None
    is_moderated: bool | None = None


class Model(BaseModel):
    """One entry of ``GET /models``. Its ``pricing`` is the top provider's, not per endpoint."""

    model_config = _RECORD

    id: str
    name: str
    pricing: Pricing
    canonical_slug: str | None = None
    hugging_face_id: str | None = None
    created: int | None = None
    description: str | None = None
    context_length: int | None = None
    architecture: Architecture | None = None
    top_provider: TopProvider | None = None
    per_request_limits: Mapping[str, Any] | None = None
    supported_parameters: tuple[str, ...] = ()
    default_parameters: Mapping[str, Any] | None = None
    supported_voices: tuple[str, ...] | None = None
    knowledge_cutoff: str | None = None
    expiration_date: str | None = None
    links: Mapping[str, Any] | None = None
    reasoning: Mapping[str, Any] | None = None
    benchmarks: Mapping[str, Any] | None = None
    alias_target: Mapping[str, Any] | None = None

    @field_validator("supported_parameters", mode="before")
    @classmethod
    def _params(cls, value: Any) -> Any:
        return () if value is None else value


# --- parsing whole responses ------------------------------------------------------


def describe_json(value: object) -> str:
    """A short description of a JSON value for error messages (never the whole body)."""
    if isinstance(value, Mapping):
        keys = ", ".join(repr(k) for k in list(value)[:8])
        more = ", ..." if len(value) > 8 else ""
        return f"an object with keys [{keys}{more}]"
    if isinstance(value, list):
        return f"an array of {len(value)} items"
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def _validation_summary(exc: ValidationError, limit: int = 5) -> str:
    parts = []
    for error in exc.errors()[:limit]:
        where = ".".join(str(p) for p in error["loc"]) or "(top level)"
        message = error["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {message}")
    if exc.error_count() > limit:
        parts.append(f"... and {exc.error_count() - limit} more")
    return "; ".join(parts)


_ENDPOINTS_SHAPE: Final = 'an endpoints listing {"data": {"id": ..., "endpoints": [...]}}'
_MODELS_SHAPE: Final = 'a models list {"data": [{"id": ..., "pricing": ...}, ...]}'


def parse_endpoints_response(body: object, *, source: str = "response") -> ModelEndpoints:
    """Parse a decoded ``/models/{author}/{slug}/endpoints`` body.

    Raises:
        InvalidResponseError: the body is not an endpoints listing, or a field is
            invalid; the message says what was expected, what came, and where.
    """
    data = body.get("data") if isinstance(body, Mapping) else None
    if not isinstance(data, Mapping) or not isinstance(data.get("endpoints"), list):
        raise InvalidResponseError(
            f"{source}: expected {_ENDPOINTS_SHAPE}, got {describe_json(body)}"
            + (f" whose 'data' is {describe_json(data)}" if isinstance(body, Mapping) else "")
        )
    try:
        return ModelEndpoints.model_validate(data)
    except ValidationError as exc:
        raise InvalidResponseError(
            f"{source}: invalid endpoints listing: {_validation_summary(exc)}"
        ) from None


def parse_models_response(body: object, *, source: str = "response") -> tuple[Model, ...]:
    """Parse a decoded ``/models`` body (``{"data": [...]}``).

    Raises:
        InvalidResponseError: the body is not a models list, or an entry is invalid.
    """
    data = body.get("data") if isinstance(body, Mapping) else None
    if not isinstance(data, list):
        raise InvalidResponseError(f"{source}: expected {_MODELS_SHAPE}, got {describe_json(body)}")
    return parse_model_entries(data, source=source)


def parse_model_entries(
    entries: Sequence[object], *, source: str = "response"
) -> tuple[Model, ...]:
    """Parse ``/models`` entries; errors name the entry index and field."""
    models = []
    for index, entry in enumerate(entries):
        try:
            models.append(Model.model_validate(entry))
        except ValidationError as exc:
            raise InvalidResponseError(
                f"{source}: invalid model at data[{index}]: {_validation_summary(exc)}"
            ) from None
    return tuple(models)
