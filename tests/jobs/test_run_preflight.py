"""`provider-router run` preflights first, paying its 1-token request from the job's ledger.

Every charge the local OpenRouter made is in the job's ledger, the preflight's
too; the summary reports the preflight's charge apart from the datasets' costs.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

from _job_helpers import (
    assert_consistent,
    ledger_rows,
    ledger_spent,
    run_cli,
    write_prompts,
)

from provider_router._money import from_units
from provider_router.testing import SimulatorServer
from provider_router.testing._datafile import parse_data_text
from provider_router.testing.market.listing import DEFAULT_MARKET_FILE, Market

Factory = Callable[..., Awaitable[SimulatorServer]]
KIMI = "moonshotai/kimi-k2.5"


def run_argv(tmp_path: Path, sim: SimulatorServer, budget: str, count: int = 12) -> list[str]:
    prompts = write_prompts(tmp_path / "p.jsonl", count)
    return ["run", str(prompts), "--out", str(tmp_path / "o"), "--model", KIMI,
            "--budget", budget, "--max-tokens", "50", "--concurrency", "2",
            "--exclude-below", "int4", "--base-url", sim.url, "--progress", "off"]  # fmt: skip


def pinned(sim: SimulatorServer) -> list[Any]:
    return [r for r in sim.requests if r.max_tokens == 1]


def summary(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return data


async def test_the_preflight_is_paid_from_the_jobs_ledger_and_on_every_resume(
    openrouter_sim_factory: Factory, tmp_path: Path
) -> None:
    sim = await openrouter_sim_factory(seed=5)
    out = tmp_path / "o"
    argv = run_argv(tmp_path, sim, budget="0.0008")
    code, _, err = await run_cli(*argv)
    assert code == 3, err  # a budget stop part of the way
    first = pinned(sim)
    assert len(first) == 1
    assert sim.requests[0] is first[0]  # the preflight goes before any prompt
    assert first[0].routing == {"only": ["chutes"], "allow_fallbacks": False}
    records = assert_consistent(out, ["p"])
    assert 0 < len(records) < 12
    preflight = Decimal(summary(out)["preflight_usd"])
    assert preflight == Decimal(str(first[0].cost)) > 0
    rows = [r for r in ledger_rows(out) if r["key"] == "preflight"]
    assert [(r["state"], from_units(r["cost"])) for r in rows] == [("settled", preflight)]
    record_costs = sum((Decimal(r["cost"]) for r in records), Decimal(0))
    # Every charge OpenRouter made is in the ledger: the prompts' and the preflight's.
    assert ledger_spent(out) == sim.simulator.usage == record_costs + preflight

    # The resume preflights again (< $0.001) in the same ledger; nothing is lost.
    argv[argv.index("--budget") + 1] = "1"
    code, _, err = await run_cli(*argv)
    assert code == 0, err
    assert len(pinned(sim)) == 2
    records = assert_consistent(out, ["p"])
    assert sorted(r["id"] for r in records) == sorted(f"q{n}" for n in range(12))
    saved = summary(out)
    preflights = Decimal(saved["preflight_usd"])
    assert preflights == sum((Decimal(str(r.cost)) for r in pinned(sim)), Decimal(0))
    record_costs = sum((Decimal(r["cost"]) for r in records), Decimal(0))
    assert ledger_spent(out) == Decimal(saved["spent_usd"]) == sim.simulator.usage
    assert ledger_spent(out) == record_costs + preflights
    assert Decimal(saved["datasets"]["p"]["cost"]) == record_costs  # not the preflight


def impostor_market(tmp_path: Path) -> Market:
    """The default market plus a cheap endpoint whose slug is ``chutes`` but is not Chutes.

    A request pinned to ``chutes`` can reach it: the pinned provider check must fail.
    It re-quantizes (fp4), so the run's policy never picks it itself.
    """
    ref = Path(__file__).parents[2] / "provider_router" / "testing" / "markets"
    data = parse_data_text((ref / DEFAULT_MARKET_FILE).read_text(), DEFAULT_MARKET_FILE)
    endpoints = data["models"][0]["endpoints"]
    chutes = next(e for e in endpoints if e["slug"] == "chutes")
    endpoints.append(
        {
            **chutes,
            "provider": "Impostor",
            "tag": "chutes/impostor",
            "quantization": "fp4",
            "pricing": {"prompt": "0.001", "completion": "0.002"},
        }
    )
    return Market.from_data(data, tmp_path / "impostor.yaml")


async def test_a_failed_pinned_provider_check_stops_the_run_before_any_prompt(
    openrouter_sim_factory: Factory, tmp_path: Path
) -> None:
    sim = await openrouter_sim_factory(market=impostor_market(tmp_path), seed=1)
    out = tmp_path / "o"
    code, _, err = await run_cli(*run_argv(tmp_path, sim, budget="1"))
    assert code == 1, err
    assert "FAIL provider" in err
    assert "not the pinned 'Chutes'" in err
    assert "the preflight failed; no prompt was sent" in err
    (request,) = sim.requests  # the preflight's, and nothing else
    assert request.max_tokens == 1
    assert request.provider == "Impostor"
    assert not (out / "p.jsonl").exists() or not (out / "p.jsonl").read_text()
    # Its charge is in the job's ledger all the same: the money was spent.
    rows = ledger_rows(out)
    assert [(r["key"], r["state"]) for r in rows] == [("preflight", "settled")]
    assert ledger_spent(out) == sim.simulator.usage > 0
    # --no-preflight skips it: the run goes ahead (on the endpoints the policy allows).
    code, _, err = await run_cli(*run_argv(tmp_path, sim, budget="1"), "--no-preflight")
    assert code == 0, err
    assert len(pinned(sim)) == 1
    assert ledger_spent(out) == sim.simulator.usage


async def test_no_preflight_sends_no_pinned_request(
    openrouter_sim_factory: Factory, tmp_path: Path
) -> None:
    sim = await openrouter_sim_factory(seed=2)
    out = tmp_path / "o"
    code, _, err = await run_cli(*run_argv(tmp_path, sim, budget="1", count=4), "--no-preflight")
    assert code == 0, err
    assert not pinned(sim)
    assert len(sim.requests) == 4
    records = assert_consistent(out, ["p"])
    assert summary(out)["preflight_usd"] == "0"
    total = sum((Decimal(r["cost"]) for r in records), Decimal(0))
    assert ledger_spent(out) == sim.simulator.usage == total
