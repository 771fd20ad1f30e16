"""`provider-router run` with `route: batch` datasets, as a process: end to end, the
results-402 top-up resume, and SIGKILL at random points across submit, poll and collect."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path

import pytest
from _job_helpers import (
    ledger_spent,
    read_records,
    run_cli,
    spawn_cli,
    times_submitted,
    write_prompts,
)
from _polling import until

from provider_router.cli._exit_codes import EXIT_CODES
from provider_router.jobs.run import combined_reason
from provider_router.jobs.summary import StopReason
from provider_router.testing import SimulatorServer

Factory = Callable[..., Awaitable[SimulatorServer]]
SIZES = {"a": 14, "b": 9}
FAST = ["--batch-poll", "0.02", "--batch-lost-grace", "0.3", "--progress", "off"]


def make_plan(
    tmp_path: Path,
    *,
    budget: str = "20",
    route: str = "batch",
    routes: dict[str, str] | None = None,
) -> Path:
    """Datasets a and b, each on ``route`` unless ``routes`` names its own."""
    for name, size in SIZES.items():
        write_prompts(tmp_path / f"{name}.jsonl", size, prefix=name)
    chosen = {name: (routes or {}).get(name, route) for name in SIZES}
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "model: moonshotai/kimi-k3\n"
        f"budget: {budget}\n"
        "policy: {exclude_below: int4}\n"
        "generation: {max_tokens: 300}\n"
        "datasets:\n"
        + "".join(f"  - {{name: {n}, input: {n}.jsonl, route: {r}}}\n" for n, r in chosen.items())
    )
    return plan


def expected_ids() -> list[str]:
    return sorted(f"{name}{n}" for name, size in SIZES.items() for n in range(size))


def output_ids(out: Path) -> list[str]:
    ids: list[str] = []
    for name in SIZES:
        path = out / f"{name}.jsonl"
        if path.exists():
            ids += [r["id"] for r in read_records(path)]
    return ids


def run_args(plan: Path, out: Path, sim: SimulatorServer) -> list[str]:
    return ["run", "--plan", str(plan), "--out", str(out), "--base-url", sim.url, *FAST]


async def test_a_batch_plan_runs_end_to_end(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(speed=math_inf(), seed=3)
    plan, out = make_plan(tmp_path), tmp_path / "out"
    code, _, err = await run_cli(*run_args(plan, out, sim))
    assert code == 0, err[-2000:]
    assert "Batch route: 2 batches submitted, 2 collected, 23 lines written" in err
    assert sorted(output_ids(out)) == expected_ids()
    assert set(times_submitted(out, sim).values()) == {1}
    sim.simulator.batches.settle_all()
    assert ledger_spent(out) == sim.simulator.usage
    record = read_records(out / "a.jsonl")[0]
    assert record["provider"] == "Together"
    report = json.loads((out / "batches.json").read_text())
    assert report["collected"] == 2
    assert report["lines_done"] == 23
    assert Decimal(report["cost_usd"]) == sim.simulator.usage
    code, _, err = await run_cli(*run_args(plan, out, sim), "--progress", "plain")
    assert code == 0
    assert "0 batches submitted" in err
    assert "batches of a: 1 submitted (1 completed); 14 lines done, 0 failed, 0 in batches" in err


async def test_a_batch_route_on_a_model_without_one_is_refused(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(speed=math_inf())
    plan = make_plan(tmp_path)
    plan.write_text(plan.read_text().replace("kimi-k3", "kimi-k2.5"))
    code, _, err = await run_cli(*run_args(plan, tmp_path / "out", sim))
    # A usage error (exit 2) naming the plan file and the dataset's line, nothing sent.
    assert code == 2, err
    assert f"{plan}:6: dataset 'a' asks for route: batch, but moonshotai/kimi-k2.5 has no " in err
    assert "Batch API endpoint" in err
    assert len(sim.simulator.batches) == 0
    assert not sim.requests


async def test_results_402_stops_with_the_top_up_then_resume_collects(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(speed=math_inf(), credits="0.02")
    plan, out = make_plan(tmp_path), tmp_path / "out"
    # Another spender empties the account between submit and finalize.
    proc = await spawn_cli(
        *run_args(plan, out, sim), "--batch-poll", "0.5", stderr=asyncio.subprocess.PIPE
    )
    await until(lambda: len(sim.simulator.batches) == 2)
    sim.simulator.set_balance(0)
    _, err_bytes = await proc.communicate()
    err = err_bytes.decode()
    assert proc.returncode == 4, err[-2000:]
    assert "add at least $" in err
    assert output_ids(out) == []
    before = len(sim.simulator.batches)
    sim.simulator.top_up(1)
    code, _, err = await run_cli(*run_args(plan, out, sim))
    assert code == 0, err[-2000:]
    assert len(sim.simulator.batches) == before, "collected, not re-run"
    assert sorted(output_ids(out)) == expected_ids()
    sim.simulator.batches.settle_all()
    assert ledger_spent(out) == sim.simulator.usage


KILLS = 12
"""Kill points (fewer than the issue's 20: two shared cores; bench/bench_batch_api.py runs 20)."""


@pytest.mark.slow
async def test_sigkill_across_submit_poll_and_collect_loses_and_repeats_nothing(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    # speed 3000: a median batch takes 0.14 s, so kills land while batches run too.
    sim = await openrouter_sim_factory(speed=3000, seed=5)
    sim.simulator.batches.faults.lose_202 = 2
    plan, out = make_plan(tmp_path), tmp_path / "out"
    rng = random.Random(25)
    killed = 0
    for point in range(KILLS):
        proc = await spawn_cli(*run_args(plan, out, sim), "--batch-size", "2")
        if point % 4 == 0:
            await asyncio.sleep(rng.uniform(0.0, 1.0))  # start-up, recovery, the lost-202 search
        else:
            # After a few more steps (intents, 202s, collects) of the batch route's journal.
            await steps_taken(proc, out, journal_entries(out) + rng.randint(1, 5))
        if proc.returncode is None:
            proc.kill()
            killed += 1
        await proc.wait()
    assert killed >= KILLS // 2, "most kill points landed while the run was alive"
    code, _, err = await run_cli(*run_args(plan, out, sim), "--batch-size", "2")
    assert code == 0, err[-2000:]
    ids = output_ids(out)
    assert len(ids) == len(set(ids)), "every prompt written once"
    assert sorted(ids) == expected_ids(), "none lost"
    counts = times_submitted(out, sim)
    assert set(counts.values()) == {1}, (
        f"submitted twice: {[p for p, n in counts.items() if n > 1]}"
    )
    sim.simulator.batches.settle_all()
    spent = ledger_spent(out)
    assert spent >= sim.simulator.usage, "the ledger holds everything OpenRouter charged"
    assert spent <= Decimal(20)
    # The campaign did exercise what it claims: batches sent over several runs, lost 202s.
    assert len(sim.simulator.batches) == 12
    assert sim.simulator.batches.faults.lose_202 == 0


def journal_entries(out: Path) -> int:
    path = out / "batches.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


async def steps_taken(proc: asyncio.subprocess.Process, out: Path, entries: int) -> None:
    """Wait until the batch journal has ``entries`` lines, the process ended, or 10 s."""
    for _ in range(3000):
        if proc.returncode is not None or journal_entries(out) >= entries:
            return
        await asyncio.sleep(0.003)


def math_inf() -> float:
    return float("inf")


@pytest.mark.parametrize("route", ["auto", "batch"])
async def test_lines_that_failed_every_batch_go_sync_for_auto_and_end_batch_incomplete(
    tmp_path: Path, openrouter_sim_factory: Factory, route: str
) -> None:
    # route: auto: the lines that failed in every batch they went in go sync; with
    # route: batch they are not written, and the run says so (exit 5, not 0).
    sim = await openrouter_sim_factory(speed=math_inf(), seed=3)
    sim.simulator.batches.faults.line_failure_rate = 1.0
    plan, out = make_plan(tmp_path, route=route), tmp_path / "out"
    code, _, err = await run_cli(*run_args(plan, out, sim))
    assert set(times_submitted(out, sim).values()) == {2}, "each line in two batches"
    if route == "batch":
        assert code == EXIT_CODES[StopReason.INCOMPLETE], err[-2000:]
        assert "23 prompts of route: batch datasets failed in every batch" in err
        assert output_ids(out) == []
        return
    assert code == 0, err[-2000:]
    assert sorted(output_ids(out)) == expected_ids(), "written by the sync route"
    sim.simulator.batches.settle_all()
    assert ledger_spent(out) == sim.simulator.usage


MIXED = {"a": "batch", "b": "sync"}


async def test_a_mixed_runs_batch_failures_reach_the_exit_code(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    # Every line of the batch dataset fails in every batch; the sync dataset finishes:
    # the run is incomplete (exit 5), not a success because its last part was.
    sim = await openrouter_sim_factory(speed=math_inf(), seed=3)
    sim.simulator.batches.faults.line_failure_rate = 1.0
    plan, out = make_plan(tmp_path, routes=MIXED), tmp_path / "out"
    code, _, err = await run_cli(*run_args(plan, out, sim))
    assert code == EXIT_CODES[StopReason.INCOMPLETE], err[-2000:]
    assert "14 prompts of route: batch datasets failed in every batch" in err
    ids = output_ids(out)
    assert sorted(ids) == sorted(f"b{n}" for n in range(SIZES["b"])), "the sync part ran"


async def test_a_mixed_runs_sync_budget_stop_reaches_the_exit_code(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    # The batch part completes; the sync part then meets the budget: exit 3.
    sim = await openrouter_sim_factory(speed=math_inf(), seed=3)
    plan, out = make_plan(tmp_path, budget="0.012", routes=MIXED), tmp_path / "out"
    code, _, err = await run_cli(*run_args(plan, out, sim))
    assert code == EXIT_CODES[StopReason.BUDGET], err[-2000:]
    assert len(read_records(out / "a.jsonl")) == SIZES["a"], "the batch part finished"
    sim.simulator.batches.settle_all()
    assert ledger_spent(out) <= Decimal("0.012")


@pytest.mark.parametrize(
    ("batch", "sync", "expected"),
    [
        (StopReason.COMPLETE, StopReason.COMPLETE, StopReason.COMPLETE),
        (StopReason.INCOMPLETE, StopReason.COMPLETE, StopReason.INCOMPLETE),
        (StopReason.INCOMPLETE, StopReason.TARGET_NOT_REACHED, StopReason.INCOMPLETE),
        (StopReason.INCOMPLETE, StopReason.BUDGET, StopReason.BUDGET),
        (StopReason.INCOMPLETE, StopReason.CREDITS, StopReason.CREDITS),
        (StopReason.INCOMPLETE, StopReason.ERROR, StopReason.ERROR),
        (StopReason.INCOMPLETE, StopReason.INTERRUPTED, StopReason.INTERRUPTED),
        (StopReason.COMPLETE, StopReason.BUDGET, StopReason.BUDGET),
        (StopReason.COMPLETE, StopReason.TARGET_NOT_REACHED, StopReason.TARGET_NOT_REACHED),
    ],
)
def test_one_exit_code_for_the_batch_and_sync_parts(
    batch: StopReason, sync: StopReason, expected: StopReason
) -> None:
    assert combined_reason(batch, sync) is expected
