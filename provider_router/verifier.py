"""Verify, don't trust the tag: measure each allowed endpoint against the model's reference.

:func:`verify` sends a small canary set to every endpoint the policy allows, each
pinned (its tag alone in ``only``, no fallbacks), and to a reference endpoint (the
model author's own by default: ``moonshotai`` for ``moonshotai/kimi-k2.5``), then
compares, per endpoint (docs/policy.md, "Measured fidelity"):

- **greedy agreement**: at ``temperature=0`` and a fixed ``seed``, the share of the
  first N tokens of each answer that match the reference's answer to the same prompt
  in order (whitespace-separated words, their longest common subsequence), relative to the
  reference's agreement with itself (every canary is sent to it twice);
- **tool calls** (where the endpoint lists ``tools``): valid JSON, a known function
  and arguments valid under its JSON schema, as vendor verifiers count them;
- **reasoning integrity**: no leftover think marker in the content;
- **accounting**: reported prompt tokens for the same prompt against the
  reference's (a different chat template shows here), and ``usage.cost`` against
  the listing's arithmetic for the reported tokens.

Every request goes through a :class:`~provider_router.Router`, so with a ``ledger``
each canary reserves its worst case there first and is booked at its real cost: the
verification is paid from the job's budget, like the preflight.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, Final

import jsonschema
from pydantic import SecretStr

from provider_router._exceptions import ConfigurationError, ProviderRouterError
from provider_router.catalog import Catalog
from provider_router.client import Router
from provider_router.ledger import Ledger
from provider_router.policy import ProviderPolicy
from provider_router.records import Endpoint, EndpointHealth, ModelEndpoints
from provider_router.results import ChatResult
from provider_router.verification import (
    EndpointVerdict,
    Estimate,
    VerificationReport,
    VerifyThresholds,
    mean_estimate,
    share_estimate,
)

__all__ = ["CANARY_PROMPTS", "CANARY_TOOL", "verify"]

CANARY_PROMPTS: Final = (
    "Explain in three sentences why the sky is blue.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Summarise the plot of Romeo and Juliet in one paragraph.",
    "List five prime numbers greater than 100 and say how you found them.",
    "Translate 'the weather is lovely today' into French, German and Spanish.",
    "What is the difference between a process and a thread?",
    "Give a short recipe for pancakes.",
    "Describe how a hash map handles collisions.",
    "Write a haiku about distributed systems.",
    "What causes the seasons on Earth?",
    "Explain what a Merkle tree is used for.",
    "Solve: a train leaves at 3 pm at 80 km/h; when has it covered 200 km?",
)
"""The built-in canaries (prompts from the user's own dataset come first)."""

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
_TOOL_PROMPTS: Final = (
    "What is the weather in Paris right now, in celsius?",
    "Is it warm in Tokyo today? Use fahrenheit.",
    "Check the weather in Nairobi for me (celsius).",
    "How cold is it in Oslo? Answer in celsius.",
)
THINK_MARKERS: Final = ("<think>", "</think>", "◁think▷", "◁/think▷", "<|think|>")
"""Reasoning delimiters that must never be left in an answer's content."""

DEFAULT_SAMPLES: Final = 8
DEFAULT_TOKENS: Final = 64
DEFAULT_TOOL_SAMPLES: Final = 12
DEFAULT_SEED: Final = 1234
DEFAULT_CONCURRENCY: Final = 16
COST_TOLERANCE: Final = Decimal("1e-10")
"""USD: a ``usage.cost`` within this of the listing's arithmetic matches (rounding)."""


@dataclass(slots=True)
class _Answers:
    """What one endpoint answered, canary by canary (None: the request failed)."""

    endpoint: Endpoint
    text: list[ChatResult | None] = field(default_factory=list)
    tools: list[ChatResult | None] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def cost(self) -> Decimal:
        total = Decimal(0)
        for result in (*self.text, *self.tools):
            if result is not None:
                total += _charged(result)
        return total


def _charged(result: ChatResult) -> Decimal:
    """What the answer cost (its worst case held when the cost is unknown)."""
    if result.cost is not None:
        return result.cost
    return result.reserved or Decimal(0)


def _pinned(endpoint: Endpoint, listing: ModelEndpoints) -> ProviderPolicy:
    """A policy that allows this endpoint alone, whatever the user's rules say of it."""
    siblings = [
        e.slug
        for e in listing.endpoints
        if e.provider_slug == endpoint.provider_slug and e.slug != endpoint.slug
    ]
    return ProviderPolicy(
        only=[endpoint.slug],
        exclude_providers=siblings,
        unknown="accept",
        unrecognized="accept",
        allowed_health=list(EndpointHealth),
    )


def _messages(prompt: str | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [dict(message) for message in prompt]


def _reference(listing: ModelEndpoints, name: str | None) -> Endpoint:
    author = listing.id.split("/", 1)[0].lower()
    wanted = (name or author).lower()
    for endpoint in listing.endpoints:
        if wanted in {endpoint.slug.lower(), endpoint.provider_name.lower()}:
            return endpoint
    for endpoint in listing.endpoints:
        if endpoint.provider_slug.lower() == wanted:
            return endpoint
    if name is None:
        raise ConfigurationError(
            f"{listing.id} has no endpoint of its author {author!r} to verify against: "
            "name a reference endpoint (reference=, --reference)"
        )
    tags = ", ".join(sorted(e.slug for e in listing.endpoints))
    raise ConfigurationError(f"no endpoint {name!r} of {listing.id} (its endpoints: {tags})")


def _words(result: ChatResult | None, tokens: int) -> list[str] | None:
    if result is None:
        return None
    return result.text.split()[:tokens]


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


def _agreements(
    answers: Sequence[ChatResult | None], reference: Sequence[ChatResult | None], tokens: int
) -> list[float]:
    values = []
    for mine, theirs in zip(answers, reference, strict=False):
        a, b = _words(mine, tokens), _words(theirs, tokens)
        if a is not None and b is not None:
            values.append(agreement(a, b))
    return values


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


def _judge(
    answers: _Answers,
    reference: _Answers,
    self_agreement: Estimate | None,
    thresholds: VerifyThresholds,
    tokens: int,
) -> EndpointVerdict:
    """The verdict on ``answers`` (the reference's own: its second pass as ``answers``)."""
    endpoint = answers.endpoint
    reasons: list[str] = []
    failed = False
    answered = [r for r in (*answers.text, *answers.tools) if r is not None]
    values = _agreements(answers.text, reference.text, tokens)
    agreement_estimate = mean_estimate(values, bounds=(0.0, 1.0)) if values else None
    if len(values) < thresholds.min_samples:
        reasons.append(
            f"could not tell: {len(values)} canaries compared, at least "
            f"{thresholds.min_samples} needed"
        )
    elif agreement_estimate is not None and self_agreement is not None:
        floor = thresholds.min_agreement_ratio * self_agreement.value
        if agreement_estimate.high < floor:
            failed = True
            reasons.append(
                f"greedy agreement {agreement_estimate} is below {floor:.3f} "
                f"({thresholds.min_agreement_ratio:g} × the reference's self-agreement "
                f"{self_agreement.value:.3f})"
            )
    calls = [call for result in answers.tools if result is not None for call in result.tool_calls]
    validity = None
    if calls:
        valid = sum(_tool_call_valid(call.name, call.arguments) for call in calls)
        validity = share_estimate(valid, len(calls))
        if validity.high < 1.0 - thresholds.max_tool_error_rate:
            failed = True
            reasons.append(
                f"{len(calls) - valid} of {len(calls)} tool calls broke the schema "
                f"(valid share {validity}; at most {thresholds.max_tool_error_rate:.0%} "
                "may fail)"
            )
    ratios = [
        mine.usage.prompt_tokens / theirs.usage.prompt_tokens
        for mine, theirs in zip(answers.text, reference.text, strict=False)
        if mine is not None
        and theirs is not None
        and mine.usage is not None
        and theirs.usage is not None
        and theirs.usage.prompt_tokens > 0
    ]
    ratio = mean_estimate(ratios, bounds=(0.0, 10.0)) if ratios else None
    skew = thresholds.max_prompt_token_skew
    if ratio is not None and (ratio.low > 1.0 + skew or ratio.high < 1.0 - skew):
        failed = True
        reasons.append(
            f"reports {ratio.value:.3f}× the reference's prompt tokens for the same "
            f"prompts ({ratio}; at most ±{skew:.0%}): a different chat template?"
        )
    leaks = sum(1 for r in answered if any(marker in r.text for marker in THINK_MARKERS))
    if leaks:
        failed = True
        reasons.append(f"{leaks} answer(s) hold a leftover think marker in their content")
    mismatches = sum(1 for r in answered if _cost_matches(endpoint, r) is False)
    if mismatches:
        failed = True
        reasons.append(
            f"{mismatches} answer(s) billed a usage.cost other than the listing's "
            "price arithmetic for their tokens"
        )
    if answers.errors:
        reasons.append(f"{len(answers.errors)} canaries failed: {answers.errors[0]}")
    passed: bool | None
    if failed:
        passed = False
    elif len(values) < thresholds.min_samples:
        passed = None
    else:
        passed = True
    return EndpointVerdict(
        tag=endpoint.slug,
        provider_name=endpoint.provider_name,
        passed=passed,
        reasons=tuple(reasons),
        agreement=agreement_estimate,
        tool_validity=validity,
        prompt_token_ratio=ratio,
        think_leaks=leaks,
        cost_mismatches=mismatches,
        answers=len(answered),
        failures=len(answers.errors),
        cost=answers.cost,
    )


async def _ask(
    router: Router,
    prompts: Sequence[list[dict[str, Any]]],
    gate: asyncio.Semaphore,
    answers: _Answers,
    params: Mapping[str, Any],
    tokens: int,
) -> list[ChatResult | None]:
    async def one(index: int, messages: list[dict[str, Any]]) -> ChatResult | None:
        async with gate:
            try:
                return await router.chat(
                    messages,
                    max_tokens=tokens,
                    key=f"verify:{answers.endpoint.slug}:{index}",
                    **params,
                )
            except ProviderRouterError as exc:
                answers.errors.append(f"{type(exc).__name__}: {exc}")
                return None

    return list(await asyncio.gather(*(one(i, m) for i, m in enumerate(prompts))))


async def verify(
    model: str,
    *,
    policy: ProviderPolicy | None = None,
    prompts: Sequence[str | Sequence[Mapping[str, Any]]] = (),
    reference: str | None = None,
    samples: int = DEFAULT_SAMPLES,
    tokens: int = DEFAULT_TOKENS,
    tool_samples: int = DEFAULT_TOOL_SAMPLES,
    thresholds: VerifyThresholds | None = None,
    ledger: Ledger | None = None,
    base_url: str | None = None,
    api_key: str | SecretStr | None = None,
    listing: ModelEndpoints | None = None,
    seed: int = DEFAULT_SEED,
    concurrency: int = DEFAULT_CONCURRENCY,
    clock: Callable[[], float] = time.time,
) -> VerificationReport:
    """Measure every endpoint ``policy`` allows against the reference.

    Args:
        model: the model id.
        policy: which endpoints to verify (default: every endpoint any policy allows).
        prompts: canaries from the user's own dataset (strings or message lists),
            taken first; the built-in :data:`CANARY_PROMPTS` fill up to ``samples``.
        reference: the reference endpoint (a tag or provider name); default the
            model author's own endpoint.
        samples: text canaries per endpoint; tokens: the first N tokens compared
            (and each canary's ``max_tokens``); tool_samples: tool-call canaries per
            endpoint that lists ``tools`` (0: none).
        thresholds: when an endpoint fails (:class:`VerifyThresholds`).
        ledger: the job's ledger: every canary is reserved and booked there.
        listing: judge this listing instead of asking OpenRouter for it.

    Raises:
        ConfigurationError: a bad argument, or no reference endpoint.
        ProviderRouterError: the listing could not be read.
    """
    if samples < 1 or tokens < 1 or tool_samples < 0 or concurrency < 1:
        raise ConfigurationError(
            "samples, tokens and concurrency must be ≥ 1 and tool_samples ≥ 0; got "
            f"samples={samples}, tokens={tokens}, tool_samples={tool_samples}, "
            f"concurrency={concurrency}"
        )
    thresholds = thresholds or VerifyThresholds()
    policy = policy or ProviderPolicy()
    if listing is None:
        async with Catalog(base_url=base_url, api_key=api_key) as catalog:
            listing = await catalog.endpoints(model)
    ref_endpoint = _reference(listing, reference)
    chosen = [d.endpoint for d in policy.evaluate(listing) if d.allowed]
    if ref_endpoint.slug not in {e.slug for e in chosen}:
        chosen.append(ref_endpoint)
    canaries = [_messages(p) for p in list(prompts)[:samples]]
    canaries += [_messages(p) for p in CANARY_PROMPTS[: max(0, samples - len(canaries))]]
    tool_canaries = [_messages(p) for p in (_TOOL_PROMPTS * tool_samples)[:tool_samples]]
    gate = asyncio.Semaphore(concurrency)
    greedy = {"temperature": 0, "seed": seed}

    async def measure(endpoint: Endpoint, repeat: bool) -> tuple[_Answers, _Answers | None]:
        answers = _Answers(endpoint)
        again = _Answers(endpoint) if repeat else None
        async with Router(
            model,
            policy=_pinned(endpoint, listing),
            ledger=ledger,
            base_url=base_url,
            api_key=api_key,
            endpoints=listing,
            allow_fallbacks=False,
        ) as router:
            jobs = [_ask(router, canaries, gate, answers, greedy, tokens)]
            if again is not None:
                jobs.append(_ask(router, canaries, gate, again, greedy, tokens))
            if tool_canaries and "tools" in endpoint.supported_parameters:
                choice = "required" if _supports_required(endpoint) else "auto"
                tool_params = {**greedy, "tools": [CANARY_TOOL], "tool_choice": choice}
                jobs.append(_ask(router, tool_canaries, gate, answers, tool_params, tokens))
            results = await asyncio.gather(*jobs)
        answers.text = results[0]
        if again is not None:
            again.text = results[1]
        if len(results) > (2 if again is not None else 1):
            answers.tools = results[-1]
        return answers, again

    measured = await asyncio.gather(*(measure(e, e.slug == ref_endpoint.slug) for e in chosen))
    by_tag = {answers.endpoint.slug: (answers, again) for answers, again in measured}
    ref_answers, ref_again = by_tag[ref_endpoint.slug]
    self_values = _agreements(ref_again.text if ref_again else [], ref_answers.text, tokens)
    self_agreement = mean_estimate(self_values, bounds=(0.0, 1.0)) if self_values else None
    verdicts = []
    total = Decimal(0)
    for answers, again in measured:
        if again is None:
            verdict = _judge(answers, ref_answers, self_agreement, thresholds, tokens)
        else:  # the reference's second pass against its first, with the first's tool calls
            second = _Answers(
                answers.endpoint, again.text, answers.tools, [*answers.errors, *again.errors]
            )
            verdict = _judge(second, answers, self_agreement, thresholds, tokens)
            verdict = replace(verdict, cost=answers.cost + again.cost)
        total += verdict.cost
        verdicts.append(verdict)
    return VerificationReport(
        model=listing.id,
        reference=ref_endpoint.slug,
        self_agreement=self_agreement,
        endpoints=tuple(sorted(verdicts, key=lambda v: v.tag)),
        thresholds=thresholds,
        tokens=tokens,
        cost=total,
        created=clock(),
    )


def _supports_required(endpoint: Endpoint) -> bool:
    support = endpoint.supports_tool_choice
    return support is None or support.required is not False
