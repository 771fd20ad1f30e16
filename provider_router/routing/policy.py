"""Which endpoints a policy allows, and why.

:class:`ProviderPolicy` is a frozen value: build it once, evaluate it on every
listing. :meth:`ProviderPolicy.evaluate` is pure (no I/O, no clock) and judges
each endpoint on its own, so the verdict on an endpoint never depends on the
other endpoints or their order. Every rule that fails is named in the reason;
the first failing rule (in the order of :class:`DecisionCode`) is the code.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from typing import Final, Literal, overload

from provider_router._constants import PER_MILLION
from provider_router._exceptions import ConfigurationError
from provider_router._money import to_decimal
from provider_router.catalog.quantization import (
    DEFAULT_NATIVE_PRECISION,
    NativePrecisionRegistry,
    parse_quantization,
    precision_rank,
    read_scheme,
    scheme_tier,
)
from provider_router.catalog.records import Endpoint, EndpointHealth, ModelEndpoints, Quantization
from provider_router.catalog.verdicts import VerificationReport

__all__ = [
    "Decision",
    "DecisionCode",
    "Decisions",
    "ProviderPolicy",
    "UnknownQuantization",
    "UnrecognizedQuantization",
]

UnknownQuantization = Literal["assume_native", "reject", "accept"]
_UNKNOWN_CHOICES: tuple[str, ...] = ("assume_native", "reject", "accept")
UnrecognizedQuantization = Literal["reject", "accept"]
_UNRECOGNIZED_CHOICES: tuple[str, ...] = ("reject", "accept")
ToolChoiceVariant = Literal["none", "auto", "required", "function"]
_TOOL_CHOICES: tuple[str, ...] = ("none", "auto", "required", "function")
DEFAULT_ALLOWED_HEALTH: frozenset[EndpointHealth] = frozenset(
    {EndpointHealth.OK, EndpointHealth.DEGRADED, EndpointHealth.UNKNOWN}
)
"""Down endpoints are rejected unless a policy allows them."""


class DecisionCode(StrEnum):
    """Machine-readable verdicts; rejections listed in the order rules are checked."""

    ALLOWED = "allowed"
    PRICING_DYNAMIC = "pricing_dynamic"
    PROVIDER_EXCLUDED = "provider_excluded"
    PROVIDER_NOT_ALLOWED = "provider_not_allowed"
    QUANTIZATION_BELOW_MINIMUM = "quantization_below_minimum"
    QUANTIZATION_UNKNOWN = "quantization_unknown"
    QUANTIZATION_UNRECOGNIZED = "quantization_unrecognized"
    STATUS_NOT_ALLOWED = "status_not_allowed"
    UPTIME_BELOW_MINIMUM = "uptime_below_minimum"
    MISSING_PARAMETERS = "missing_parameters"
    TOOL_CHOICE_UNSUPPORTED = "tool_choice_unsupported"
    SERVICE_TIER_NOT_ALLOWED = "service_tier_not_allowed"
    CONTEXT_TOO_SHORT = "context_too_short"
    PROMPT_PRICE_ABOVE_MAXIMUM = "prompt_price_above_maximum"
    COMPLETION_PRICE_ABOVE_MAXIMUM = "completion_price_above_maximum"
    VERIFICATION_FAILED = "verification_failed"


@dataclass(frozen=True, slots=True)
class Decision:
    """The verdict on one endpoint.

    Attributes:
        endpoint: the endpoint judged.
        allowed: whether the policy keeps it.
        reason: a sentence a person can read: every failed rule, or why it passed
            (including any assumption made about its quantization).
        code: the first failed rule, or ``ALLOWED``.
        effective_quantization: the precision the verdict used: the declared one,
            or the assumed native precision when undeclared (``None`` if neither).
    """

    endpoint: Endpoint
    allowed: bool
    reason: str
    code: DecisionCode
    effective_quantization: Quantization | None = None


@dataclass(frozen=True, slots=True)
class Decisions(Sequence[Decision]):
    """The verdicts on a listing, in the listing's order."""

    model_id: str
    items: tuple[Decision, ...]

    @overload
    def __getitem__(self, index: int) -> Decision: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Decision]: ...
    def __getitem__(self, index: int | slice) -> Decision | Sequence[Decision]:
        return self.items[index]

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Decision]:
        return iter(self.items)

    @property
    def allowed(self) -> tuple[Endpoint, ...]:
        """The endpoints the policy keeps, in listing order."""
        return tuple(d.endpoint for d in self.items if d.allowed)

    @property
    def rejected(self) -> tuple[Decision, ...]:
        """The decisions that reject, in listing order."""
        return tuple(d for d in self.items if not d.allowed)


def _names(values: Iterable[str] | str | None, what: str) -> frozenset[str]:
    if values is None:
        return frozenset()
    if isinstance(values, str):
        values = [values]
    names = frozenset(v.strip().lower() for v in values)
    if "" in names:
        raise ConfigurationError(f"{what} contains an empty provider name")
    return names


def _describe_undeclared(endpoint: Endpoint) -> str:
    if endpoint.quantization_raw is None:
        return "not declared"
    return "declared 'unknown'"


def _rank(quantization: Quantization) -> int:
    rank = precision_rank(quantization)
    if rank is None:  # callers only pass ranked values; guard against future edits
        raise ConfigurationError(f"{quantization.value} has no precision rank")
    return rank


def _max_price(value: object, what: str) -> Decimal | None:
    if value is None:
        return None
    try:
        price = to_decimal(value, what=what)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    if price < 0:
        raise ConfigurationError(f"{what} must be ≥ 0 USD per million tokens, got {value!r}")
    return price


STANDARD_TIERS: Final[frozenset[str | None]] = frozenset({None, "default", "standard"})
"""The ``service_tier`` values of a standard endpoint (kept by default)."""


@dataclass(frozen=True, slots=True, init=False)
class ProviderPolicy:
    """Rules an endpoint must pass to be used. All rules compose (all must pass).

    Args:
        exclude_below: reject endpoints whose precision ranks below this
            (``"int4"`` rejects fp4/mxfp4/nvfp4); ``None`` for no floor.
        unknown: how an undeclared (``unknown``/``null``) quantization is
            judged: ``"assume_native"`` (default) takes the model's native
            precision from ``native_precision`` and compares that; ``"reject"``
            rejects the endpoint; ``"accept"`` lets it pass.
        unrecognized: a string OpenRouter does not list is judged by the bit
            width and kind read from it (``q4_k_m``: 4-bit integer); one that
            names none is *unrecognized*: ``"reject"`` (default) rejects it under
            any floor, ``"accept"`` lets it pass. Never assumed native.
        native_precision: the registry of native precisions.
        exclude_providers: reject these providers; each name matches a display
            name (``"Moonshot AI"``), a provider slug (``"deepinfra"``) or a full
            tag (``"deepinfra/fp4"``), ignoring case.
        only: if given, reject every provider not named here (same matching).
        min_uptime: reject endpoints whose uptime percent is below this; an
            endpoint that reports no uptime passes (the reason says so).
        allowed_health: statuses to keep; down endpoints are rejected by default.
        required_parameters: ``supported_parameters`` an endpoint must list
            (e.g. ``["tools"]``).
        tool_choice: the ``tool_choice`` the requests use (``"required"``, or
            ``"function"`` for a named function): reject endpoints whose
            ``supports_tool_choice`` says it failed OpenRouter's testing;
            endpoints that do not report it pass (the reason says so).
        service_tiers: the service tiers to keep (``None`` in it is a standard
            endpoint: ``service_tiers=[None]`` keeps only standard ones); default
            the standard tier (null, ``default`` or ``standard``) and no other:
            a ``priority`` or ``fast`` endpoint bills above the standard price for
            speed, a ``flex`` one is slower, fails more and never falls back
            (OpenRouter's service-tiers guide).
        allow_flex: keep ``flex`` endpoints too (a job that can wait pays the flex
            price: OpenRouter bills the tier that served).
        min_context_length: reject endpoints with a shorter context window.
        max_prompt_price: reject endpoints charging more, in USD per million
            prompt tokens (OpenRouter's ``max_price`` unit).
        max_completion_price: the same for completion tokens.
        verified: a :class:`~provider_router.VerificationReport` of this model
            (:func:`provider_router.checks.verify`): reject endpoints that failed it, with
            the measured reason. Endpoints it did not measure, or could not tell
            about, pass (the reason says so); a report of another model is ignored.
        rank_per_accepted_sample: rank the allowed endpoints by cost per accepted
            sample (expected cost per successful request ÷ the pass rate ``verified``
            measured; :func:`provider_router.rank`) instead of by expected cost per
            successful request: the order a Router gives OpenRouter. Needs
            ``verified``.

    Raises:
        ConfigurationError: an argument is invalid (unknown precision or choice,
            negative price, empty provider name).
    """

    exclude_below: Quantization | None
    unknown: UnknownQuantization
    unrecognized: UnrecognizedQuantization
    native_precision: NativePrecisionRegistry
    exclude_providers: frozenset[str]
    only: frozenset[str] | None
    min_uptime: float | None
    allowed_health: frozenset[EndpointHealth]
    required_parameters: frozenset[str]
    tool_choice: ToolChoiceVariant | None
    service_tiers: frozenset[str | None] | None
    allow_flex: bool
    min_context_length: int | None
    max_prompt_price: Decimal | None
    max_completion_price: Decimal | None
    verified: VerificationReport | None
    rank_per_accepted_sample: bool

    def __init__(
        self,
        exclude_below: Quantization | str | None = None,
        *,
        unknown: UnknownQuantization = "assume_native",
        unrecognized: UnrecognizedQuantization = "reject",
        native_precision: NativePrecisionRegistry = DEFAULT_NATIVE_PRECISION,
        exclude_providers: Iterable[str] = (),
        only: Iterable[str] | None = None,
        min_uptime: float | None = None,
        allowed_health: Iterable[EndpointHealth | str] = DEFAULT_ALLOWED_HEALTH,
        required_parameters: Iterable[str] = (),
        tool_choice: ToolChoiceVariant | None = None,
        service_tiers: Iterable[str | None] | None = None,
        allow_flex: bool = False,
        min_context_length: int | None = None,
        max_prompt_price: Decimal | str | float | None = None,
        max_completion_price: Decimal | str | float | None = None,
        verified: VerificationReport | None = None,
        rank_per_accepted_sample: bool = False,
    ) -> None:
        set_ = object.__setattr__  # frozen: assign once, here
        set_(
            self,
            "exclude_below",
            None
            if exclude_below is None
            else parse_quantization(exclude_below, what="exclude_below"),
        )
        if unknown not in _UNKNOWN_CHOICES:
            raise ConfigurationError(
                f"unknown must be one of {', '.join(_UNKNOWN_CHOICES)}; got {unknown!r}"
            )
        set_(self, "unknown", unknown)
        if unrecognized not in _UNRECOGNIZED_CHOICES:
            raise ConfigurationError(
                f"unrecognized must be one of {', '.join(_UNRECOGNIZED_CHOICES)}; "
                f"got {unrecognized!r}"
            )
        set_(self, "unrecognized", unrecognized)
        if not isinstance(native_precision, NativePrecisionRegistry):
            raise ConfigurationError("native_precision must be a NativePrecisionRegistry")
        set_(self, "native_precision", native_precision)
        set_(self, "exclude_providers", _names(exclude_providers, "exclude_providers"))
        if only is not None:
            only = _names(only, "only")
            if not only:
                raise ConfigurationError("only must name at least one provider (or be None)")
        set_(self, "only", only)
        if min_uptime is not None and not 0 <= min_uptime <= 100:
            raise ConfigurationError(f"min_uptime must be a percentage 0..100, got {min_uptime}")
        set_(self, "min_uptime", min_uptime)
        try:
            health = frozenset(EndpointHealth(h) for h in allowed_health)
        except ValueError:
            choices = ", ".join(h.value for h in EndpointHealth)
            raise ConfigurationError(
                f"allowed_health must hold values of {choices}; got {list(allowed_health)}"
            ) from None
        set_(self, "allowed_health", health)
        required = (
            [required_parameters] if isinstance(required_parameters, str) else required_parameters
        )
        set_(self, "required_parameters", frozenset(required))
        if tool_choice is not None and tool_choice not in _TOOL_CHOICES:
            raise ConfigurationError(
                f"tool_choice must be one of {', '.join(_TOOL_CHOICES)}; got {tool_choice!r}"
            )
        set_(self, "tool_choice", tool_choice)
        tiers = None if service_tiers is None else frozenset(service_tiers)
        if tiers is not None and not tiers:
            raise ConfigurationError("service_tiers must keep at least one tier (or be None)")
        set_(self, "service_tiers", tiers)
        if not isinstance(allow_flex, bool):
            raise ConfigurationError(f"allow_flex must be true or false, got {allow_flex!r}")
        set_(self, "allow_flex", allow_flex)
        if min_context_length is not None and min_context_length < 0:
            raise ConfigurationError(f"min_context_length must be ≥ 0, got {min_context_length}")
        set_(self, "min_context_length", min_context_length)
        set_(self, "max_prompt_price", _max_price(max_prompt_price, "max_prompt_price"))
        set_(self, "max_completion_price", _max_price(max_completion_price, "max_completion_price"))
        if verified is not None and not isinstance(verified, VerificationReport):
            raise ConfigurationError(
                "verified must be a VerificationReport (provider_router.checks.verify(), or "
                f"VerificationReport.load(path)); got {type(verified).__name__}"
            )
        set_(self, "verified", verified)
        if not isinstance(rank_per_accepted_sample, bool):
            raise ConfigurationError(
                f"rank_per_accepted_sample must be true or false, got {rank_per_accepted_sample!r}"
            )
        if rank_per_accepted_sample and verified is None:
            raise ConfigurationError(
                "rank_per_accepted_sample needs verified= (a VerificationReport: the pass "
                "rates it ranks by)"
            )
        set_(self, "rank_per_accepted_sample", rank_per_accepted_sample)

    def ranking_report(self, model_id: str) -> VerificationReport | None:
        """The report to rank ``model_id``'s endpoints by cost per accepted sample
        (None: rank by expected cost per successful request)."""
        report = self.verified
        if not self.rank_per_accepted_sample or report is None or report.model != model_id:
            return None
        return report

    # --- evaluation ------------------------------------------------------------------

    def _tier_allowed(self, tier: str | None) -> bool:
        if tier == "flex" and self.allow_flex:
            return True
        if self.service_tiers is not None:
            return tier in self.service_tiers
        return tier in STANDARD_TIERS

    def evaluate(
        self, model: ModelEndpoints | Iterable[Endpoint], *, model_id: str | None = None
    ) -> Decisions:
        """Judge every endpoint of a listing (or of a bare iterable with ``model_id``).

        Raises:
            ConfigurationError: a bare iterable was given without ``model_id``
                (native precision is looked up by model).
        """
        if isinstance(model, ModelEndpoints):
            model_id = model_id or model.id
            endpoints: Iterable[Endpoint] = model.endpoints
        else:
            endpoints = model
        if model_id is None:
            raise ConfigurationError("evaluate() needs model_id= when given bare endpoints")
        return Decisions(model_id, tuple(self.decide(e, model_id=model_id) for e in endpoints))

    def decide(self, endpoint: Endpoint, *, model_id: str) -> Decision:
        """Judge one endpoint of model ``model_id``."""
        failures: list[tuple[DecisionCode, str]] = []
        notes: list[str] = []
        if endpoint.pricing.is_dynamic:
            failures.append(
                (
                    DecisionCode.PRICING_DYNAMIC,
                    "pricing is dynamic ('-1'); it cannot be priced or ranked",
                )
            )
        self._check_provider(endpoint, failures)
        effective = self._check_quantization(endpoint, model_id, failures, notes)
        self._check_health(endpoint, failures, notes)
        self._check_capabilities(endpoint, failures, notes)
        self._check_prices(endpoint, failures)
        self._check_verified(endpoint, model_id, failures, notes)
        if failures:
            return Decision(
                endpoint=endpoint,
                allowed=False,
                reason="; ".join(text for _, text in failures),
                code=failures[0][0],
                effective_quantization=effective,
            )
        return Decision(
            endpoint=endpoint,
            allowed=True,
            reason="; ".join(notes) or "passes every rule",
            code=DecisionCode.ALLOWED,
            effective_quantization=effective,
        )

    def _matches(self, endpoint: Endpoint, names: frozenset[str]) -> bool:
        return bool(
            names
            & {
                endpoint.provider_name.lower(),
                endpoint.slug.lower(),
                endpoint.provider_slug.lower(),
            }
        )

    def _check_verified(
        self,
        endpoint: Endpoint,
        model_id: str,
        failures: list[tuple[DecisionCode, str]],
        notes: list[str],
    ) -> None:
        report = self.verified
        if report is None or report.model != model_id:
            return
        verdict = report.verdict(endpoint.slug)
        if verdict is None:
            notes.append(f"not verified (the report against {report.reference} does not list it)")
        elif verdict.passed is False:
            failures.append(
                (DecisionCode.VERIFICATION_FAILED, f"failed verification: {verdict.reason}")
            )
        elif verdict.passed is None:
            notes.append(f"verification could not tell: {verdict.reason}")
        else:
            notes.append(f"passed verification against {report.reference}")

    def _check_provider(self, endpoint: Endpoint, failures: list[tuple[DecisionCode, str]]) -> None:
        if self.exclude_providers and self._matches(endpoint, self.exclude_providers):
            failures.append(
                (DecisionCode.PROVIDER_EXCLUDED, f"provider {endpoint.slug!r} is excluded")
            )
        if self.only is not None and not self._matches(endpoint, self.only):
            failures.append(
                (
                    DecisionCode.PROVIDER_NOT_ALLOWED,
                    f"provider {endpoint.slug!r} is not among only={sorted(self.only)}",
                )
            )

    def _check_quantization(
        self,
        endpoint: Endpoint,
        model_id: str,
        failures: list[tuple[DecisionCode, str]],
        notes: list[str],
    ) -> Quantization | None:
        declared = endpoint.quantization
        effective: Quantization
        if declared is Quantization.UNRECOGNIZED:
            self._check_unrecognized(endpoint, failures, notes)
            return None
        if declared is not None and declared is not Quantization.UNKNOWN:
            effective, described = declared, declared.value
        else:
            said = _describe_undeclared(endpoint)
            if self.unknown == "reject":
                failures.append(
                    (DecisionCode.QUANTIZATION_UNKNOWN, f"quantization {said}; unknown='reject'")
                )
                return None
            if self.unknown == "accept":
                notes.append(f"quantization {said}; accepted (unknown='accept')")
                return None
            native, listed = self.native_precision.resolve(model_id)
            if native is None:
                text = (
                    f"quantization {said} and {model_id} is not in the native-precision "
                    "registry, which assumes nothing for unlisted models"
                )
                if self.exclude_below is None:
                    notes.append(text)
                else:
                    failures.append((DecisionCode.QUANTIZATION_UNKNOWN, text))
                return None
            effective = native
            described = (
                f"{said}: assumed {native.value}, the native precision of {model_id}"
                if listed
                else f"{said}: assumed {native.value}, the native-precision registry's "
                f"default, because it does not list {model_id}"
            )
        floor = self.exclude_below
        if floor is None:
            if effective is not declared:
                notes.append(f"quantization {described}")
            return effective
        separator = "; " if effective is not declared else " "
        if _rank(effective) < _rank(floor):
            failures.append(
                (
                    DecisionCode.QUANTIZATION_BELOW_MINIMUM,
                    f"quantization {described}{separator}is below the {floor.value} floor",
                )
            )
        else:
            notes.append(f"quantization {described}{separator}meets the {floor.value} floor")
        return effective

    def _check_unrecognized(
        self,
        endpoint: Endpoint,
        failures: list[tuple[DecisionCode, str]],
        notes: list[str],
    ) -> None:
        """A string OpenRouter does not list: judged by what it says, never by luck."""
        raw = endpoint.quantization_raw or ""
        floor = self.exclude_below
        scheme = read_scheme(raw)
        if scheme is None:
            said = (
                f"quantization {raw!r} is unrecognized (not OpenRouter's list, "
                "and it names no bit width)"
            )
            if floor is None:
                notes.append(f"{said}; no floor to judge it by")
            elif self.unrecognized == "accept":
                notes.append(f"{said}; accepted (unrecognized='accept')")
            else:
                failures.append(
                    (
                        DecisionCode.QUANTIZATION_UNRECOGNIZED,
                        f"{said}; rejected under the {floor.value} floor",
                    )
                )
            return
        described = f"quantization {raw!r} read as {scheme.describe()}"
        if floor is None:
            notes.append(described)
        elif scheme_tier(scheme) < _rank(floor):
            failures.append(
                (
                    DecisionCode.QUANTIZATION_BELOW_MINIMUM,
                    f"{described}; is below the {floor.value} floor",
                )
            )
        else:
            notes.append(f"{described}; meets the {floor.value} floor")

    def _check_health(
        self, endpoint: Endpoint, failures: list[tuple[DecisionCode, str]], notes: list[str]
    ) -> None:
        health = endpoint.health
        if health not in self.allowed_health:
            failures.append(
                (
                    DecisionCode.STATUS_NOT_ALLOWED,
                    f"status {endpoint.status} means {health.value}, not allowed",
                )
            )
        elif health is EndpointHealth.DEGRADED:
            notes.append(f"status {endpoint.status} means degraded")
        if self.min_uptime is None:
            return
        uptime = endpoint.uptime
        if uptime is None:
            notes.append("uptime not reported")
        elif uptime < self.min_uptime:
            failures.append(
                (
                    DecisionCode.UPTIME_BELOW_MINIMUM,
                    f"uptime {uptime:.2f}% is below the minimum {self.min_uptime:g}%",
                )
            )

    def _check_capabilities(
        self, endpoint: Endpoint, failures: list[tuple[DecisionCode, str]], notes: list[str]
    ) -> None:
        missing = sorted(self.required_parameters - set(endpoint.supported_parameters))
        if missing:
            failures.append(
                (DecisionCode.MISSING_PARAMETERS, f"does not support {', '.join(missing)}")
            )
        if self.tool_choice is not None:
            variant = self.tool_choice
            probe = {"type": "function"} if variant == "function" else variant
            supported = endpoint.supports_tool_choice_value(probe)
            if supported is None:
                notes.append(f"tool_choice {variant!r} support not reported")
            elif not supported:
                failures.append(
                    (
                        DecisionCode.TOOL_CHOICE_UNSUPPORTED,
                        f"tool_choice {variant!r} did not pass OpenRouter's testing here",
                    )
                )
        if not self._tier_allowed(endpoint.service_tier):
            tier = endpoint.service_tier or "standard"
            failures.append(
                (DecisionCode.SERVICE_TIER_NOT_ALLOWED, f"service tier {tier!r} is not allowed")
            )
        if (
            self.min_context_length is not None
            and endpoint.context_length is not None
            and endpoint.context_length < self.min_context_length
        ):
            failures.append(
                (
                    DecisionCode.CONTEXT_TOO_SHORT,
                    f"context length {endpoint.context_length} is below {self.min_context_length}",
                )
            )

    def _check_prices(self, endpoint: Endpoint, failures: list[tuple[DecisionCode, str]]) -> None:
        pricing = endpoint.pricing
        for code, limit, price, what in (
            (
                DecisionCode.PROMPT_PRICE_ABOVE_MAXIMUM,
                self.max_prompt_price,
                pricing.prompt,
                "prompt",
            ),
            (
                DecisionCode.COMPLETION_PRICE_ABOVE_MAXIMUM,
                self.max_completion_price,
                pricing.completion,
                "completion",
            ),
        ):
            if limit is None or price is None:
                continue
            per_million = price * PER_MILLION
            if per_million > limit:
                failures.append(
                    (
                        code,
                        f"{what} price ${per_million.normalize():f}/M is above the maximum "
                        f"${limit.normalize():f}/M",
                    )
                )
