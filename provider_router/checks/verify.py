"""Verify, don't trust the tag: measure each allowed endpoint against the model's reference.

:func:`verify` sends a small canary set to every endpoint the policy allows, each
pinned alone, and to a reference endpoint (the model author's own by default), then
compares per endpoint: greedy agreement with the reference (relative to the
reference's agreement with itself), tool calls valid under their schema, leftover
think markers, accounting (prompt tokens against the reference's, ``usage.cost``
against the listing's arithmetic), and the model vendor's own rules where they apply
(:mod:`.vendor_rules`); docs/policy.md, "Measured fidelity". Every request
goes through a :class:`~provider_router.Router`, so with a ``ledger`` each canary
reserves its worst case and is booked at its real cost, from the job's budget.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from decimal import Decimal
from typing import Any, Final

from pydantic import SecretStr

from provider_router._exceptions import BadRequestError, ConfigurationError, ProviderRouterError
from provider_router.catalog.fetch import Catalog
from provider_router.catalog.records import Endpoint, EndpointHealth, ModelEndpoints
from provider_router.catalog.verdicts import VerificationReport, VerifyThresholds
from provider_router.checks.judge import (
    CANARY_TOOL,
    THINK_MARKERS,
    Answers,
    judge,
    self_baseline,
)
from provider_router.checks.judge import agreement as agreement
from provider_router.checks.vendor_rules import ParameterProbe, VendorRules, rules_for
from provider_router.client.results import ChatResult
from provider_router.client.router import Router
from provider_router.ledger import Ledger
from provider_router.routing.policy import ProviderPolicy

__all__ = ["CANARY_PROMPTS", "CANARY_TOOL", "THINK_MARKERS", "verify"]

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

_TOOL_PROMPTS: Final = (
    "What is the weather in Paris right now, in celsius?",
    "Is it warm in Tokyo today? Use fahrenheit.",
    "Check the weather in Nairobi for me (celsius).",
    "How cold is it in Oslo? Answer in celsius.",
)
DEFAULT_SAMPLES: Final = 8
DEFAULT_TOKENS: Final = 64
DEFAULT_TOOL_SAMPLES: Final = 12
DEFAULT_SEED: Final = 1234
DEFAULT_CONCURRENCY: Final = 16
PROBE_TOKENS: Final = 16
"""``max_tokens`` of a vendor-rule probe: refused it costs nothing, served it is short."""
PROBE_PROMPT: Final = "Say hello in one short sentence."
DEFAULT_TOP_LOGPROBS: Final = 5
"""Alternatives per token asked for where logprobs are listed (OpenRouter allows 0..20)."""
MAX_TOP_LOGPROBS: Final = 20


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


async def _ask(
    router: Router,
    prompts: Sequence[list[dict[str, Any]]],
    gate: asyncio.Semaphore,
    answers: Answers,
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


async def _probe(
    router: Router, probes: Sequence[ParameterProbe], gate: asyncio.Semaphore, answers: Answers
) -> None:
    """Send each request the vendor requires refused; note what came of it."""

    async def one(index: int, probe: ParameterProbe) -> None:
        async with gate:
            try:
                answers.probes[probe.label] = await router.chat(
                    _messages(PROBE_PROMPT),
                    max_tokens=PROBE_TOKENS,
                    key=f"verify:{answers.endpoint.slug}:params:{index}",
                    **probe.fields,
                )
            except BadRequestError:
                answers.probes[probe.label] = None  # refused, as it must be
            except ProviderRouterError as exc:
                answers.probes[probe.label] = f"{type(exc).__name__}: {exc}"

    await asyncio.gather(*(one(i, p) for i, p in enumerate(probes)))


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
    top_logprobs: int | None = DEFAULT_TOP_LOGPROBS,
    vendor_rules: bool = True,
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
        top_logprobs: alternatives per token asked for (0..20) with the text
            canaries of endpoints that list ``logprobs``, when the reference lists
            them too, to compare their top-k distributions; None: not asked for
            (the verdicts say "not measured").
        vendor_rules: hold every endpoint to the rules of the model's vendor where
            :func:`~provider_router.checks.vendor_rules.rules_for` knows them (Kimi:
            fixed sampling parameters, probed with requests that must be refused, and
            prompt token counts equal to the reference's); False: not checked.

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
    if top_logprobs is not None and (
        isinstance(top_logprobs, bool) or not 0 <= top_logprobs <= MAX_TOP_LOGPROBS
    ):
        raise ConfigurationError(
            f"top_logprobs must be 0..{MAX_TOP_LOGPROBS} or None, got {top_logprobs!r}"
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
    vendor: VendorRules | None = rules_for(listing.id) if vendor_rules else None

    async def measure(endpoint: Endpoint, repeat: bool) -> tuple[Answers, Answers | None]:
        note = _logprobs_note(endpoint, ref_endpoint, top_logprobs)
        answers = Answers(endpoint, logprobs_note=note)
        again = Answers(endpoint, logprobs_note=note) if repeat else None
        text_params: dict[str, Any] = dict(greedy)
        if note is None:
            text_params.update(logprobs=True, top_logprobs=top_logprobs)
        async with Router(
            model,
            policy=_pinned(endpoint, listing),
            ledger=ledger,
            base_url=base_url,
            api_key=api_key,
            endpoints=listing,
        ) as router:
            jobs = [_ask(router, canaries, gate, answers, text_params, tokens)]
            if again is not None:
                jobs.append(_ask(router, canaries, gate, again, text_params, tokens))
            if tool_canaries and "tools" in endpoint.supported_parameters:
                choice = "required" if _supports_required(endpoint) else "auto"
                tool_params = {**greedy, "tools": [CANARY_TOOL], "tool_choice": choice}
                jobs.append(_ask(router, tool_canaries, gate, answers, tool_params, tokens))
            probing = _probe(router, vendor.probes if vendor else (), gate, answers)
            results, _ = await asyncio.gather(asyncio.gather(*jobs), probing)
        answers.text = results[0]
        if again is not None:
            again.text = results[1]
        if len(results) > (2 if again is not None else 1):
            answers.tools = results[-1]
        return answers, again

    measured = await asyncio.gather(*(measure(e, e.slug == ref_endpoint.slug) for e in chosen))
    by_tag = {answers.endpoint.slug: (answers, again) for answers, again in measured}
    ref_answers, ref_again = by_tag[ref_endpoint.slug]
    assert ref_again is not None  # the reference is asked twice
    baseline = self_baseline(ref_answers, ref_again, tokens)
    verdicts = []
    total = Decimal(0)
    for answers, again in measured:
        if again is None:
            verdict = judge(answers, ref_answers, baseline, thresholds, tokens, vendor)
        else:  # the reference's second pass against its first, with the first's tool calls
            second = Answers(
                answers.endpoint,
                again.text,
                answers.tools,
                [*answers.errors, *again.errors],
                answers.logprobs_note,
                answers.probes,
            )
            verdict = judge(second, answers, baseline, thresholds, tokens, vendor)
            verdict = replace(verdict, cost=answers.cost + again.cost)
        total += verdict.cost
        verdicts.append(verdict)
    return VerificationReport(
        model=listing.id,
        reference=ref_endpoint.slug,
        self_agreement=baseline.agreement,
        endpoints=tuple(sorted(verdicts, key=lambda v: v.tag)),
        thresholds=thresholds,
        tokens=tokens,
        cost=total,
        created=clock(),
        self_divergence=baseline.divergence,
        top_logprobs=top_logprobs,
        vendor_rules=vendor.name if vendor else None,
    )


def _logprobs_note(endpoint: Endpoint, reference: Endpoint, top: int | None) -> str | None:
    """Why this endpoint's top-k distributions are not compared (None: they are)."""
    if top is None:
        return "not measured: logprobs not asked for (top_logprobs=None)"
    if "logprobs" not in endpoint.supported_parameters:
        return f"not measured: {endpoint.provider_name} lists no logprobs"
    if "logprobs" not in reference.supported_parameters:
        return f"not measured: the reference {reference.provider_name} lists no logprobs"
    return None


def _supports_required(endpoint: Endpoint) -> bool:
    support = endpoint.supports_tool_choice
    return support is None or support.required is not False
