"""Typed, frozen records of OpenRouter's model and endpoint metadata.

Tolerant going in, frozen once built: unknown fields are ignored, fields that
appeared over time are optional, ``null`` stays unknown (``None``, never 0).
Prices are exact :class:`~decimal.Decimal` USD per token.

The wire facts these records encode (see the API notes, §1 and §6):

* zero-valued price keys are omitted in 2026 payloads and ``"0"`` in 2025 ones,
  so a missing fee (``request``, ``image``, ...) means 0;
* a missing ``input_cache_read``/``input_cache_write`` means the endpoint does not
  price caching, and such tokens are billed at the ``prompt`` rate (WandB bills
  cached tokens in full), so they are ``None``, not 0;
* ``"-1"`` is the sentinel of dynamically priced routers (``openrouter/auto``):
  such a price is ``None`` and :attr:`Pricing.is_dynamic` is true; it is never ranked;
* listed prices are already net of ``discount``; the list price is derivable;
* ``quantization`` and ``status`` are open enums: an unseen value maps to
  ``Quantization.UNKNOWN`` / a plain int, and the raw value is kept.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from enum import IntEnum, StrEnum
from typing import Any, Final, NoReturn

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from provider_router._constants import PER_MILLION
from provider_router._exceptions import InvalidResponseError
from provider_router._money import to_decimal

__all__ = [
    "Architecture",
    "Endpoint",
    "EndpointHealth",
    "EndpointStatus",
    "Model",
    "ModelEndpoints",
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

_RECORD = ConfigDict(frozen=True, extra="ignore")

DYNAMIC_PRICE_SENTINEL: Final = Decimal(-1)


# --- open enums ---------------------------------------------------------------


class Quantization(StrEnum):
    """Weight precision an endpoint declares: the spec's enum plus ``unknown``.

    The wire field may also be ``null`` (``None`` on :class:`Endpoint`). A string
    the spec does not list becomes ``UNKNOWN`` and the raw string is kept in
    :attr:`Endpoint.quantization_raw`.
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

    @classmethod
    def parse(cls, value: object) -> Quantization | None:
        """Map a wire value to a member; ``None`` stays ``None``, unseen → ``UNKNOWN``."""
        if value is None:
            return None
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            return cls.UNKNOWN


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


# --- prices ---------------------------------------------------------------------


def _price(value: object, field: str) -> Decimal | None:
    """A wire price → Decimal; ``"-1"`` → ``None`` (dynamic); negative or junk → error."""
    if value is None:
        return None
    try:
        price = to_decimal(value, what=f"price {field!r}")
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    if price == DYNAMIC_PRICE_SENTINEL:
        return None
    if price < 0:
        raise ValueError(
            f"price {field!r} must be ≥ 0 USD per unit (or the '-1' dynamic sentinel), "
            f"got {value!r}"
        )
    return price


_REQUIRED_PRICES: Final = ("prompt", "completion")
# Fees OpenRouter omits when zero (2026) or lists as "0" (2025): missing means 0.
_ZERO_WHEN_MISSING: Final = (
    "request",
    "image",
    "image_token",
    "image_output",
    "audio",
    "audio_output",
    "input_audio_cache",
    "web_search",
    "internal_reasoning",
)
# Cache prices: missing means "not priced"; such tokens bill at the prompt rate.
_NONE_WHEN_MISSING: Final = ("input_cache_read", "input_cache_write", "input_cache_write_1h")
_PRICE_KEYS: Final = _REQUIRED_PRICES + _ZERO_WHEN_MISSING + _NONE_WHEN_MISSING


class PricingOverride(BaseModel):
    """A conditional price (long-context or time-of-day) from ``pricing.overrides``.

    Condition fields are numbers; a price key that is ``None`` inherits the base price.
    ``min_prompt_tokens`` applies when the prompt is strictly longer; ``utc_start``
    and ``utc_end`` are HHMM numbers of a half-open window that may wrap midnight.
    """

    model_config = _RECORD

    min_prompt_tokens: Decimal | None = None
    utc_start: Decimal | None = None
    utc_end: Decimal | None = None
    prompt: Decimal | None = None
    completion: Decimal | None = None
    input_cache_read: Decimal | None = None
    input_cache_write: Decimal | None = None
    input_cache_write_1h: Decimal | None = None
    audio: Decimal | None = None
    input_audio_cache: Decimal | None = None

    @model_validator(mode="before")
    @classmethod
    def _parse_numbers(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        out = dict(data)
        for key in ("min_prompt_tokens", "utc_start", "utc_end"):
            if out.get(key) is not None:
                out[key] = to_decimal(out[key], what=f"override condition {key!r}")
        for key in (
            "prompt",
            "completion",
            "input_cache_read",
            "input_cache_write",
            "input_cache_write_1h",
            "audio",
            "input_audio_cache",
        ):
            if key in out:
                out[key] = _price(out[key], key)
        return out

    def applies(self, prompt_tokens: int | Decimal, utc_hhmm: int | None) -> bool:
        """Whether this entry applies to a request of ``prompt_tokens`` at ``utc_hhmm``.

        A time-window entry never applies when ``utc_hhmm`` is ``None``: the
        top-level prices already reflect the window in force when the listing was read.
        """
        if self.min_prompt_tokens is not None and not prompt_tokens > self.min_prompt_tokens:
            return False
        if self.utc_start is None and self.utc_end is None:
            return self.min_prompt_tokens is not None
        if utc_hhmm is None:
            return False
        start = self.utc_start if self.utc_start is not None else Decimal(0)
        end = self.utc_end if self.utc_end is not None else Decimal(2400)
        if start <= end:
            return start <= utc_hhmm < end
        return utc_hhmm >= start or utc_hhmm < end


class Pricing(BaseModel):
    """Exact prices in USD per unit (per token unless the name says otherwise).

    ``prompt`` and ``completion`` are ``None`` only for the ``"-1"`` dynamic-price
    sentinel (:attr:`is_dynamic`). Cache prices are ``None`` when the endpoint
    does not price caching. ``discount`` is a fraction already applied to the
    listed prices (negative means a markup).
    """

    model_config = _RECORD

    prompt: Decimal | None
    completion: Decimal | None
    request: Decimal | None = Decimal(0)
    image: Decimal | None = Decimal(0)
    image_token: Decimal | None = Decimal(0)
    image_output: Decimal | None = Decimal(0)
    audio: Decimal | None = Decimal(0)
    audio_output: Decimal | None = Decimal(0)
    input_audio_cache: Decimal | None = Decimal(0)
    web_search: Decimal | None = Decimal(0)
    internal_reasoning: Decimal | None = Decimal(0)
    input_cache_read: Decimal | None = None
    input_cache_write: Decimal | None = None
    input_cache_write_1h: Decimal | None = None
    discount: Decimal = Decimal(0)
    overrides: tuple[PricingOverride, ...] = ()
    is_dynamic: bool = False
    """True when any price carried the ``"-1"`` sentinel (dynamic routers)."""

    @model_validator(mode="before")
    @classmethod
    def _parse_prices(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        out = dict(data)
        dynamic = False
        for key in _PRICE_KEYS:
            if key not in out:
                continue
            raw = out[key]
            if raw is None and key in _ZERO_WHEN_MISSING:
                out[key] = Decimal(0)
                continue
            out[key] = _price(raw, key)
            dynamic = dynamic or (raw is not None and out[key] is None)
        for key in _REQUIRED_PRICES:
            if out.get(key, ...) is None and not dynamic:
                raise ValueError(f"price {key!r} must be a decimal string, got null")
        if out.get("discount") is None:
            out["discount"] = Decimal(0)
        else:
            out["discount"] = to_decimal(out["discount"], what="discount")
            if out["discount"] > 1:
                raise ValueError(f"discount must be ≤ 1 (1 = free), got {data['discount']!r}")
        if out.get("overrides") is None:
            out["overrides"] = ()
        out["is_dynamic"] = dynamic
        return out

    # --- per million -------------------------------------------------------------

    @property
    def prompt_per_million(self) -> Decimal | None:
        """USD per million prompt tokens (``None`` when dynamic)."""
        return None if self.prompt is None else self.prompt * PER_MILLION

    @property
    def completion_per_million(self) -> Decimal | None:
        """USD per million completion tokens (``None`` when dynamic)."""
        return None if self.completion is None else self.completion * PER_MILLION

    @property
    def cache_read_per_million(self) -> Decimal | None:
        """USD per million cached prompt tokens read (``None`` when not priced)."""
        return None if self.input_cache_read is None else self.input_cache_read * PER_MILLION

    # --- discount ----------------------------------------------------------------

    def list_price(self, price: Decimal | None) -> Decimal | None:
        """The undiscounted list price of a listed (net) price: ``price / (1 - discount)``.

        ``None`` when the price is unknown or the discount is 100 % (free: the list
        price cannot be recovered).
        """
        if price is None or self.discount == 1:
            return None
        return price / (1 - self.discount)

    # --- cost --------------------------------------------------------------------

    def effective(
        self, prompt_tokens: int | Decimal = 0, *, utc_hhmm: int | None = None
    ) -> Pricing:
        """These prices with the applicable ``overrides`` folded in (later entries win)."""
        changes: dict[str, Decimal] = {}
        for override in self.overrides:
            if override.applies(prompt_tokens, utc_hhmm):
                for key in ("prompt", "completion", "input_cache_read", "input_cache_write"):
                    value = getattr(override, key)
                    if value is not None:
                        changes[key] = value
        return self.model_copy(update=changes) if changes else self

    def cost(
        self,
        prompt_tokens: int | Decimal,
        completion_tokens: int | Decimal,
        *,
        cached_tokens: int | Decimal = 0,
        cache_write_tokens: int | Decimal = 0,
        requests: int | Decimal = 1,
        utc_hhmm: int | None = None,
    ) -> Decimal:
        """Exact USD for these token counts, as OpenRouter bills them (notes §5).

        ``prompt_tokens`` includes cached and cache-write tokens (as ``usage``
        reports them); ``completion_tokens`` includes reasoning tokens, which bill
        at the completion rate. Cached tokens bill at ``input_cache_read`` and
        written tokens at ``input_cache_write``, each falling back to ``prompt``
        when the endpoint does not price caching. ``requests`` multiplies the
        per-request fee. Overrides keyed on prompt length apply automatically;
        time-window overrides only when ``utc_hhmm`` is given. Token counts may be
        fractional Decimals (expected values).

        Raises:
            ValueError: negative counts, cached + written tokens above the prompt,
                or dynamic (``"-1"``) pricing, which has no cost to compute.
        """
        for name, count in (
            ("prompt_tokens", prompt_tokens),
            ("completion_tokens", completion_tokens),
            ("cached_tokens", cached_tokens),
            ("cache_write_tokens", cache_write_tokens),
            ("requests", requests),
        ):
            if count < 0:
                raise ValueError(f"{name} must be ≥ 0, got {count}")
        if cached_tokens + cache_write_tokens > prompt_tokens:
            raise ValueError(
                f"cached_tokens ({cached_tokens}) + cache_write_tokens ({cache_write_tokens}) "
                f"exceed prompt_tokens ({prompt_tokens})"
            )
        pricing = self.effective(prompt_tokens, utc_hhmm=utc_hhmm) if self.overrides else self
        prompt, completion = pricing.prompt, pricing.completion
        if prompt is None or completion is None:
            raise ValueError("dynamic pricing ('-1' sentinel) has no per-token cost to compute")
        read = prompt if pricing.input_cache_read is None else pricing.input_cache_read
        write = prompt if pricing.input_cache_write is None else pricing.input_cache_write
        uncached = prompt_tokens - cached_tokens - cache_write_tokens
        return (
            uncached * prompt
            + cached_tokens * read
            + cache_write_tokens * write
            + completion_tokens * completion
            + requests * (pricing.request or 0)
        )


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
    supports_multiple_audio_references: bool | None = None
    supports_image_reference: bool | None = None

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
