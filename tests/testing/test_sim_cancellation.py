"""Stream cancellation per provider, from OpenRouter's streaming guide: a stream whose
client leaves stops billing on a provider that cancels, and is billed in full on any
other; a non-streaming request is billed in full whatever the provider."""

from __future__ import annotations

from typing import Any

import pytest
from test_sim_abandoned import Gate, _leave_early

from provider_router.testing.market.cancellation import (
    CANCELS,
    DOES_NOT_CANCEL,
    provider_cancels,
)


def test_the_docs_lists_are_disjoint_and_unknown_providers_do_not_cancel() -> None:
    assert not CANCELS & DOES_NOT_CANCEL
    for name in ("Chutes", "DeepInfra", "Together", "Together AI", "Novita", "Fireworks", "xAI"):
        assert provider_cancels(name), name
    for name in (
        "Groq",
        "Google AI Studio",
        "Amazon Bedrock",
        "Moonshot AI",
        "Parasail",
        "BaseTen",
    ):
        assert not provider_cancels(name), name


async def _abandon_on(openrouter_sim_factory: Any, only: str, stream: bool, **options: Any) -> Any:
    gate = Gate()
    sim = await openrouter_sim_factory(
        speed=1000,
        sleep=gate,
        clock=lambda: 0.0,
        completion_tokens=120,
        generation_404s=0,
        market=None,
        **options,
    )
    await _leave_early(sim, stream, provider={"only": [only]})
    gate.opened.set()
    await sim.simulator.settle_abandoned()
    (record,) = sim.requests
    return sim, record


@pytest.mark.parametrize(
    ("only", "stream", "whole"),
    [
        ("chutes", True, False),  # cancels: the tokens sent (none here), not the rest
        ("deepinfra", True, False),
        ("moonshotai", True, True),  # on neither list: taken not to cancel
        ("parasail", True, True),
        ("chutes", False, True),  # non-streaming: always billed in full
        ("moonshotai", False, True),
    ],
)
async def test_a_client_that_leaves_is_billed_as_its_provider_bills(
    openrouter_sim_factory: Any, only: str, stream: bool, whole: bool
) -> None:
    sim, record = await _abandon_on(openrouter_sim_factory, only, stream)
    assert record.tag == only
    assert record.completion_tokens == (120 if whole else 0)
    assert record.cost == sim.simulator.usage > 0  # the prompt at least, exact
    body = sim.simulator.generations[record.generation_id].body()
    assert body["tokens_completion"] == record.completion_tokens


@pytest.mark.parametrize(("mode", "whole"), [("none", True), ("all", False)])
async def test_the_mode_can_make_every_provider_cancel_or_none(
    openrouter_sim_factory: Any, mode: str, whole: bool
) -> None:
    _, record = await _abandon_on(
        openrouter_sim_factory, "chutes" if whole else "moonshotai", True, cancellation=mode
    )
    assert record.completion_tokens == (120 if whole else 0)


async def test_bill_abandoned_still_means_no_provider_cancels(openrouter_sim_factory: Any) -> None:
    sim = await openrouter_sim_factory(bill_abandoned=True)
    assert sim.simulator.cancellation == "none"
    sim = await openrouter_sim_factory(bill_abandoned=False)
    assert sim.simulator.cancellation == "all"
    with pytest.raises(ValueError, match="cancellation must be one of"):
        await openrouter_sim_factory(cancellation="sometimes")
