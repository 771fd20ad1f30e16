"""The preflight against the local OpenRouter: every check holds, and each can fail."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from provider_router import ProviderPolicy
from provider_router._format import decimal_str
from provider_router.catalog.fetch import Catalog
from provider_router.catalog.records import ModelEndpoints
from provider_router.checks._pinned_request import PREFLIGHT_RETRY
from provider_router.checks.preflight import PreflightReport, preflight
from provider_router.ledger import LedgerState, MemoryLedger, SQLiteLedger
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

Factory = Callable[..., Awaitable[SimulatorServer]]
KIMI = "moonshotai/kimi-k2.5"
INT4 = ProviderPolicy(exclude_below="int4")
ALL_CHECKS = [
    "key",
    "credits",
    "model",
    "policy",
    "request",
    "provider",
    "usage.cost",
    "price",
    "generation",
]


async def no_wait(seconds: float) -> None:
    return None


async def check(
    sim: SimulatorServer, policy: ProviderPolicy = INT4, **kwargs: Any
) -> PreflightReport:
    kwargs.setdefault("api_key", DEFAULT_TEST_KEY)
    return await preflight(
        kwargs.pop("model", KIMI), policy, base_url=sim.url, sleep=no_wait, **kwargs
    )


def chats(sim: SimulatorServer) -> list[Any]:
    return [r for r in sim.requests if r.route == "chat"]


async def cli(*argv: str) -> tuple[int, str, str]:
    env = {**os.environ, "OPENROUTER_API_KEY": DEFAULT_TEST_KEY}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "provider_router", *argv,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def verdicts(report: PreflightReport) -> dict[str, bool | None]:
    return {c.name: c.ok for c in report.checks}


def detail(report: PreflightReport, name: str) -> str:
    return next(c.detail for c in report.checks if c.name == name)


async def edited_listing(
    sim: SimulatorServer, tmp_path: Path, edit: Callable[[dict[str, Any]], None]
) -> ModelEndpoints:
    """The simulator's own listing of Kimi K2.5 with ``edit`` applied to Chutes' endpoint."""
    async with Catalog(base_url=sim.url) as catalog:
        await catalog.endpoints(KIMI)
        snapshot = catalog.snapshot()
    endpoints = snapshot["endpoints"][KIMI]["data"]["endpoints"]
    edit(next(e for e in endpoints if e["tag"] == "chutes"))
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(snapshot))
    return await Catalog.load_snapshot(path).endpoints(KIMI)


async def test_every_check_holds_on_a_faithful_market(openrouter_sim_factory: Factory) -> None:
    sim = await openrouter_sim_factory(api_keys={DEFAULT_TEST_KEY: 5}, seed=1)
    report = await check(sim)
    assert report.ok, report.failures
    assert list(verdicts(report)) == ALL_CHECKS
    assert "limit $5.00" in detail(report, "key")
    assert "balance $100.00" in detail(report, "credits")
    assert "rejected — Fireworks" in detail(report, "policy")
    assert detail(report, "provider") == "served by 'Chutes'"
    # One request of one output token, pinned without fallbacks, well under $0.001.
    (request,) = chats(sim)
    assert request.provider == "Chutes"
    assert request.cost < 0.001
    assert request.max_tokens == 1
    assert request.routing == {"only": ["chutes"], "allow_fallbacks": False}


async def test_a_rejected_key_fails_first_and_names_the_variable(
    openrouter_sim_factory: Factory,
) -> None:
    sim = await openrouter_sim_factory()
    report = await check(sim, api_key="sk-or-v1-nope")
    assert verdicts(report) == {"key": False}
    assert "OPENROUTER_API_KEY" in detail(report, "key")
    assert "sk-or-v1-nope" not in detail(report, "key")
    assert not chats(sim)


async def test_no_key_at_all(
    openrouter_sim_factory: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = await openrouter_sim_factory()
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    report = await check(sim, api_key=None)
    assert verdicts(report) == {"key": False}
    assert "OPENROUTER_API_KEY" in detail(report, "key")


async def test_a_used_up_key_limit_fails(openrouter_sim_factory: Factory) -> None:
    sim = await openrouter_sim_factory(api_keys={DEFAULT_TEST_KEY: 0})
    report = await check(sim)
    assert verdicts(report)["key"] is False
    assert "limit is used up" in detail(report, "key")


async def test_no_credits_fails(openrouter_sim_factory: Factory) -> None:
    sim = await openrouter_sim_factory(credits=0)
    report = await check(sim)
    assert verdicts(report)["credits"] is False
    assert "add credits" in detail(report, "credits")
    assert not report.ok


async def test_an_unknown_model_fails(openrouter_sim_factory: Factory) -> None:
    sim = await openrouter_sim_factory()
    report = await check(sim, model="nobody/no-such-model")
    assert verdicts(report)["model"] is False
    assert "nobody/no-such-model" in detail(report, "model")
    assert "request" not in verdicts(report)


async def test_a_policy_that_allows_nothing_fails(openrouter_sim_factory: Factory) -> None:
    sim = await openrouter_sim_factory()
    report = await check(sim, policy=ProviderPolicy(only=["nobody"]))
    assert verdicts(report)["policy"] is False
    assert "nothing may serve" in detail(report, "policy")
    assert not chats(sim)


async def test_a_pinned_provider_that_does_not_serve_fails(
    openrouter_sim_factory: Factory, tmp_path: Path
) -> None:
    sim = await openrouter_sim_factory()

    def mislabel(chutes: dict[str, Any]) -> None:
        chutes["tag"] = "deepinfra"  # the listing says Chutes, the route reaches DeepInfra

    report = await check(sim, listing=await edited_listing(sim, tmp_path, mislabel))
    assert verdicts(report)["provider"] is False
    assert "not the pinned 'Chutes'" in detail(report, "provider")


async def test_a_listing_price_that_is_not_what_is_billed_fails(
    openrouter_sim_factory: Factory, tmp_path: Path
) -> None:
    sim = await openrouter_sim_factory()

    def cheaper(chutes: dict[str, Any]) -> None:
        chutes["pricing"]["prompt"] = "0.0000001"

    report = await check(sim, listing=await edited_listing(sim, tmp_path, cheaper))
    assert verdicts(report)["provider"] is True
    assert verdicts(report)["price"] is False
    assert "does not price what is billed" in detail(report, "price")


async def test_an_answer_without_usage_cost_fails(openrouter_sim_factory: Factory) -> None:
    sim = await openrouter_sim_factory(faults=[{"kind": "no_usage_cost", "provider": "chutes"}])
    report = await check(sim)
    assert verdicts(report)["provider"] is True
    assert verdicts(report)["usage.cost"] is False
    assert "no usage.cost" in detail(report, "usage.cost")
    (request,) = chats(sim)
    assert request.outcome == "no_usage_cost"
    assert request.cost > 0  # billed all the same


async def test_a_generation_record_that_never_shows_fails(openrouter_sim_factory: Factory) -> None:
    sim = await openrouter_sim_factory(generation_404s=100)
    report = await check(sim)
    assert verdicts(report)["usage.cost"] is True
    assert verdicts(report)["generation"] is False


async def test_a_failing_pinned_request_fails(openrouter_sim_factory: Factory) -> None:
    sim = await openrouter_sim_factory(faults=[{"kind": "down", "provider": "chutes"}])
    report = await check(sim)
    assert verdicts(report)["request"] is False
    assert "pinned to chutes failed" in detail(report, "request")


async def test_a_busy_pinned_provider_is_retried(openrouter_sim_factory: Factory) -> None:
    sim = await openrouter_sim_factory(
        faults=[{"kind": "rate_limit", "provider": "chutes", "times": 2, "retry_after": 3}]
    )
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    report = await preflight(KIMI, INT4, base_url=sim.url, api_key=DEFAULT_TEST_KEY, sleep=record)
    assert report.ok, report.failures
    # Retry-After is real seconds (0 at infinite speed): the jittered backoff of
    # any request's retries decides (PREFLIGHT_RETRY), within its ceilings.
    retries = waits[:2]  # then /generation's lookups
    assert all(0 <= w <= PREFLIGHT_RETRY.backoff.ceiling(n) for n, w in enumerate(retries, 1))
    assert len(chats(sim)) == 3


async def test_run_preflights_first_and_sends_nothing_when_it_fails(
    openrouter_sim_factory: Factory, tmp_path: Path
) -> None:
    sim = await openrouter_sim_factory(credits=0)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    argv = ["run", str(prompts), "--out", str(tmp_path / "o"), "--model", KIMI,
            "--budget", "1", "--max-tokens", "50", "--base-url", sim.url]  # fmt: skip
    code, _, err = await cli(*argv)
    assert code == 1, err
    assert "FAIL credits" in err
    assert "the preflight failed; no prompt was sent" in err
    assert not chats(sim)  # nothing paid when a free check already failed
    code, _, err = await cli(*argv, "--no-preflight")
    assert code == 4, err  # the run itself meets the 402


async def test_the_preflight_command(openrouter_sim_factory: Factory) -> None:
    sim = await openrouter_sim_factory()
    base = ["preflight", "--model", KIMI, "--base-url", sim.url]
    code, out, err = await cli(*base, "--exclude-below", "int4", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["ok"] is True
    assert [c["name"] for c in report["checks"]] == ALL_CHECKS
    code, out, _ = await cli(*base, "--only", "nobody")
    assert code == 1
    assert "FAILED (policy)" in out


async def test_run_checks_up_front_that_the_model_exists(
    openrouter_sim_factory: Factory, tmp_path: Path
) -> None:
    sim = await openrouter_sim_factory()
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    code, _, err = await cli(
        "run", str(prompts), "--out", str(tmp_path / "o"), "--model", "nobody/no-such-model",
        "--budget", "1", "--max-tokens", "50", "--base-url", sim.url,
    )  # fmt: skip
    assert code == 1, err
    assert "FAIL model" in err
    assert "nobody/no-such-model" in err
    assert not chats(sim)


async def test_with_a_ledger_the_request_is_reserved_and_settled_at_its_cost(
    openrouter_sim_factory: Factory,
) -> None:
    sim = await openrouter_sim_factory()
    async with MemoryLedger(Decimal(1)) as ledger:
        report = await check(sim, ledger=ledger)
        state = await ledger.snapshot()
    assert report.ok, report.failures
    assert report.cost == sim.simulator.usage == state.spent > 0
    assert state.reserved == 0
    assert report.to_json()["cost_usd"] == str(report.cost)


async def test_with_a_ledger_an_error_answer_is_released(openrouter_sim_factory: Factory) -> None:
    sim = await openrouter_sim_factory(faults=[{"kind": "down", "provider": "chutes"}])
    async with MemoryLedger(Decimal(1)) as ledger:
        report = await check(sim, ledger=ledger)
        state = await ledger.snapshot()
    assert verdicts(report)["request"] is False
    assert state.spent == state.reserved == report.cost == 0 == sim.simulator.usage


async def test_with_a_ledger_an_answer_without_usage_cost_is_charged_from_generation(
    openrouter_sim_factory: Factory,
) -> None:
    sim = await openrouter_sim_factory(faults=[{"kind": "no_usage_cost", "provider": "chutes"}])
    async with MemoryLedger(Decimal(1)) as ledger:
        report = await check(sim, ledger=ledger)
        state = await ledger.snapshot()
    assert verdicts(report)["usage.cost"] is False
    assert state.spent == report.cost == sim.simulator.usage > 0  # billed: counted exactly


@pytest.mark.parametrize("reported", [0, 1e-30], ids=["zero", "1e-30"])
async def test_with_a_ledger_an_absurdly_low_usage_cost_is_booked_as_generation_records(
    openrouter_sim_factory: Factory, reported: float
) -> None:
    # The high side of a lying usage.cost is disputed; the low side must not go on the
    # ledger as is either: the ledger never below what OpenRouter charged.
    fault = {"kind": "usage_cost", "reported": reported, "stream": False, "times": 1}
    sim = await openrouter_sim_factory(faults=[fault])
    async with MemoryLedger(Decimal(1)) as ledger:
        report = await check(sim, ledger=ledger)
        state = await ledger.snapshot()
    assert verdicts(report)["price"] is False  # said: the listing does not price it
    assert state.spent == report.cost == sim.simulator.usage > 0
    assert state.reserved == 0


async def test_with_a_ledger_that_has_no_room_nothing_is_sent(
    openrouter_sim_factory: Factory,
) -> None:
    sim = await openrouter_sim_factory()
    async with MemoryLedger(Decimal("0.00001")) as ledger:
        report = await check(sim, ledger=ledger)
        state = await ledger.snapshot()
    assert verdicts(report)["request"] is None  # could not tell: not a failure
    assert "no room" in detail(report, "request")
    assert report.ok
    assert not chats(sim)
    assert state.spent == state.reserved == 0


# --- #21: the pinned request is paid for and retried as any request ---------------


async def check_in_sqlite(
    sim: SimulatorServer, tmp_path: Path
) -> tuple[PreflightReport, LedgerState, list[dict[str, Any]]]:
    """The preflight paid from a $1 SQLite ledger: its report, totals and rows."""
    async with SQLiteLedger(tmp_path / "l.sqlite", limit=Decimal(1)) as ledger:
        report = await check(sim, ledger=ledger)
        state = await ledger.snapshot()
    con = sqlite3.connect(tmp_path / "l.sqlite")
    con.row_factory = sqlite3.Row
    try:
        rows = [dict(row) for row in con.execute("SELECT * FROM reservations")]
    finally:
        con.close()
    return report, state, rows


@pytest.mark.parametrize("reported", ["0.001", True, float("nan"), [1]])
async def test_a_cost_that_is_not_a_json_number_is_missing_not_a_number(
    openrouter_sim_factory: Factory, reported: object
) -> None:
    # "0.001" was booked as $0.001, 8.5x its hold.
    sim = await openrouter_sim_factory(faults=[{"kind": "usage_cost", "reported": reported}])
    async with MemoryLedger(Decimal(1)) as ledger:
        report = await check(sim, ledger=ledger)
        state = await ledger.snapshot()
    assert verdicts(report)["usage.cost"] is False
    assert "no usage.cost (as a JSON number)" in detail(report, "usage.cost")
    assert state.spent == report.cost == sim.simulator.usage > 0  # /generation's figure
    assert state.open == 0


@pytest.mark.parametrize(
    ("reported", "found"),
    [(1000000, "more than 2x its reservation"), (-5, "is negative ($-5)")],
)
async def test_an_absurd_or_negative_cost_is_disputed_and_its_worst_case_booked(
    openrouter_sim_factory: Factory, tmp_path: Path, reported: int, found: str
) -> None:
    sim = await openrouter_sim_factory(faults=[{"kind": "usage_cost", "reported": reported}])
    report, state, rows = await check_in_sqlite(sim, tmp_path)
    assert not report.ok
    text = detail(report, "usage.cost")
    assert text.startswith("disputed cost: the server's usage.cost for generation gen-")
    assert found in text
    assert report.verdict is not None
    assert report.verdict.disputed == reported
    (row,) = rows
    assert row["state"] == "settled"  # never left open
    assert state.spent == report.cost == report.verdict.booked
    assert sim.simulator.usage <= state.spent < Decimal("0.001")  # never the figure


async def test_an_insured_empty_answer_is_retried_not_a_price_failure(
    openrouter_sim_factory: Factory, tmp_path: Path
) -> None:
    # One error_200 failed the preflight as "usage.cost = $0.0: the listing does
    # not price what is billed".
    sim = await openrouter_sim_factory(faults=[{"kind": "error_200", "times": 1}])
    report, state, rows = await check_in_sqlite(sim, tmp_path)
    assert report.ok, report.failures
    assert len(chats(sim)) == 2
    assert min(r["cost"] for r in rows) == 0  # the empty answer: settled at $0
    assert all(r["state"] == "settled" and r["generation_id"] for r in rows)
    assert state.spent == report.cost == sim.simulator.usage


async def test_only_insured_empty_answers_cannot_tell_the_price(
    openrouter_sim_factory: Factory,
) -> None:
    sim = await openrouter_sim_factory(faults=[{"kind": "error_200"}])
    async with MemoryLedger(Decimal(1)) as ledger:
        report = await check(sim, ledger=ledger)
        state = await ledger.snapshot()
    assert verdicts(report)["request"] is None  # could not tell: not a failure
    assert "billed $0 under zero-completion insurance" in detail(report, "request")
    assert state.spent == state.reserved == 0 == sim.simulator.usage


@pytest.mark.parametrize("kind", ["reset", "truncate"])
async def test_a_cut_connection_is_retried_and_its_charge_counted(
    openrouter_sim_factory: Factory, tmp_path: Path, kind: str
) -> None:
    # A cut connection failed the preflight at once.
    sim = await openrouter_sim_factory(faults=[{"kind": kind, "times": 1}])
    report, state, rows = await check_in_sqlite(sim, tmp_path)
    assert report.ok, report.failures
    assert len(chats(sim)) == 2
    assert len(rows) == 2
    # Both attempts billed (the cut one in full); both settled with their ids.
    assert all(r["state"] == "settled" and r["generation_id"] for r in rows)
    assert state.spent == report.cost >= sim.simulator.usage > 0


async def test_one_requests_price_is_said_at_one_precision(openrouter_sim_factory: Factory) -> None:
    sim = await openrouter_sim_factory()
    report = await check(sim)
    cost = chats(sim)[-1].cost
    exact = f"${decimal_str(cost)}"
    assert detail(report, "usage.cost") == f"usage.cost {exact}"  # was $0.0000090
    assert detail(report, "price").endswith(f"= {exact}; usage.cost = {exact}")
    assert detail(report, "generation") == f"/generation total_cost {exact}"
