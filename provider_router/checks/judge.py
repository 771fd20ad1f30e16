"""Judging one endpoint's canary answers against the reference's: the verifier's comparisons.

:func:`judge` turns what an endpoint answered (:class:`Answers`) into an
:class:`~provider_router.EndpointVerdict`: each measure with its interval, a verdict
against the :class:`~provider_router.VerifyThresholds`, what could not be measured,
and the canaries it passed whole (the pass rate the ranking prices). docs/policy.md,
"Measured fidelity", explains each rule; :mod:`provider_router.checks.verify` sends the
canaries.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

import jsonschema

from provider_router.catalog.records import Endpoint
from provider_router.catalog.verdicts import (
    EndpointVerdict,
    Estimate,
    VerifyThresholds,
    mean_estimate,
    share_estimate,
)
from provider_router.checks.vendor_rules import VendorRules
from provider_router.client.results import ChatResult, TokenLogprob

__all__ = [
    "Answers",
    "Baseline",
    "CANARY_TOOL",
    "THINK_MARKERS",
    "agreement",
    "aligned_positions",
    "canary_divergence",
    "judge",
    "self_baseline",
    "top_k_distance",
]


def _listed(entry: TokenLogprob) -> dict[str, float]:
    """The position's listed tokens with their probabilities (the chosen one alone
    without alternatives: ``top_logprobs`` 0)."""
    pairs = entry.top or ((entry.token, entry.logprob),)
    return {token: math.exp(logprob) for token, logprob in pairs}


def _one_sided(mine: dict[str, float], theirs: dict[str, float]) -> float:
    """A lower bound of ``P(E) - Q(E)`` for E = the tokens ``mine`` gives more: the
    shared ones it gives more, and the ones only it lists. ``theirs`` is a top list, so
    a token it does not list has at most its smallest listed probability, and all of
    them together at most its remainder."""
    shared = [t for t in mine if t in theirs and mine[t] > theirs[t]]
    only = [t for t in mine if t not in theirs]
    floor = min(theirs.values())
    rest = max(0.0, 1.0 - math.fsum(theirs.values()))
    bound = math.fsum(mine[t] - theirs[t] for t in shared)
    return bound + math.fsum(mine[t] for t in only) - min(len(only) * floor, rest)


def top_k_distance(a: TokenLogprob, b: TokenLogprob) -> float:
    """A lower bound of the total variation distance of two positions' next-token
    distributions, from their top-k lists (module doc)."""
    mine, theirs = _listed(a), _listed(b)
    shared = mine.keys() & theirs.keys()
    gap = math.fsum(abs(mine[t] - theirs[t]) for t in shared)
    rest_mine = max(0.0, 1.0 - math.fsum(mine[t] for t in shared))
    rest_theirs = max(0.0, 1.0 - math.fsum(theirs[t] for t in shared))
    coarse = 0.5 * (gap + abs(rest_mine - rest_theirs))
    return min(1.0, max(coarse, _one_sided(mine, theirs), _one_sided(theirs, mine)))


def aligned_positions(
    answer: Sequence[TokenLogprob], reference: Sequence[TokenLogprob], tokens: int
) -> int:
    """How many leading positions share their prefix: up to and including the first
    whose chosen tokens differ, within the first ``tokens``."""
    limit = min(len(answer), len(reference), tokens)
    for position in range(limit):
        if answer[position].token != reference[position].token:
            return position + 1
    return limit


def canary_divergence(
    answer: Sequence[TokenLogprob], reference: Sequence[TokenLogprob], tokens: int
) -> float | None:
    """The mean :func:`top_k_distance` over the aligned positions of one canary's two
    answers (None: nothing to compare, an empty answer)."""
    count = aligned_positions(answer, reference, tokens)
    if count == 0:
        return None
    return math.fsum(top_k_distance(answer[i], reference[i]) for i in range(count)) / count


CANARY_TOOL: Final[Mapping[str, Any]] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city's name."},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
THINK_MARKERS: Final = ("<think>", "</think>", "◁think▷", "◁/think▷", "<|think|>")
"""Reasoning delimiters that must never be left in an answer's content."""
COST_TOLERANCE: Final = Decimal("1e-10")
"""USD: a ``usage.cost`` within this of the listing's arithmetic matches (rounding)."""
DIVERGENCE: Final = "top-k divergence"


@dataclass(slots=True)
class Answers:
    """What one endpoint answered, canary by canary (None: the request failed).

    ``logprobs_note`` says why its top-k distributions are not compared (None: they
    were asked for, from it and from the reference). ``probes`` are the vendor's
    must-refuse requests (:mod:`~provider_router.checks.vendor_rules`): each label with
    the answer it got (served: a violation), None (refused, as it must be), or a note
    saying why it could not tell."""

    endpoint: Endpoint
    text: list[ChatResult | None] = field(default_factory=list)
    tools: list[ChatResult | None] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    logprobs_note: str | None = None
    probes: dict[str, ChatResult | str | None] = field(default_factory=dict)

    @property
    def cost(self) -> Decimal:
        total = Decimal(0)
        served = [p for p in self.probes.values() if isinstance(p, ChatResult)]
        for result in (*self.text, *self.tools, *served):
            if result is not None:
                total += _charged(result)
        return total


@dataclass(frozen=True, slots=True)
class Baseline:
    """The reference measured against itself (each canary sent to it twice): the
    ceilings the agreement and divergence rules are relative to."""

    agreement: Estimate | None = None
    divergence: Estimate | None = None


def _charged(result: ChatResult) -> Decimal:
    """What the answer cost (its worst case held when the cost is unknown)."""
    if result.cost is not None:
        return result.cost
    return result.reserved or Decimal(0)


def agreement(answer: Sequence[str], reference: Sequence[str]) -> float:
    """The share of the compared tokens that match the reference's, in order: their
    longest common subsequence over the longer of the two (an answer that stops early
    has diverged). Exact dynamic programming, O(N²) for N compared tokens: difflib's
    heuristic blocks under-count on text that repeats its words."""
    longest = max(len(answer), len(reference))
    if longest == 0:
        return 1.0
    previous = [0] * (len(reference) + 1)
    for token in answer:
        current = [0]
        for j, other in enumerate(reference):
            current.append(previous[j] + 1 if token == other else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1] / longest


def _tool_call_valid(name: str, arguments: str) -> bool:
    function = CANARY_TOOL["function"]
    if name != function["name"]:
        return False
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return False
    try:
        jsonschema.validate(parsed, function["parameters"])
    except jsonschema.ValidationError:
        return False
    return True


def _cost_matches(endpoint: Endpoint, result: ChatResult) -> bool | None:
    usage = result.usage
    if usage is None or usage.cost is None:
        return None
    try:
        expected = endpoint.pricing.cost(
            usage.prompt_tokens,
            usage.completion_tokens,
            cached_tokens=usage.cached_tokens,
            cache_write_tokens=usage.cache_write_tokens,
        )
    except ValueError:
        return None
    return abs(usage.cost - expected) <= COST_TOLERANCE


def _leaks(result: ChatResult) -> bool:
    return any(marker in result.text for marker in THINK_MARKERS)


@dataclass(slots=True)
class _TextCanary:
    """One text canary answered by the endpoint and by the reference."""

    agreement: float
    divergence: float | None
    prompt_ratio: float | None
    clean: bool
    """No think marker, and billed as listed (or not said)."""
    prompt_difference: int | None = None
    """Its ``usage.prompt_tokens`` less the reference's (None: one did not say)."""


def _text_canaries(
    answers: Answers, reference: Answers, tokens: int
) -> tuple[list[_TextCanary], int]:
    """The text canaries both answered, and how many carried logprobs on one side only
    or on neither (when they were asked for)."""
    out = []
    missing = 0
    for mine, theirs in zip(answers.text, reference.text, strict=False):
        if mine is None or theirs is None:
            continue
        divergence = None
        if mine.logprobs and theirs.logprobs:
            divergence = canary_divergence(mine.logprobs, theirs.logprobs, tokens)
        elif answers.logprobs_note is None:
            missing += 1
        ratio = difference = None
        if mine.usage is not None and theirs.usage is not None:
            difference = mine.usage.prompt_tokens - theirs.usage.prompt_tokens
            if theirs.usage.prompt_tokens > 0:
                ratio = mine.usage.prompt_tokens / theirs.usage.prompt_tokens
        words = agreement(mine.text.split()[:tokens], theirs.text.split()[:tokens])
        clean = not _leaks(mine) and _cost_matches(answers.endpoint, mine) is not False
        out.append(_TextCanary(words, divergence, ratio, clean, difference))
    return out, missing


def self_baseline(first: Answers, second: Answers, tokens: int) -> Baseline:
    """The reference's second pass over the canaries measured against its first."""
    canaries, _ = _text_canaries(second, first, tokens)
    values = [c.agreement for c in canaries]
    divergences = [c.divergence for c in canaries if c.divergence is not None]
    return Baseline(
        mean_estimate(values, bounds=(0.0, 1.0)) if values else None,
        mean_estimate(divergences, bounds=(0.0, 1.0)) if divergences else None,
    )


@dataclass(slots=True)
class _Rules:
    """The verdict being built: the failed rules, the unmeasured ones, the notes."""

    thresholds: VerifyThresholds
    baseline: Baseline
    vendor: VendorRules | None = None
    reasons: list[str] = field(default_factory=list)
    unmeasured: list[str] = field(default_factory=list)
    failed: bool = False

    def fail(self, reason: str) -> None:
        self.failed = True
        self.reasons.append(reason)

    @property
    def agreement_floor(self) -> float | None:
        own = self.baseline.agreement
        return None if own is None else self.thresholds.min_agreement_ratio * own.value

    @property
    def divergence_ceiling(self) -> float | None:
        own = self.baseline.divergence
        return None if own is None else own.value + self.thresholds.max_divergence_excess

    def accepts(self, canary: _TextCanary) -> bool:
        """Whether this one canary passed every rule a single answer can be held to."""
        floor, ceiling = self.agreement_floor, self.divergence_ceiling
        skew = self.thresholds.max_prompt_token_skew
        return (
            canary.clean
            and (floor is None or canary.agreement >= floor)
            and (ceiling is None or canary.divergence is None or canary.divergence <= ceiling)
            and (canary.prompt_ratio is None or abs(canary.prompt_ratio - 1.0) <= skew)
            and not self.unequal_prompt(canary)
        )

    def unequal_prompt(self, canary: _TextCanary) -> bool:
        """Whether the vendor's rules demand the reference's prompt count and it is off."""
        if self.vendor is None or not self.vendor.equal_prompt_tokens:
            return False
        allowed = self.thresholds.max_prompt_token_difference
        return canary.prompt_difference is not None and abs(canary.prompt_difference) > allowed


def _judge_agreement(rules: _Rules, values: list[float]) -> Estimate | None:
    estimate = mean_estimate(values, bounds=(0.0, 1.0)) if values else None
    floor = rules.agreement_floor
    if estimate is not None and floor is not None and len(values) >= rules.thresholds.min_samples:
        own = rules.baseline.agreement
        assert own is not None  # a floor comes from it
        if estimate.high < floor:
            rules.fail(
                f"greedy agreement {estimate} is below {floor:.3f} "
                f"({rules.thresholds.min_agreement_ratio:g} × the reference's self-agreement "
                f"{own.value:.3f})"
            )
    return estimate


def _judge_divergence(
    rules: _Rules, answers: Answers, values: list[float], missing: int
) -> Estimate | None:
    if answers.logprobs_note is not None:
        rules.unmeasured.append(f"{DIVERGENCE}: {answers.logprobs_note}")
        return None
    needed = rules.thresholds.min_samples
    if len(values) < needed:
        rules.unmeasured.append(
            f"{DIVERGENCE}: not measured: {len(values)} canaries came back with logprobs "
            f"from both sides ({missing} without), at least {needed} needed"
        )
        return None
    estimate = mean_estimate(values, bounds=(0.0, 1.0))
    ceiling = rules.divergence_ceiling
    if ceiling is None:
        rules.unmeasured.append(
            f"{DIVERGENCE}: not judged: the reference gave no logprobs to compare with its own"
        )
    elif estimate.low > ceiling:
        own = rules.baseline.divergence
        assert own is not None  # a ceiling comes from it
        rules.fail(
            f"top-k divergence {estimate} is above {ceiling:.3f} (the reference's own "
            f"{own.value:.3f} + {rules.thresholds.max_divergence_excess:g})"
        )
    return estimate


def _judge_vendor(rules: _Rules, answers: Answers, canaries: list[_TextCanary]) -> tuple[str, ...]:
    """The vendor's rules (fixed parameters, equal prompt counts); what it served of the
    requests it had to refuse."""
    vendor = rules.vendor
    if vendor is None:
        return ()
    served = tuple(label for label, got in answers.probes.items() if isinstance(got, ChatResult))
    for label, got in answers.probes.items():
        if isinstance(got, str):
            rules.unmeasured.append(f"params: could not tell whether it refuses {label}: {got}")
    if served:
        rules.fail(
            f"serves {' and '.join(served)}, which {vendor.name} requires refused "
            "(the model's sampling parameters are fixed)"
        )
    unequal = [c for c in canaries if rules.unequal_prompt(c)]
    if unequal:
        worst = max(abs(c.prompt_difference or 0) for c in unequal)
        compared = sum(c.prompt_difference is not None for c in canaries)
        rules.fail(
            f"usage.prompt_tokens differs from the reference's on {len(unequal)} of "
            f"{compared} canaries (by up to {worst}); {vendor.name} requires them equal: "
            "another chat template, or an inflated bill"
        )
    return served


def judge(
    answers: Answers,
    reference: Answers,
    baseline: Baseline,
    thresholds: VerifyThresholds,
    tokens: int,
    vendor: VendorRules | None = None,
) -> EndpointVerdict:
    """The verdict on ``answers`` (the reference's own: its second pass as ``answers``),
    held to ``vendor``'s rules too when given."""
    endpoint = answers.endpoint
    rules = _Rules(thresholds, baseline, vendor)
    answered = [r for r in (*answers.text, *answers.tools) if r is not None]
    canaries, missing = _text_canaries(answers, reference, tokens)
    if len(canaries) < thresholds.min_samples:
        rules.reasons.append(
            f"could not tell: {len(canaries)} canaries compared, at least "
            f"{thresholds.min_samples} needed"
        )
    agreement_estimate = _judge_agreement(rules, [c.agreement for c in canaries])
    divergence = _judge_divergence(
        rules, answers, [c.divergence for c in canaries if c.divergence is not None], missing
    )
    calls = [call for result in answers.tools if result is not None for call in result.tool_calls]
    validity = None
    if calls:
        valid = sum(_tool_call_valid(call.name, call.arguments) for call in calls)
        validity = share_estimate(valid, len(calls))
        if validity.high < 1.0 - thresholds.max_tool_error_rate:
            rules.fail(
                f"{len(calls) - valid} of {len(calls)} tool calls broke the schema "
                f"(valid share {validity}; at most {thresholds.max_tool_error_rate:.0%} "
                "may fail)"
            )
    ratios = [c.prompt_ratio for c in canaries if c.prompt_ratio is not None]
    ratio = mean_estimate(ratios, bounds=(0.0, 10.0)) if ratios else None
    skew = thresholds.max_prompt_token_skew
    if ratio is not None and (ratio.low > 1.0 + skew or ratio.high < 1.0 - skew):
        rules.fail(
            f"reports {ratio.value:.3f}× the reference's prompt tokens for the same "
            f"prompts ({ratio}; at most ±{skew:.0%}): a different chat template?"
        )
    leaks = sum(1 for r in answered if _leaks(r))
    if leaks:
        rules.fail(f"{leaks} answer(s) hold a leftover think marker in their content")
    mismatches = sum(1 for r in answered if _cost_matches(endpoint, r) is False)
    if mismatches:
        rules.fail(
            f"{mismatches} answer(s) billed a usage.cost other than the listing's "
            "price arithmetic for their tokens"
        )
    served_probes = _judge_vendor(rules, answers, canaries)
    if answers.errors:
        rules.reasons.append(f"{len(answers.errors)} canaries failed: {answers.errors[0]}")
    tool_answers = [r for r in answers.tools if r is not None]
    accepted = sum(rules.accepts(c) for c in canaries) + sum(
        bool(r.tool_calls)
        and all(_tool_call_valid(c.name, c.arguments) for c in r.tool_calls)
        and not _leaks(r)
        and _cost_matches(endpoint, r) is not False
        for r in tool_answers
    )
    passed: bool | None
    if rules.failed:
        passed = False
    elif len(canaries) < thresholds.min_samples:
        passed = None
    else:
        passed = True
    return EndpointVerdict(
        tag=endpoint.slug,
        provider_name=endpoint.provider_name,
        passed=passed,
        reasons=tuple(rules.reasons),
        agreement=agreement_estimate,
        tool_validity=validity,
        prompt_token_ratio=ratio,
        think_leaks=leaks,
        cost_mismatches=mismatches,
        answers=len(answered),
        failures=len(answers.errors),
        cost=answers.cost,
        divergence=divergence,
        unmeasured=tuple(rules.unmeasured),
        accepted=accepted,
        judged=len(canaries) + len(tool_answers),
        params_accepted=served_probes,
        prompt_tokens_unequal=sum(rules.unequal_prompt(c) for c in canaries),
    )
