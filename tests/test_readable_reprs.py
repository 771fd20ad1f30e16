"""Money in reprs reads as people write it, and a route plan's repr fits on a line."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

from provider_router import MemoryLedger, ProviderPolicy, Router
from provider_router.client.results import ChatResult, Usage
from provider_router.planning.prompts import parse_prompt_line
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

pytestmark = pytest.mark.openrouter_sim(completion_tokens=20)


async def test_ledger_state_and_recovery_reprs_show_no_exponent_and_no_padding() -> None:
    ledger = MemoryLedger(Decimal(5))
    held = await ledger.reserve(Decimal("0.1"), key="k")
    await ledger.settle(held, Decimal("0.05"), estimate=Decimal("0.05"))
    text = repr(await ledger.snapshot())
    assert "limit=Decimal('5')" in text
    assert "spent=Decimal('0.05')" in text
    assert "reserved=Decimal('0')" in text
    assert "E-" not in text
    assert "000000" not in text
    assert "E-" not in repr(await ledger.recover())


def test_a_result_repr_and_its_drift_read_cleanly() -> None:
    result = ChatResult(
        text="hi",
        reasoning=None,
        provider="Chutes",
        model="m",
        generation_id="g",
        finish_reason="stop",
        usage=Usage(cost=Decimal("0.00001000")),
        cost=Decimal("0.00001000"),
        estimate=Decimal("0.000010000"),
    )
    assert result.drift == 0
    assert str(result.drift) == "0"  # not 0E-9
    assert "cost=Decimal('0.00001')" in repr(result)
    assert "E-" not in repr(result)


async def test_a_route_plan_repr_is_one_short_line(openrouter_sim: SimulatorServer) -> None:
    async with Router(
        "moonshotai/kimi-k2.5",
        policy=ProviderPolicy(exclude_below="int4"),
        base_url=openrouter_sim.url,
        api_key=DEFAULT_TEST_KEY,
    ) as router:
        text = repr(router.plan)
    assert len(text) < 400, text
    assert "\n" not in text
    assert text.startswith("RoutePlan(model='moonshotai/kimi-k2.5', order=[")


def test_an_integer_id_is_written_as_its_text_as_documented() -> None:
    prompt_id, _, _ = parse_prompt_line(json.dumps({"id": 17, "prompt": "hi"}))
    assert prompt_id == "17"
    doc = (Path(__file__).parents[1] / "docs" / "output.md").read_text()
    assert 'an integer `id` (`17`) is written as its text (`"17"`)' in doc
