"""The simulated market: models, their per-provider endpoints, and the providers.

A market is read from a JSON or YAML file (format in docs/simulator.md); the
default one models ``moonshotai/kimi-k2.5`` as listed on OpenRouter. Prices are
written per million tokens, as people read them, and kept both as exact Decimals
and as integer picodollars per token, which is what the hot path multiplies.
Everything a listing route returns is rendered once, here, when the market loads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Any

from provider_router._constants import PER_MILLION
from provider_router._money import UNITS_PER_USD
from provider_router.testing._datafile import Fields, load_data_file, parse_data_text
from provider_router.testing.market.degradation import Serves

__all__ = ["DEFAULT_MARKET_FILE", "EndpointSpec", "Market", "ModelSpec", "ProviderSpec"]

DEFAULT_MARKET_FILE = "kimi-k2.5.yaml"
"""The bundled market in ``provider_router/testing/markets/``."""

QUANTIZATIONS = frozenset(
    [
        "int4",
        "int8",
        "fp4",
        "mxfp4",
        "nvfp4",
        "fp6",
        "fp8",
        "mxfp8",
        "fp16",
        "bf16",
        "fp32",
        "unknown",
    ]
)

_ENDPOINT_FIELDS = (
    "provider",
    "slug",
    "tag",
    "quantization",
    "pricing",
    "context_length",
    "max_completion_tokens",
    "max_prompt_tokens",
    "status",
    "uptime_last_30m",
    "uptime_last_5m",
    "uptime_last_1d",
    "latency_ms",
    "throughput",
    "supported_parameters",
    "supports_implicit_caching",
    "service_tier",
    "supports_tool_choice",
    "system_fingerprint",
    "omits",
    "fixed_parameters",
    "cache_min_tokens",
    "cache_ttl_seconds",
    "down",
    "serves",
)
_PRICING_FIELDS = (
    "prompt",
    "completion",
    "input_cache_read",
    "input_cache_write",
    "request",
    "image",
    "discount",
)
DEFAULT_CACHE_TTL_SECONDS = 300.0
"""How long a cached prefix lives after its last use when the market does not say."""
_MODEL_FIELDS = (
    "id",
    "canonical_slug",
    "name",
    "created",
    "description",
    "context_length",
    "supported_parameters",
    "hugging_face_id",
    "knowledge_cutoff",
    "expiration_date",
    "fixed_parameters",
    "distillable",
    "endpoints",
    "batch_endpoints",
)
_PROVIDER_FIELDS = (
    "name",
    "slug",
    "privacy_policy_url",
    "terms_of_service_url",
    "status_page_url",
    "headquarters",
    "datacenters",
)


OMITTABLE = ("system_fingerprint",)
"""Answer fields an endpoint may leave out (``omits``), as captured providers do."""
FIXABLE = ("temperature", "top_p")
"""Parameters a model's vendor may fix (``fixed_parameters``): other values are refused."""

TOOL_CHOICE_VARIANTS = ("none", "auto", "required", "function")
"""The ``tool_choice`` values ``supports_tool_choice`` reports on (SDK ``ToolChoiceSupport``)."""


def _json_number(value: float) -> int | float:
    """A whole number as JSON writes it (``0``, as captured listings do, not ``0.0``)."""
    return int(value) if value == int(value) else value


def _per_token_string(per_million: Decimal) -> str:
    text = format((per_million / PER_MILLION).normalize(), "f")
    return text


def _units_per_token(per_million: Decimal, fields: Fields, key: str) -> int:
    units = per_million * UNITS_PER_USD / PER_MILLION
    if units != units.to_integral_value():
        raise fields.error(key, "is finer than 1e-12 USD per token; round it")
    return int(units)


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    """One provider's endpoint for a model; prices are USD per million tokens."""

    provider_name: str
    slug: str
    tag: str
    quantization: str | None
    prompt: Decimal
    completion: Decimal
    input_cache_read: Decimal | None = None
    input_cache_write: Decimal | None = None
    request: Decimal = Decimal(0)
    image: Decimal = Decimal(0)
    """USD per input image (a fee on top of the image's prompt tokens)."""
    discount: float = 0.0
    context_length: int = 262_144
    max_completion_tokens: int | None = None
    max_prompt_tokens: int | None = None
    status: int = 0
    uptime_last_30m: float | None = 100.0
    uptime_last_5m: float | None = 100.0
    uptime_last_1d: float | None = 100.0
    latency_ms: float = 1000.0
    throughput: float = 40.0
    supported_parameters: tuple[str, ...] = ()
    supports_implicit_caching: bool = False
    service_tier: str | None = None
    tool_choice_support: tuple[str, ...] | None = None
    """The ``tool_choice`` variants that passed testing; None: all of them when the
    endpoint lists ``tool_choice`` in its parameters, none otherwise."""
    system_fingerprint: str | None = None
    """Sent as ``system_fingerprint`` in answers and every chunk; None: ``null`` in
    JSON answers and absent from chunks, as Chutes' captured streams have it."""
    omits: tuple[str, ...] = ()
    """Answer fields it leaves out (``system_fingerprint``: not even ``null`` in a JSON
    answer, as the 2025 Chutes, DeepInfra, Fireworks and Together captures show)."""
    fixed_parameters: tuple[tuple[str, tuple[float, ...]], ...] | None = None
    """The values each fixed parameter may take (a request with another is refused, as
    Moonshot AI refuses any temperature but its own); None: the model's, ``()``: none."""
    cache_min_tokens: int = 0
    cache_ttl_seconds: float = DEFAULT_CACHE_TTL_SECONDS
    down: bool = False
    serves: Serves | None = None
    """What it really serves, when that is not what it declares (a simulation of
    degradation: :mod:`~provider_router.testing.market.degradation`)."""
    # Derived once: integer picodollars per token (per request for the fee).
    prompt_units: int = field(init=False, default=0)
    completion_units: int = field(init=False, default=0)
    cache_read_units: int | None = field(init=False, default=None)
    cache_write_units: int | None = field(init=False, default=None)
    request_units: int = field(init=False, default=0)
    image_units: int = field(init=False, default=0)
    blended_price: Decimal = field(init=False, default=Decimal(0))

    def __post_init__(self) -> None:
        scale = UNITS_PER_USD / PER_MILLION
        object.__setattr__(self, "prompt_units", int(self.prompt * scale))
        object.__setattr__(self, "completion_units", int(self.completion * scale))
        if self.input_cache_read is not None:
            object.__setattr__(self, "cache_read_units", int(self.input_cache_read * scale))
        if self.input_cache_write is not None:
            object.__setattr__(self, "cache_write_units", int(self.input_cache_write * scale))
        object.__setattr__(self, "request_units", int(self.request * UNITS_PER_USD))
        object.__setattr__(self, "image_units", int(self.image * UNITS_PER_USD))
        object.__setattr__(self, "blended_price", self.prompt + self.completion)

    @property
    def sends_system_fingerprint(self) -> bool:
        """Whether its JSON answers carry ``system_fingerprint`` at all."""
        return "system_fingerprint" not in self.omits

    def refused_parameter(self, body: dict[str, Any]) -> str | None:
        """Why it refuses a request setting a fixed parameter to another value, or None."""
        for name, allowed in self.fixed_parameters or ():
            value = body.get(name)
            if value is None or isinstance(value, bool) or not isinstance(value, int | float):
                continue  # absent (the vendor's default), or another field's 400
            if value not in allowed:
                values = " or ".join(format(v, "g") for v in allowed)
                return f"invalid {name}: only {values} is allowed for this model"
        return None

    def tool_choice_flags(self) -> dict[str, bool]:
        """``supports_tool_choice``: which ``tool_choice`` variants the endpoint honours."""
        passed = self.tool_choice_support
        if passed is None:
            passed = TOOL_CHOICE_VARIANTS if "tool_choice" in self.supported_parameters else ()
        return {variant: variant in passed for variant in TOOL_CHOICE_VARIANTS}

    def listing(self, model: ModelSpec) -> dict[str, Any]:
        """The ``PublicEndpoint`` object OpenRouter lists for this endpoint."""
        pricing: dict[str, Any] = {
            "prompt": _per_token_string(self.prompt),
            "completion": _per_token_string(self.completion),
        }
        if self.input_cache_read is not None:
            pricing["input_cache_read"] = _per_token_string(self.input_cache_read)
        if self.input_cache_write is not None:
            pricing["input_cache_write"] = _per_token_string(self.input_cache_write)
        if self.request:
            pricing["request"] = format(self.request.normalize(), "f")
        if self.image:
            pricing["image"] = format(self.image.normalize(), "f")
        pricing["discount"] = _json_number(self.discount)
        latency = self.latency_ms
        throughput = self.throughput
        listing: dict[str, Any] = {
            "name": f"{self.provider_name} | {model.canonical_slug}",
            "model_id": model.id,
            "model_name": model.name,
            "context_length": self.context_length,
            "pricing": pricing,
            "provider_name": self.provider_name,
            "tag": self.tag,
            "quantization": self.quantization,
            "max_completion_tokens": self.max_completion_tokens,
            "max_prompt_tokens": self.max_prompt_tokens,
            "supported_parameters": list(self.supported_parameters),
            "status": self.status,
            "uptime_last_30m": self.uptime_last_30m,
            "uptime_last_5m": self.uptime_last_5m,
            "uptime_last_1d": self.uptime_last_1d,
            "supports_implicit_caching": self.supports_implicit_caching,
            # What a real 2026 listing carries (docs/simulator.md, "Listings and
            # metadata"); the newest SDK also requires native_tools, service_tier and
            # supports_diarization, which no real listing we hold has: not invented.
            "supports_tool_choice": self.tool_choice_flags(),
            "supports_voice_cloning": False,
            "supports_image_reference": False,
            "supports_multiple_audio_references": False,
            "latency_last_30m": {
                "p50": latency,
                "p75": round(latency * 1.5, 2),
                "p90": round(latency * 2.2, 2),
                "p99": round(latency * 6.0, 2),
            },
            "throughput_last_30m": {
                "p50": throughput,
                "p75": round(throughput * 1.2, 2),
                "p90": round(throughput * 1.35, 2),
                "p99": round(throughput * 1.65, 2),
            },
        }
        if self.service_tier is not None:
            # Only a tier endpoint says its tier (an assumption: no capture of one).
            listing["service_tier"] = self.service_tier
        return listing


def _anonymous(listing: dict[str, Any]) -> dict[str, Any]:
    data = listing["data"]
    endpoints = [
        {**e, "latency_last_30m": None, "throughput_last_30m": None} for e in data["endpoints"]
    ]
    return {**listing, "data": {**data, "endpoints": endpoints}}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A model and the endpoints that serve it."""

    id: str
    canonical_slug: str
    name: str
    created: int
    description: str
    context_length: int
    endpoints: tuple[EndpointSpec, ...]
    supported_parameters: tuple[str, ...] = ()
    hugging_face_id: str | None = None
    knowledge_cutoff: str | None = None
    expiration_date: str | None = None
    batch_endpoints: tuple[EndpointSpec, ...] = ()
    """The ``:batch`` endpoints (the Batch API's own listing and prices); none: sync only."""
    distillable: bool = True
    """Whether its author allows training on its outputs (``enforce_distillable_text``
    routes only to such models; no listing says which are: an assumption per model)."""
    has_tiers: bool = field(init=False, default=False)
    """Whether an endpoint is a service-tier one (``flex``, ``priority``): routing
    then filters by tier (computed once, here, to keep the common path free of it)."""

    def __post_init__(self) -> None:
        tiers = any(e.service_tier in ("flex", "priority") for e in self.endpoints)
        object.__setattr__(self, "has_tiers", tiers)

    def listing(self) -> dict[str, Any]:
        """The ``Model`` object of ``GET /models``; pricing from the cheapest stable endpoint."""
        # A deranked or down endpoint does not set the model's headline price
        # (BaseTen, down, matches Chutes' price but prices no cache reads).
        stable = [e for e in self.endpoints if e.status >= 0 and not e.down] or self.endpoints
        cheapest = min(stable, key=lambda e: (e.blended_price, e.tag))
        params = sorted(
            set(self.supported_parameters).union(*(e.supported_parameters for e in self.endpoints))
        )
        return {
            "id": self.id,
            "canonical_slug": self.canonical_slug,
            "hugging_face_id": self.hugging_face_id,
            "name": self.name,
            "created": self.created,
            "description": self.description,
            "context_length": self.context_length,
            "architecture": _ARCHITECTURE,
            "pricing": {
                "prompt": _per_token_string(cheapest.prompt),
                "completion": _per_token_string(cheapest.completion),
                **(
                    {"input_cache_read": _per_token_string(cheapest.input_cache_read)}
                    if cheapest.input_cache_read is not None
                    else {}
                ),
            },
            "top_provider": {
                "context_length": cheapest.context_length,
                "max_completion_tokens": cheapest.max_completion_tokens,
                "is_moderated": False,
            },
            "per_request_limits": None,
            "supported_parameters": params,
            "default_parameters": {},
            "supported_voices": None,
            "knowledge_cutoff": self.knowledge_cutoff,
            "expiration_date": self.expiration_date,
            "links": {"details": f"/api/v1/models/{self.canonical_slug}/endpoints"},
            **({"reasoning": {"mandatory": False}} if "reasoning" in params else {}),
        }

    def endpoints_listing(self) -> dict[str, Any]:
        """The body of ``GET /models/{author}/{slug}/endpoints``."""
        return {
            "data": {
                "id": self.id,
                "name": self.name,
                "created": self.created,
                "description": self.description,
                "architecture": {**_ARCHITECTURE, "tokenizer": "Other", "instruct_type": None},
                "endpoints": [e.listing(self) for e in self.endpoints],
            }
        }

    def batch_endpoints_listing(self) -> dict[str, Any]:
        """The body of ``GET /models/{author}/{slug}:batch/endpoints`` (empty: no batch)."""
        body = self.endpoints_listing()
        body["data"]["id"] = f"{self.id}:batch"
        body["data"]["endpoints"] = [e.listing(self) for e in self.batch_endpoints]
        return body


_ARCHITECTURE: dict[str, Any] = {
    "modality": "text+image->text",
    "input_modalities": ["text", "image"],
    "output_modalities": ["text"],
    "tokenizer": "Other",
    "instruct_type": None,
}


@dataclass(frozen=True, slots=True)
class ProviderSpec:
    """A provider as ``GET /providers`` lists it."""

    name: str
    slug: str
    privacy_policy_url: str | None = None
    terms_of_service_url: str | None = None
    status_page_url: str | None = None
    headquarters: str | None = None
    datacenters: tuple[str, ...] | None = None

    def listing(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "slug": self.slug,
            "privacy_policy_url": self.privacy_policy_url,
            "terms_of_service_url": self.terms_of_service_url,
            "status_page_url": self.status_page_url,
            "headquarters": self.headquarters,
            "datacenters": list(self.datacenters) if self.datacenters is not None else None,
        }


class Market:
    """Models, endpoints and providers, with every listing body pre-rendered."""

    def __init__(
        self, models: list[ModelSpec], providers: list[ProviderSpec], *, source: str = "<memory>"
    ) -> None:
        if not models:
            raise ValueError("a market needs at least one model")
        self.source = source
        self.models: dict[str, ModelSpec] = {}
        for model in models:
            self.models[model.id] = model
            self.models.setdefault(model.canonical_slug, model)
        # Providers not described in the file still get a /providers row.
        self.providers = list(providers)
        known = {p.slug for p in providers}
        for model in models:
            for endpoint in model.endpoints:
                if endpoint.slug not in known:
                    known.add(endpoint.slug)
                    self.providers.append(
                        ProviderSpec(name=endpoint.provider_name, slug=endpoint.slug)
                    )
        unique = {m.id: m for m in models}
        self.models_body = json.dumps(
            {
                "data": [m.listing() for m in unique.values()],
                "total_count": len(unique),
                "links": {"next": None},
            }
        ).encode()
        self.models_count_body = json.dumps({"data": {"count": len(unique)}}).encode()
        self.model_bodies = {
            key: json.dumps({"data": model.listing()}).encode()
            for key, model in self.models.items()
        }
        self.providers_body = json.dumps({"data": [p.listing() for p in self.providers]}).encode()
        self.endpoints_bodies = {
            key: json.dumps(model.endpoints_listing()).encode()
            for key, model in self.models.items()
        }
        self.batch_endpoints_bodies = {
            key: json.dumps(model.batch_endpoints_listing()).encode()
            for key, model in self.models.items()
        }
        self.anonymous_endpoints_bodies = {
            key: json.dumps(_anonymous(model.endpoints_listing())).encode()
            for key, model in self.models.items()
        }
        """The same listings as a request without a key sees them: no recent latency
        or throughput (null, as unauthenticated real listings show)."""

    @classmethod
    def default(cls) -> Market:
        """The bundled ``moonshotai/kimi-k2.5`` market."""
        ref = resources.files("provider_router.testing") / "markets" / DEFAULT_MARKET_FILE
        text = ref.read_text(encoding="utf-8")
        return cls.from_data(parse_data_text(text, DEFAULT_MARKET_FILE), Path(DEFAULT_MARKET_FILE))

    @classmethod
    def from_file(cls, path: str | Path) -> Market:
        """Load a market from a JSON or YAML file; errors name the file and line."""
        path = Path(path)
        return cls.from_data(load_data_file(path), path)

    @classmethod
    def from_data(cls, data: Any, path: Path) -> Market:
        top = Fields(path, data, "market", line=1)
        top.reject_unknown(("models", "providers"))
        models = top.parse_each(
            "models", _parse_model, prefix="models", noun="model", unique=("id", lambda m: m.id)
        )
        providers = [
            _parse_provider(path, item, f"providers[{i}]", top.item_line("providers", i))
            for i, item in enumerate(top.items("providers"))
        ]
        return cls(models, providers, source=str(path))

    def __repr__(self) -> str:
        return (
            f"Market(source={self.source!r}, models={sorted({m.id for m in self.models.values()})})"
        )


def _parse_pricing(fields: Fields) -> dict[str, Any]:
    pricing = Fields(
        fields.path,
        fields.raw("pricing"),
        f"{fields.where}.pricing",
        line=fields.line_of("pricing"),
    )
    pricing.reject_unknown(_PRICING_FIELDS)
    zero = Decimal(0)
    result: dict[str, Any] = {
        "prompt": pricing.decimal("prompt", minimum=zero),
        "completion": pricing.decimal("completion", minimum=zero),
    }
    for key in ("prompt", "completion"):
        _units_per_token(result[key], pricing, key)
    for key in ("input_cache_read", "input_cache_write"):
        if pricing.has(key):
            result[key] = pricing.decimal(key, minimum=zero)
            _units_per_token(result[key], pricing, key)
    for fee in ("request", "image"):
        if pricing.has(fee):
            result[fee] = pricing.decimal(fee, minimum=zero)
    if pricing.has("discount"):
        result["discount"] = pricing.number("discount", minimum=-1.0, maximum=1.0)
    return result


_SERVES_FIELDS = ("agreement", "tool_schema_error_rate", "prompt_token_skew", "after_requests")


def _parse_serves(fields: Fields) -> Serves:
    serves = Fields(
        fields.path, fields.raw("serves"), f"{fields.where}.serves", line=fields.line_of("serves")
    )
    serves.reject_unknown(_SERVES_FIELDS)
    return Serves(
        agreement=serves.number("agreement", 1.0, minimum=0, maximum=1),
        tool_schema_error_rate=serves.number("tool_schema_error_rate", 0.0, minimum=0, maximum=1),
        prompt_token_skew=serves.number("prompt_token_skew", 1.0, minimum=0.5, maximum=2),
        after_requests=serves.integer("after_requests", 0, minimum=0),
    )


def _parse_omits(fields: Fields) -> tuple[str, ...]:
    if not fields.has("omits"):
        return ()
    omits = tuple(fields.text_list("omits"))
    unknown = sorted(set(omits) - set(OMITTABLE))
    if unknown:
        raise fields.error("omits", f"unknown field(s) {unknown} (one of {list(OMITTABLE)})")
    return omits


def _parse_fixed(fields: Fields) -> tuple[tuple[str, tuple[float, ...]], ...] | None:
    """``fixed_parameters: {temperature: [1.0], top_p: [0.95]}`` (``{}``: none fixed)."""
    if not fields.has("fixed_parameters"):
        return None
    fixed = Fields(
        fields.path,
        fields.raw("fixed_parameters"),
        f"{fields.where}.fixed_parameters",
        line=fields.line_of("fixed_parameters"),
    )
    fixed.reject_unknown(FIXABLE)
    out = []
    for name in FIXABLE:
        if fixed.has(name):
            values = fixed.raw(name)
            if (
                not isinstance(values, list)
                or not values
                or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
            ):
                raise fixed.error(name, f"expected a non-empty list of numbers, got {values!r}")
            out.append((name, tuple(float(v) for v in values)))
    return tuple(out)


def _parse_endpoint(path: Path, data: object, where: str, line: int | None) -> EndpointSpec:
    f = Fields(path, data, where, line=line)
    f.reject_unknown(_ENDPOINT_FIELDS)
    provider = f.text("provider")
    slug = f.text("slug", provider.lower().replace(" ", ""))
    if slug != slug.lower() or "/" in slug:
        raise f.error("slug", f"must be a lowercase provider slug without '/', got {slug!r}")
    tag = f.text("tag", slug)
    if tag != tag.lower() or tag.split("/")[0] != slug:
        raise f.error("tag", f"must be lowercase and start with the slug {slug!r}, got {tag!r}")
    quantization = f.opt_text("quantization")
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise f.error(
            "quantization", f"unknown value {quantization!r} (one of {sorted(QUANTIZATIONS)})"
        )
    status = f.integer("status", 0)
    uptime = {
        k: f.opt_number(k, minimum=0, maximum=100)
        for k in ("uptime_last_30m", "uptime_last_5m", "uptime_last_1d")
    }
    tool_choice = None
    if f.has("supports_tool_choice"):
        tool_choice = tuple(f.text_list("supports_tool_choice"))
        unknown = sorted(set(tool_choice) - set(TOOL_CHOICE_VARIANTS))
        if unknown:
            raise f.error(
                "supports_tool_choice",
                f"unknown variant(s) {unknown} (one of {list(TOOL_CHOICE_VARIANTS)})",
            )
    return EndpointSpec(
        provider_name=provider,
        slug=slug,
        tag=tag,
        quantization=quantization,
        context_length=f.integer("context_length", 262_144, minimum=1),
        max_completion_tokens=f.opt_integer("max_completion_tokens", minimum=1),
        max_prompt_tokens=f.opt_integer("max_prompt_tokens", minimum=1),
        status=status,
        latency_ms=f.number("latency_ms", 1000.0, minimum=0),
        throughput=f.number("throughput", 40.0, minimum=0.001),
        supported_parameters=tuple(f.text_list("supported_parameters")),
        supports_implicit_caching=f.flag("supports_implicit_caching", False),
        service_tier=f.opt_text("service_tier"),
        tool_choice_support=tool_choice,
        system_fingerprint=f.opt_text("system_fingerprint"),
        omits=_parse_omits(f),
        fixed_parameters=_parse_fixed(f),
        cache_min_tokens=f.integer("cache_min_tokens", 0, minimum=0),
        cache_ttl_seconds=f.number("cache_ttl_seconds", DEFAULT_CACHE_TTL_SECONDS, minimum=0.001),
        down=f.flag("down", False),
        serves=_parse_serves(f) if f.has("serves") else None,
        uptime_last_30m=uptime["uptime_last_30m"],
        uptime_last_5m=uptime["uptime_last_5m"],
        uptime_last_1d=uptime["uptime_last_1d"],
        **_parse_pricing(f),
    )


def _parse_model(path: Path, data: object, where: str, line: int | None) -> ModelSpec:
    f = Fields(path, data, where, line=line)
    f.reject_unknown(_MODEL_FIELDS)
    model_id = f.text("id")
    if model_id.count("/") != 1:
        raise f.error("id", f"must look like 'author/slug', got {model_id!r}")
    endpoints = f.parse_each(
        "endpoints",
        _parse_endpoint,
        prefix=f"{where}.endpoints",
        noun="endpoint",
        unique=("tag", lambda e: e.tag),
    )
    batch_endpoints = (
        f.parse_each(
            "batch_endpoints",
            _parse_endpoint,
            prefix=f"{where}.batch_endpoints",
            noun="batch endpoint",
            unique=("tag", lambda e: e.tag),
        )
        if f.has("batch_endpoints") and f.items("batch_endpoints")
        else []
    )
    canonical = f.text("canonical_slug", model_id)
    fixed = _parse_fixed(f)
    if fixed:  # the vendor's rule, on every endpoint that does not say otherwise
        endpoints = [
            e if e.fixed_parameters is not None else replace(e, fixed_parameters=fixed)
            for e in endpoints
        ]
    return ModelSpec(
        id=model_id,
        canonical_slug=canonical,
        name=f.text("name", model_id),
        created=f.integer("created", 1_700_000_000, minimum=0),
        description=f.raw("description") or "",
        context_length=f.integer(
            "context_length", max(e.context_length for e in endpoints), minimum=1
        ),
        endpoints=tuple(endpoints),
        supported_parameters=tuple(f.text_list("supported_parameters")),
        hugging_face_id=f.opt_text("hugging_face_id"),
        knowledge_cutoff=f.opt_text("knowledge_cutoff"),
        expiration_date=f.opt_text("expiration_date"),
        batch_endpoints=tuple(batch_endpoints),
        distillable=f.flag("distillable", True),
    )


def _parse_provider(path: Path, data: object, where: str, line: int | None) -> ProviderSpec:
    f = Fields(path, data, where, line=line)
    f.reject_unknown(_PROVIDER_FIELDS)
    datacenters = f.text_list("datacenters") if f.has("datacenters") else None
    return ProviderSpec(
        name=f.text("name"),
        slug=f.text("slug"),
        privacy_policy_url=f.opt_text("privacy_policy_url"),
        terms_of_service_url=f.opt_text("terms_of_service_url"),
        status_page_url=f.opt_text("status_page_url"),
        headquarters=f.opt_text("headquarters"),
        datacenters=tuple(datacenters) if datacenters is not None else None,
    )
