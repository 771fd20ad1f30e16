"""What a verification measured: per-endpoint estimates, verdicts and the saved report.

Pure values, no I/O: :func:`provider_router.checks.verify` fills them in,
:class:`~provider_router.ProviderPolicy` (``verified=report``) reads them. The
statistics are deliberately plain (docs/policy.md, "Measured fidelity"): a mean of
per-prompt values gets a Student-t 95 % interval over the prompts (the tokens of one
answer are not independent), a share of independent events a Wilson 95 % score
interval. An endpoint fails a rule only when the whole interval is on the wrong side
of the threshold: a small sample that cannot tell is "could not tell", never a failure.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

from provider_router import _shape
from provider_router._exceptions import ConfigurationError
from provider_router._format import decimal_str

__all__ = [
    "Estimate",
    "EndpointVerdict",
    "VerifyThresholds",
    "VerificationReport",
    "mean_estimate",
    "share_estimate",
]

REPORT_VERSION: Final = 1

_T95: Final = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    12: 2.179,
    15: 2.131,
    20: 2.086,
    30: 2.042,
    60: 2.000,
}
"""Two-sided 95 % quantiles of Student's t by degrees of freedom (a smaller listed df
is used between entries: a wider, safer interval); 1.96 beyond 60."""
_Z95: Final = 1.959964


def _t95(df: int) -> float:
    listed = [d for d in _T95 if d <= df]
    return _Z95 if df > 60 else _T95[max(listed)]


@dataclass(frozen=True, slots=True)
class Estimate:
    """A measured value with its 95 % interval over ``n`` observations."""

    value: float
    low: float
    high: float
    n: int

    def __str__(self) -> str:
        return f"{self.value:.3f} (95% CI {self.low:.3f}–{self.high:.3f}, n={self.n})"


def mean_estimate(
    values: Sequence[float], *, bounds: tuple[float, float] | None = None
) -> Estimate:
    """The mean of ``values`` with a Student-t 95 % interval (clipped to ``bounds``)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values to estimate from")
    mean = math.fsum(values) / n
    if n == 1:
        low, high = -math.inf, math.inf
    else:
        var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
        half = _t95(n - 1) * math.sqrt(var / n)
        low, high = mean - half, mean + half
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return Estimate(mean, low, high, n)


def share_estimate(successes: int, n: int) -> Estimate:
    """``successes / n`` with a Wilson 95 % score interval."""
    if n <= 0:
        raise ValueError("no events to estimate a share from")
    p = successes / n
    z2 = _Z95 * _Z95
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = _Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return Estimate(p, max(0.0, centre - half), min(1.0, centre + half), n)


@dataclass(frozen=True, slots=True)
class VerifyThresholds:
    """When an endpoint fails verification.

    Attributes:
        min_agreement_ratio: greedy agreement with the reference below this share of
            the reference's agreement with itself (the whole interval below) fails.
        max_tool_error_rate: tool calls whose arguments break the schema above this
            share (the whole interval above) fails.
        max_prompt_token_skew: reported prompt tokens for the same prompt more than
            this share away from the reference's (the whole interval away) fails: a
            different chat template shows here.
        min_samples: fewer answered canaries than this: could not tell.
        max_divergence_excess: a top-k divergence (total variation, 0..1) more than
            this above the reference's divergence from itself (the whole interval
            above) fails.
        max_prompt_token_difference: where the model's vendor requires the reference's
            prompt token count (Kimi), a canary counted more than this many tokens
            away from it fails (0: exactly equal).
    """

    min_agreement_ratio: float = 0.9
    max_tool_error_rate: float = 0.05
    max_prompt_token_skew: float = 0.02
    min_samples: int = 3
    max_divergence_excess: float = 0.05
    max_prompt_token_difference: int = 0

    def __post_init__(self) -> None:
        for name in (
            "min_agreement_ratio",
            "max_tool_error_rate",
            "max_prompt_token_skew",
            "max_divergence_excess",
        ):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigurationError(f"{name} must be within 0..1, got {value!r}")
        if self.min_samples < 1:
            raise ConfigurationError(f"min_samples must be ≥ 1, got {self.min_samples}")
        difference = self.max_prompt_token_difference
        if isinstance(difference, bool) or not isinstance(difference, int) or difference < 0:
            raise ConfigurationError(
                f"max_prompt_token_difference must be an integer ≥ 0, got {difference!r}"
            )


@dataclass(frozen=True, slots=True)
class EndpointVerdict:
    """One endpoint measured against the reference.

    Attributes:
        tag: the endpoint's routing slug (``chutes``, ``deepinfra/fp4``).
        provider_name: its display name.
        passed: True passed every rule that could be judged, False failed one,
            None could not tell (too few answers).
        reasons: every failed rule (or why it could not tell), in sentences.
        agreement: greedy agreement with the reference's answers to the same prompts.
        tool_validity: share of its tool calls with valid JSON, a known function and
            schema-valid arguments (None: no tools, or no calls made).
        prompt_token_ratio: its reported prompt tokens over the reference's.
        think_leaks: answers whose content holds a leftover think marker.
        cost_mismatches: answers whose ``usage.cost`` is not the listing's arithmetic.
        answers: canaries it answered; failures: canaries that failed.
        cost: USD its canaries cost.
        divergence: the top-k divergence of its next-token distributions from the
            reference's on the same prefixes (None: not measured, ``unmeasured``
            says why).
        unmeasured: each measure that could not be taken, and why ("not measured",
            never a pass or a fail).
        accepted: canaries whose answer passed every rule one answer is held to
            (:attr:`pass_rate`); judged: canaries it could be judged on (answered,
            and for text the reference answered too).
        params_accepted: the requests its model's vendor requires refused that it
            served instead (``temperature 1.1 in thinking mode``): it does not hold the
            vendor's fixed parameters.
        prompt_tokens_unequal: canaries whose ``usage.prompt_tokens`` differed from the
            reference's where the vendor requires them equal.
    """

    tag: str
    provider_name: str
    passed: bool | None
    reasons: tuple[str, ...] = ()
    agreement: Estimate | None = None
    tool_validity: Estimate | None = None
    prompt_token_ratio: Estimate | None = None
    think_leaks: int = 0
    cost_mismatches: int = 0
    answers: int = 0
    failures: int = 0
    cost: Decimal = Decimal(0)
    divergence: Estimate | None = None
    unmeasured: tuple[str, ...] = ()
    accepted: int = 0
    judged: int = 0
    params_accepted: tuple[str, ...] = ()
    prompt_tokens_unequal: int = 0

    @property
    def reason(self) -> str:
        """The reasons in one sentence (what a policy decision quotes)."""
        return "; ".join(self.reasons) or "passed verification"

    @property
    def pass_rate(self) -> Estimate | None:
        """The share of its canary samples that passed every check one answer is held
        to, with a Wilson interval (None: none could be judged). The ranking's cost per
        accepted sample divides by it, exactly: ``judged / accepted``."""
        return share_estimate(self.accepted, self.judged) if self.judged else None


@dataclass(frozen=True, slots=True)
class VerificationReport:
    """Every verified endpoint of one model, against one reference.

    Attributes:
        model: the model id.
        reference: the reference endpoint's tag.
        self_agreement: the reference's greedy agreement with itself (each canary
            sent to it twice): the ceiling the thresholds are relative to.
        endpoints: a verdict per endpoint, the reference's included.
        thresholds: the rules applied.
        tokens: the first N tokens (whitespace-separated words) compared.
        cost: USD the whole verification cost (booked on the ledger given).
        created: Unix seconds when it finished.
        self_divergence: the reference's top-k divergence from itself (None: not
            measured): what ``max_divergence_excess`` is added to.
        top_logprobs: alternatives per token asked for (None: logprobs not asked for).
        vendor_rules: whose rules the endpoints were also held to (Kimi's fixed
            parameters and prompt token counts), None when none apply.
    """

    model: str
    reference: str
    self_agreement: Estimate | None
    endpoints: tuple[EndpointVerdict, ...]
    thresholds: VerifyThresholds = field(default_factory=VerifyThresholds)
    tokens: int = 64
    cost: Decimal = Decimal(0)
    created: float = 0.0
    self_divergence: Estimate | None = None
    top_logprobs: int | None = None
    vendor_rules: str | None = None

    @property
    def failed(self) -> tuple[str, ...]:
        """Tags of the endpoints that failed."""
        return tuple(v.tag for v in self.endpoints if v.passed is False)

    @property
    def passed(self) -> tuple[str, ...]:
        """Tags of the endpoints that passed."""
        return tuple(v.tag for v in self.endpoints if v.passed is True)

    def verdict(self, tag: str) -> EndpointVerdict | None:
        """The verdict on the endpoint with this tag (None: not verified)."""
        for v in self.endpoints:
            if v.tag == tag:
                return v
        return None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (money as exact strings)."""
        data = asdict(self)
        data["version"] = REPORT_VERSION
        data["cost"] = decimal_str(self.cost)
        for entry, verdict in zip(data["endpoints"], self.endpoints, strict=True):
            entry["cost"] = decimal_str(verdict.cost)
            entry["reasons"] = list(verdict.reasons)
            entry["unmeasured"] = list(verdict.unmeasured)
            entry["params_accepted"] = list(verdict.params_accepted)
            rate = verdict.pass_rate
            entry["pass_rate"] = None if rate is None else asdict(rate)
        return data

    def save(self, path: str | Path) -> None:
        """Write the report as JSON (``provider-router verify --report`` does)."""
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, where: str = "report") -> VerificationReport:
        """Read :meth:`to_json`'s dict back.

        Raises:
            ConfigurationError: not a verification report (naming ``where``).
        """
        try:
            if data.get("version") != REPORT_VERSION:
                raise ValueError(f"version {data.get('version')!r}, expected {REPORT_VERSION}")
            endpoints = _shape.items(_shape.member(data, "endpoints"), "endpoints")
            thresholds = _shape.obj(data.get("thresholds", {}), "thresholds")
            return cls(
                model=_shape.text(_shape.member(data, "model"), "model"),
                reference=_shape.text(_shape.member(data, "reference"), "reference"),
                self_agreement=_estimate(data.get("self_agreement"), "self_agreement"),
                endpoints=tuple(
                    _verdict(_shape.obj(v, f"endpoints[{i}]"), f"endpoints[{i}]")
                    for i, v in enumerate(endpoints)
                ),
                thresholds=VerifyThresholds(**thresholds),
                tokens=int(data.get("tokens", 64)),
                cost=Decimal(str(data.get("cost", "0"))),
                created=float(data.get("created", 0.0)),
                self_divergence=_estimate(data.get("self_divergence"), "self_divergence"),
                top_logprobs=_optional_int(data.get("top_logprobs")),
                vendor_rules=_optional_str(data.get("vendor_rules")),
            )
        except (AttributeError, KeyError, TypeError, ValueError, ArithmeticError) as exc:
            # A ShapeError names the field; the rest say what was wrong with a value.
            raise ConfigurationError(f"{where} is not a verification report: {exc}") from None

    @classmethod
    def load(cls, path: str | Path) -> VerificationReport:
        """Read a report :meth:`save` wrote.

        Raises:
            ConfigurationError: the file cannot be read or is not a report.
        """
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"cannot read verification report {path}: {exc}") from None
        if not isinstance(data, Mapping):
            raise ConfigurationError(f"{path} is not a verification report: not an object")
        return cls.from_json(data, where=str(path))


def _estimate(raw: object, where: str) -> Estimate | None:
    if raw is None:
        return None
    found = _shape.obj(raw, where)
    return Estimate(
        float(_shape.member(found, "value", where)),
        float(_shape.member(found, "low", where)),
        float(_shape.member(found, "high", where)),
        int(_shape.member(found, "n", where)),
    )


def _optional_int(raw: object) -> int | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise TypeError(f"expected an integer or null, got {raw!r}")
    return raw


def _optional_str(raw: object) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise TypeError(f"expected a string or null, got {raw!r}")
    return raw


def _count(raw: Mapping[str, Any], name: str) -> int:
    value = raw.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"{name} must be an integer ≥ 0, got {value!r}")
    return value


def _verdict(raw: Mapping[str, Any], where: str) -> EndpointVerdict:
    passed = raw.get("passed")
    if passed is not None and not isinstance(passed, bool):
        raise TypeError(f"{where}.passed must be true, false or null, got {passed!r}")
    tag = _shape.text(_shape.member(raw, "tag", where), f"{where}.tag")
    accepted, judged = _count(raw, "accepted"), _count(raw, "judged")
    if accepted > judged:
        raise ValueError(f"{tag}: accepted {accepted} of only {judged} judged canaries")
    return EndpointVerdict(
        tag=tag,
        provider_name=_shape.text(
            _shape.member(raw, "provider_name", where), f"{where}.provider_name"
        ),
        passed=passed,
        reasons=tuple(str(r) for r in _shape.items(raw.get("reasons", []), f"{where}.reasons")),
        agreement=_estimate(raw.get("agreement"), f"{where}.agreement"),
        tool_validity=_estimate(raw.get("tool_validity"), f"{where}.tool_validity"),
        prompt_token_ratio=_estimate(raw.get("prompt_token_ratio"), f"{where}.prompt_token_ratio"),
        think_leaks=int(raw.get("think_leaks", 0)),
        cost_mismatches=int(raw.get("cost_mismatches", 0)),
        answers=int(raw.get("answers", 0)),
        failures=int(raw.get("failures", 0)),
        cost=Decimal(str(raw.get("cost", "0"))),
        divergence=_estimate(raw.get("divergence"), f"{where}.divergence"),
        unmeasured=tuple(
            str(u) for u in _shape.items(raw.get("unmeasured", []), f"{where}.unmeasured")
        ),
        accepted=accepted,
        judged=judged,
        params_accepted=tuple(str(p) for p in raw.get("params_accepted", ())),
        prompt_tokens_unequal=_count(raw, "prompt_tokens_unequal"),
    )
