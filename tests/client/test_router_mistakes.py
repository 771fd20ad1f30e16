"""A caller's mistakes get a message that says what is wrong and how to write it,
before anything is sent: never an ``AttributeError`` from deep inside."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from provider_router import (
    ConfigurationError,
    MemoryLedger,
    NotFoundError,
    ProviderPolicy,
    Router,
    SQLiteLedger,
)
from provider_router.planning.plan import Plan
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

KIMI = "moonshotai/kimi-k2.5"
pytestmark = pytest.mark.openrouter_sim(completion_tokens=20)


def _chats(sim: SimulatorServer) -> int:
    return sum(1 for r in sim.requests if r.path.endswith("/chat/completions"))


@pytest.mark.parametrize(
    ("messages", "says"),
    [
        ("Hi", "messages must be a list of {'role': ..., 'content': ...} dicts, got a str"),
        (["Hi"], "messages[0] must be a dict like {'role': 'user', 'content': ...}, got str"),
        (42, "messages must be a list of dicts like"),
    ],
)
async def test_chat_with_messages_that_are_not_messages(
    openrouter_sim: SimulatorServer, messages: Any, says: str
) -> None:
    async with Router(
        KIMI,
        policy=ProviderPolicy(exclude_below="int4"),
        base_url=openrouter_sim.url,
        api_key=DEFAULT_TEST_KEY,
    ) as router:
        with pytest.raises(ConfigurationError) as raised:
            await router.chat(messages, max_tokens=10)
    assert says in str(raised.value)
    assert _chats(openrouter_sim) == 0


@pytest.mark.parametrize("budget", [Decimal(1), 1, "1"])
def test_a_budget_given_as_the_ledger_says_how_to_write_it(budget: object) -> None:
    with pytest.raises(ConfigurationError) as raised:
        Router(KIMI, ledger=budget)  # type: ignore[arg-type]
    message = str(raised.value)
    assert "ledger must be a Ledger (MemoryLedger, SQLiteLedger or RedisLedger)" in message
    assert "pass ledger=MemoryLedger(Decimal('1'))" in message


async def test_a_base_url_without_api_v1_is_named_in_the_404(
    openrouter_sim: SimulatorServer,
) -> None:
    root = openrouter_sim.url.removesuffix("/api/v1")
    router = Router(KIMI, base_url=root, api_key=DEFAULT_TEST_KEY)
    with pytest.raises(NotFoundError) as raised:
        await router.open()
    message = str(raised.value)
    assert f"GET {root}/models/{KIMI}/endpoints" in message
    assert "ends in /api/v1" in message
    assert DEFAULT_TEST_KEY not in message


async def test_a_missing_key_is_named_before_anything_is_sent(
    openrouter_sim: SimulatorServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    async with Router(
        KIMI, policy=ProviderPolicy(exclude_below="int4"), base_url=openrouter_sim.url
    ) as router:  # the endpoints listing needs no key
        with pytest.raises(ConfigurationError, match="no API key: set OPENROUTER_API_KEY"):
            await router.chat([{"role": "user", "content": "Hi"}], max_tokens=10)
    assert _chats(openrouter_sim) == 0


@pytest.mark.parametrize(
    ("given", "limit"),
    [("0.1", Decimal("0.1")), (0.3, Decimal("0.3")), (Decimal("2.5"), Decimal("2.5")), (3, 3)],
)
async def test_one_rule_for_a_budget_in_a_plan_and_in_every_ledger(
    given: object, limit: Decimal, tmp_path: Path
) -> None:
    plan = Plan.single(["p.jsonl"], model=KIMI, budget=Decimal(1))
    assert plan.with_overrides(budget=given).budget == limit  # type: ignore[arg-type]
    memory = MemoryLedger(given)  # type: ignore[arg-type]
    assert (await memory.snapshot()).limit == limit
    await memory.set_limit(given)  # type: ignore[arg-type]
    async with SQLiteLedger(tmp_path / "l.sqlite", given) as sqlite:  # type: ignore[arg-type]
        assert (await sqlite.snapshot()).limit == limit


@pytest.mark.parametrize(("given", "says"), [(True, "boolean"), ("abc", "decimal number")])
def test_a_budget_that_is_not_an_amount_is_refused_alike(given: object, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        MemoryLedger(given)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=says):
        Plan.single(["p.jsonl"], model=KIMI, budget=given)  # type: ignore[arg-type]
