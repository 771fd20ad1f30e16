"""Account reconciliation (issue #10, finding 4): with the run's own key, worst-case
charges of requests cut before their generation id are bounded by the key's usage."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from _job_helpers import ledger_spent, read_records, write_prompts

from provider_router.jobs.runner import JobRunner
from provider_router.jobs.store._layout import ACCOUNT_FILE
from provider_router.jobs.summary import StopReason
from provider_router.planning.plan import Plan
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

Factory = Callable[..., Awaitable[SimulatorServer]]


def _plan(tmp_path: Path) -> Plan:
    prompts = write_prompts(tmp_path / "p.jsonl", 40)
    return Plan.single(
        [prompts], model="moonshotai/kimi-k2.5", budget=Decimal(5), max_tokens=800,
        concurrency=8, exclude_below="int4",
    )  # fmt: skip


async def _run(plan: Plan, out: Path, sim: SimulatorServer, **kwargs: Any) -> Any:
    runner = JobRunner(plan, out, base_url=sim.url, api_key=DEFAULT_TEST_KEY, **kwargs)
    return await runner.run()


@pytest.mark.parametrize("own_key", [False, True])
async def test_held_524s_are_bounded_by_the_keys_usage(
    tmp_path: Path, openrouter_sim_factory: Factory, own_key: bool
) -> None:
    sim = await openrouter_sim_factory(seed=4, bill_abandoned=True)
    # A 524 may have been billed: each is held at its worst case (no generation id).
    sim.add_fault({"kind": "provider_error", "status": 524, "times": 6, "no_fallback": True})
    out = tmp_path / "out"
    horizon = 0.0 if own_key else None
    summary = await _run(_plan(tmp_path), out, sim, account_horizon=horizon)
    if summary.reason is not StopReason.COMPLETE:  # the 524s failed some prompts: resume
        summary = await _run(_plan(tmp_path), out, sim, account_horizon=horizon)
    assert summary.reason is StopReason.COMPLETE
    assert len(read_records(out / "p.jsonl")) == 40
    charged = sim.simulator.usage
    spent = ledger_spent(out)
    assert spent >= charged  # never less than OpenRouter charged
    if own_key:
        # The key was charged nothing for the 524s: the worst cases are taken back.
        assert spent == charged
        saved = json.loads((out / ACCOUNT_FILE).read_text())
        assert saved["pending"] == []
        assert any("account:" in line for line in summary.recovered)
    else:
        assert spent > charged  # six worst cases counted in full


async def test_worst_cases_not_yet_due_are_kept_for_a_later_run(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=5, bill_abandoned=True)
    sim.add_fault({"kind": "provider_error", "status": 524, "times": 3, "no_fallback": True})
    out = tmp_path / "out"
    # A horizon of an hour: nothing is due yet, so nothing may be taken back.
    await _run(_plan(tmp_path), out, sim, account_horizon=3600.0)
    saved = json.loads((out / ACCOUNT_FILE).read_text())
    assert len(saved["pending"]) == 3  # held open, waiting to be due
    state_spent = ledger_spent(out)
    assert state_spent >= sim.simulator.usage
