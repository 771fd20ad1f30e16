"""A stop on OpenRouter's credits reads as short sentences: what happened (with
OpenRouter's own words), what the job spent, what finishing takes, what to do."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path

from _job_helpers import write_prompts

from provider_router._exceptions import CreditsExhausted, PaymentRequiredError
from provider_router.jobs.finish import credits_words, finish_hint
from provider_router.jobs.runner import JobRunner
from provider_router.jobs.summary import StopReason
from provider_router.planning.plan import Plan
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

Factory = Callable[..., Awaitable[SimulatorServer]]


async def test_the_credits_stop_is_short_sentences(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=2, credits="0.03")
    prompts = write_prompts(tmp_path / "a.jsonl", 60, prefix="a")
    plan = Plan.single([prompts], model="moonshotai/kimi-k2.5", budget=Decimal(10), max_tokens=1500)
    out = tmp_path / "out"
    summary = await JobRunner(plan, out, base_url=sim.url, api_key=DEFAULT_TEST_KEY).run()
    assert summary.reason is StopReason.CREDITS
    message = summary.message
    # What happened, with OpenRouter's words; no router internals, no key=value.
    assert message.startswith("OpenRouter's credits ran out (402, openrouter_credits): \"")
    assert "can only afford" in message
    for internal in ("the router takes no new work", "limit_source=", "; spent $"):
        assert internal not in message
    # What it cost (and what finishing takes), then what to do: a sentence each.
    said = message.split('". ', 1)[1]
    cost, todo = said.split(". ")
    assert cost.startswith(f"The job has spent ${summary.spent:.2f} of its $10.00 budget; about $")
    assert "more finishes the plan at the observed rates (a budget of $" in cost
    assert todo == (
        "Add OpenRouter credits (or raise the key's limit), then run the same command again "
        "to resume."
    )


def test_the_words_without_a_cause_or_a_known_cost() -> None:
    plain = CreditsExhausted("OpenRouter refused with 402 (Insufficient credits.); the router "
                             "takes no new work", limit_source=None, spent=Decimal(1))  # fmt: skip
    assert credits_words(plain) == 'OpenRouter\'s credits ran out (402): "Insufficient credits"'
    stopped = CreditsExhausted("x", limit_source="openrouter_key_limit")
    stopped.__cause__ = PaymentRequiredError(402, "Key limit reached")  # `raise ... from`
    assert credits_words(stopped) == (
        'OpenRouter\'s credits ran out (402, openrouter_key_limit): "Key limit reached"'
    )
    hint = finish_hint(StopReason.CREDITS, Decimal(5), Decimal(2), None, None, Decimal("0.01"))
    assert hint == (
        ". The job has spent $2.00 of its $5.00 budget; how much more finishes the plan is "
        "unknown until an answer shows its cost. Add OpenRouter credits (or raise the key's "
        "limit), then run the same command again to resume."
    )
