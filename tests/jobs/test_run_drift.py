"""``run --verify`` during the run: a provider that turns degraded mid-run is excluded
within the next check, and exactly the rows it served since its last passing check are
flagged, with the budget and exactly-once kept (on the local OpenRouter, real sockets)."""

from __future__ import annotations

import io
import json
import random
import shutil
from collections.abc import Collection, Mapping
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from _drift_helpers import Factory, chutes_turning, turning_cli_job
from _job_helpers import (
    assert_consistent,
    ledger_rows,
    ledger_spent,
    run_cli,
    small_plan,
    spawn_cli,
)
from _markets import edited_market
from _polling import until

import provider_router as pr
from provider_router._money import from_units
from provider_router.jobs import RunSummary, StopReason, read_outputs
from provider_router.jobs.drift_history import DriftHistory
from provider_router.jobs.runner import JobRunner
from provider_router.jobs.store.outputs import export_conversations
from provider_router.planning.plan import Plan
from provider_router.testing import SimulatorServer
from provider_router.testing.server import DEFAULT_TEST_KEY

KEY = DEFAULT_TEST_KEY


def _rows(out: Path) -> list[dict[str, Any]]:
    return [dict(record) for _, record in read_outputs(out / "p.jsonl")]


async def _run(
    plan: Plan,
    out: Path,
    sim: SimulatorServer,
    every: int,
    only: Mapping[str, Collection[str]] | None = None,
) -> RunSummary:
    runner = JobRunner(
        plan,
        out,
        base_url=sim.url,
        api_key=DEFAULT_TEST_KEY,
        verify=True,
        verify_every=every,
        only=only,
    )
    return await runner.run()


def _charged(sim: SimulatorServer) -> Decimal:
    return sum((r.cost for r in sim.requests), Decimal(0))


JOB_MAX_TOKENS = 200
"""``small_plan``'s cap: a job's request carries it, a check's canaries their own."""


def _canary_groups(sim: SimulatorServer, tag: str, size: int) -> list[list[bool]]:
    """Per check that measured ``tag``, in order: whether each canary was degraded
    (checks never overlap, and each pins ``size`` requests to it). The job's own
    requests go to one admitted endpoint too (``only: [tag]``): its cap tells them
    apart."""
    pinned = [
        r.degraded
        for r in sim.requests
        if r.route == "chat"
        and r.tag == tag
        and (r.routing or {}).get("only") == [tag]
        and r.max_tokens != JOB_MAX_TOKENS
    ]
    return [pinned[i : i + size] for i in range(0, len(pinned), size)]


async def test_a_provider_turning_degraded_mid_run_is_excluded_and_its_rows_since_the_pass_flagged(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    # Chutes (the cheapest, so it serves the job) answers honestly to its first
    # canaries, the first re-check's (at 40 rows) and 30 % of the job's 200 prompts,
    # then degraded.
    sim, canaries = await chutes_turning(tmp_path, openrouter_sim_factory, checks=2, rows=60)
    out = tmp_path / "out"
    summary = await _run(small_plan(tmp_path, requests=None, prompts=200), out, sim, every=40)
    assert summary.reason is StopReason.COMPLETE

    history = DriftHistory.load(out / "verify.json")
    assert list(history.failed) == ["chutes"]
    failed_at = history.failed["chutes"]
    last_pass = history.last_pass["chutes"]
    assert 0 <= last_pass < failed_at
    # Excluded within the next check: no check whose canaries were all degraded passed it.
    measured = [c for c in history.checks if "chutes" in c.endpoints]
    groups = _canary_groups(sim, "chutes", canaries)
    assert len(groups) == len(measured)
    assert all(check.seq >= failed_at for check, g in zip(measured, groups, strict=True) if all(g))
    assert measured[-1].seq == failed_at  # never measured again: excluded
    assert measured[-2].seq == last_pass  # caught by the check after its last pass

    rows = _rows(out)
    # Exactly once: every prompt, each once.
    assert sorted(r["id"] for r in rows) == sorted(f"q{n}" for n in range(200))
    chutes = [r for r in rows if r["provider"] == "Chutes"]
    flagged = {r["id"] for r in rows if r["drift_flagged"]}
    since_pass = {r["id"] for r in chutes if r["drift_check"] >= last_pass}
    assert flagged == since_pass
    assert flagged
    assert len(flagged) < len(chutes)  # the rows before the pass are kept clean
    # Every row Chutes really served degraded is among them.
    degraded = {r.generation_id for r in sim.requests if r.route == "chat" and r.degraded}
    by_generation = {r["generation_id"]: r["id"] for r in rows}
    degraded_rows = {by_generation[g] for g in degraded if g in by_generation}
    assert degraded_rows
    assert degraded_rows <= flagged
    # From the next check on, Chutes served nothing of the job.
    assert all(r["provider"] != "Chutes" for r in rows if r["drift_check"] > failed_at)
    # The checks were paid from the job's budget: the ledger holds every charge.
    assert summary.spent == _charged(sim)
    assert summary.spent <= summary.budget
    assert history.cost > history.checks[0].cost > 0
    written = json.loads((out / "summary.json").read_text())["verification"]
    assert written["flagged_rows"] == len(flagged)
    assert written["excluded"]["chutes"]["check"] == failed_at
    assert written["checks"] == len(history.checks) > 2


async def test_with_no_provider_degraded_no_row_is_flagged(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=3)
    out = tmp_path / "out"
    summary = await _run(small_plan(tmp_path, requests=None, prompts=100), out, sim, every=20)
    assert summary.reason is StopReason.COMPLETE
    history = DriftHistory.load(out / "verify.json")
    assert history.failed == {}
    assert len(history.checks) >= 5  # before the run, then every 20 rows
    assert all(not c.failed for c in history.checks)
    rows = _rows(out)
    assert len(rows) == 100
    assert not [r for r in rows if r["drift_flagged"]]
    assert summary.verification is not None
    assert summary.verification["flagged_rows"] == 0
    assert summary.spent == _charged(sim)


async def test_a_resumed_run_judges_the_rows_left_unchecked_and_keeps_the_exclusion(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    # Run 1 checks only before it (verify_every 0) and sends 60 prompts: Chutes turns
    # degraded after 30 of them, unseen. Run 2's first check fails it: every row it
    # served since its pass (run 1's check) is flagged. Run 3 keeps it excluded.
    sim, canaries = await chutes_turning(tmp_path, openrouter_sim_factory, checks=1, rows=30)
    out = tmp_path / "out"
    plan = small_plan(tmp_path, requests=None, prompts=100)
    ids = [f"q{n}" for n in range(100)]
    first = await _run(plan, out, sim, every=0, only={"p": ids[:60]})
    assert first.reason is StopReason.COMPLETE
    run1 = _rows(out)
    run1_ids = {r["id"] for r in run1}
    assert not [r for r in run1 if r["drift_flagged"]]
    run1_chutes = {r["id"] for r in run1 if r["provider"] == "Chutes"}
    degraded = {r.generation_id for r in sim.requests if r.route == "chat" and r.degraded}
    degraded_rows = {r["id"] for r in run1 if r["generation_id"] in degraded}
    assert degraded_rows
    assert degraded_rows <= run1_chutes
    assert len(run1_chutes) > 30

    second = await _run(plan, out, sim, every=20, only={"p": ids[:80]})
    assert second.reason is StopReason.COMPLETE
    history = DriftHistory.load(out / "verify.json")
    assert history.failed == {"chutes": 1}  # the second run's first check
    assert history.checks[1].flagged == len(run1_chutes)
    rows = _rows(out)
    assert {r["id"] for r in rows if r["drift_flagged"]} == run1_chutes
    assert all(r["provider"] != "Chutes" for r in rows if r["id"] not in run1_ids)

    pinned = len(_canary_groups(sim, "chutes", canaries))
    third = await _run(plan, out, sim, every=20)
    assert third.reason is StopReason.COMPLETE
    assert len(_canary_groups(sim, "chutes", canaries)) == pinned  # not measured again
    rows = _rows(out)
    assert sorted(r["id"] for r in rows) == sorted(ids)  # each once over three runs
    assert {r["id"] for r in rows if r["drift_flagged"]} == run1_chutes  # the flags kept
    later = [r for r in rows if r["id"] not in run1_ids]
    assert len(later) == 40
    assert all(r["provider"] != "Chutes" for r in later)
    assert DriftHistory.load(out / "verify.json").failed == {"chutes": 1}
    assert third.verification is not None
    assert third.verification["flagged_rows"] == len(run1_chutes)
    assert third.spent == _charged(sim)


async def test_the_command_line_says_what_was_excluded_and_flagged_and_export_leaves_it_out(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    _, out, argv = await turning_cli_job(tmp_path, openrouter_sim_factory, prompts=80)
    code, _, err = await run_cli(*argv, "--verify", "--verify-every", "20")
    assert code == 0, err[-2000:]
    history = DriftHistory.load(out / "verify.json")
    flagged = history.flagged
    assert flagged > 0
    assert f"Excluded Chutes (chutes) at check {history.failed['chutes']}: greedy agreement" in err
    assert f"{flagged:,} rows are flagged: served by a provider since its last passing" in err
    assert "1 provider failed verification against the model's reference" in err
    text = io.StringIO()
    report = export_conversations([out / "p.jsonl"], text, finish_reasons=None)
    assert report.skipped.get("drift_flagged") == flagged
    assert report.written + flagged == 80
    kept = export_conversations([out / "p.jsonl"], io.StringIO(), finish_reasons=None, flagged=True)
    assert kept.written == 80


async def test_the_checks_are_paid_within_the_budget_and_a_run_out_of_it_stops_cleanly(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    # $0.05: the check before the run (~$0.02), checks every 10 rows (~$0.005 each) and
    # the rows themselves use it up before the 100 prompts are done.
    sim = await openrouter_sim_factory(seed=3)
    out = tmp_path / "out"
    plan = small_plan(tmp_path, requests=None, prompts=100).model_copy(
        update={"budget": Decimal("0.05")}
    )
    summary = await _run(plan, out, sim, every=10)
    assert summary.reason is StopReason.BUDGET
    history = DriftHistory.load(out / "verify.json")
    assert len(history.checks) > 2
    assert summary.spent == _charged(sim)
    assert summary.spent <= Decimal("0.05")
    assert summary.reserved == 0
    rows = _rows(out)
    assert len({r["id"] for r in rows}) == len(rows) < 100
    assert not [r for r in rows if r["drift_flagged"]]


async def _failed_mid_run(
    tmp_path: Path, factory: Factory, *, sent: int
) -> tuple[SimulatorServer, Plan, Path, set[str]]:
    """A job of 60 prompts whose first ``sent`` ran with Chutes turning degraded after
    20 of them (checks every 10 rows): the job directory and the ids flagged."""
    sim, _ = await chutes_turning(tmp_path, factory, checks=2, rows=20)
    out = tmp_path / "out"
    plan = small_plan(tmp_path, requests=None, prompts=60)
    only = {"p": [f"q{n}" for n in range(sent)]}
    assert (await _run(plan, out, sim, every=10, only=only)).reason is StopReason.COMPLETE
    assert DriftHistory.load(out / "verify.json").failed.keys() == {"chutes"}
    flagged = {r["id"] for r in _rows(out) if r["drift_flagged"]}
    assert flagged
    return sim, plan, out, flagged


async def test_a_resume_without_verify_keeps_the_exclusion(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim, plan, out, flagged = await _failed_mid_run(tmp_path, openrouter_sim_factory, sent=40)
    before = {r["id"] for r in _rows(out)}
    summary = await JobRunner(plan, out, base_url=sim.url, api_key=DEFAULT_TEST_KEY).run()
    assert summary.reason is StopReason.COMPLETE
    assert any(note.startswith("kept excluded: chutes") for note in summary.recovered)
    rows = _rows(out)
    later = [r for r in rows if r["id"] not in before]
    assert len(later) == 20
    assert all(r["provider"] != "Chutes" for r in later)
    assert {r["id"] for r in rows if r.get("drift_flagged")} == flagged
    assert summary.spent == _charged(sim)


def _cut_short_flagging(out: Path, flagged: set[str]) -> None:
    """The job as a kill between the failing check's record and the end of its flagging
    leaves it: the rows on disk not flagged yet, the check's ``flagged`` not recorded."""
    path = out / "p.jsonl"
    # (Rows in flight when the check failed were written flagged: they stay so.)
    path.write_bytes(
        path.read_bytes().replace(b'"drift_flagged":true }', b'"drift_flagged":false}')
    )
    written_flagged = {r["id"] for r in _rows(out) if r["drift_flagged"]}
    assert written_flagged < flagged
    data = json.loads((out / "verify.json").read_text())
    failing = next(c for c in data["drift"]["checks"] if c["failed"])
    failing["flagged"] = None
    (out / "verify.json").write_text(json.dumps(data))


@pytest.mark.parametrize("verify", [True, False])
async def test_a_flagging_a_kill_interrupted_is_done_again_on_resume(
    tmp_path: Path, openrouter_sim_factory: Factory, verify: bool
) -> None:
    # With --verify or without it: the flagging needs no check, only the history.
    sim, plan, out, flagged = await _failed_mid_run(tmp_path, openrouter_sim_factory, sent=40)
    _cut_short_flagging(out, flagged)
    if verify:
        summary = await _run(plan, out, sim, every=10)
    else:
        summary = await JobRunner(plan, out, base_url=sim.url, api_key=DEFAULT_TEST_KEY).run()
    assert summary.reason is StopReason.COMPLETE
    # (A row written without --verify has no flag: nothing checked it.)
    assert {r["id"] for r in _rows(out) if r.get("drift_flagged")} == flagged
    history = DriftHistory.load(out / "verify.json")
    assert next(c for c in history.checks if c.failed).flagged == len(flagged)
    assert history.flagged == len(flagged)
    assert any(
        note.startswith(f"flagged the rows of check {history.failed['chutes']} again")
        for note in summary.recovered
    )


async def test_a_damaged_verify_json_is_refused_before_anything_is_written(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=3)
    out = tmp_path / "out"
    out.mkdir()
    (out / "verify.json").write_text('{"drift": ')
    plan = small_plan(tmp_path)
    for verify in (True, False):
        runner = JobRunner(plan, out, base_url=sim.url, api_key=DEFAULT_TEST_KEY, verify=verify)
        with pytest.raises(pr.ConfigurationError, match=r"verify\.json is not a verification"):
            await runner.run()
    assert sorted(p.name for p in out.iterdir()) == ["verify.json"]
    assert not [r for r in sim.requests if r.route == "chat"]


@pytest.mark.slow
async def test_sigkill_during_drift_checks_then_resume_keeps_once_and_the_flags(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    # `run --verify --verify-every 10` as a process, killed after a seeded number of
    # further rows (a kill may land in a check or in its flagging), then resumed.
    sim, out, argv = await turning_cli_job(tmp_path, openrouter_sim_factory, prompts=60, speed=400)
    argv += ["--verify", "--verify-every", "10"]
    rng = random.Random(26)
    kills = 0
    for _ in range(4):
        proc = await spawn_cli(*argv)
        target = _written(out) + rng.randint(3, 12)
        await until(partial(_reached, out, target, proc))
        if proc.returncode is None:
            proc.kill()
            kills += 1
        await proc.wait()
    assert kills >= 3
    code, _, err = await run_cli(*argv)
    assert code == 0, err[-2000:]
    records = assert_consistent(out, ["p"])
    assert sorted(r["id"] for r in records) == sorted(f"q{n}" for n in range(60))
    history = DriftHistory.load(out / "verify.json")
    assert history.failed.keys() == {"chutes"}
    last_pass = history.last_pass["chutes"]
    chutes = [r for r in records if r["provider"] == "Chutes"]
    flagged = {r["id"] for r in records if r["drift_flagged"]}
    assert flagged == {r["id"] for r in chutes if r["drift_check"] >= last_pass}
    degraded = {r.generation_id for r in sim.requests if r.route == "chat" and r.degraded}
    assert {r["id"] for r in records if r["generation_id"] in degraded} <= flagged
    assert all(c.flagged is not None for c in history.checks)
    spent = ledger_spent(out)
    worst = sum(
        (from_units(r["units"]) for r in ledger_rows(out) if r["state"] == "recovered"),
        Decimal(0),
    )
    assert sim.simulator.usage <= spent <= sim.simulator.usage + worst


def _reached(out: Path, target: int, proc: Any) -> bool:
    """``target`` rows written, or the process ended."""
    return _written(out) >= target or proc.returncode is not None


def _written(out: Path) -> int:
    path = out / "p.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


async def test_when_the_only_allowed_provider_fails_the_run_stops_with_its_rows_flagged(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim, _ = await chutes_turning(tmp_path, openrouter_sim_factory, checks=2, rows=20)
    out = tmp_path / "out"
    plan = small_plan(tmp_path, requests=None, prompts=100)
    plan = plan.model_copy(update={"policy": {"exclude_below": "int4", "only": ["chutes"]}})
    summary = await _run(plan, out, sim, every=10)
    assert summary.reason is StopReason.ERROR
    assert "chutes failed verification and could not be excluded" in summary.message
    history = DriftHistory.load(out / "verify.json")
    last_pass = history.last_pass["chutes"]
    rows = _rows(out)
    assert len(rows) < 100
    assert {r["provider"] for r in rows} == {"Chutes"}
    flagged = {r["id"] for r in rows if r["drift_flagged"]}
    assert flagged == {r["id"] for r in rows if r["drift_check"] >= last_pass}
    assert summary.spent == _charged(sim)
    # A resume sends nothing more: no allowed endpoint is left, and it says so.
    with pytest.raises(pr.ProviderRouterError):
        await _run(plan, out, sim, every=10)
    assert len(_rows(out)) == len(rows)


async def test_a_lost_verify_json_is_refused_while_the_journal_remembers_an_exclusion(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim, plan, out, _ = await _failed_mid_run(tmp_path, openrouter_sim_factory, sent=40)
    kept = (out / "verify.json").read_bytes()
    (out / "verify.json").unlink()
    journal = (out / "journal.jsonl").read_bytes()
    sent = len(sim.requests)
    for verify in (True, False):
        runner = JobRunner(plan, out, base_url=sim.url, api_key=DEFAULT_TEST_KEY, verify=verify)
        with pytest.raises(pr.ConfigurationError, match=r"does not list chutes, which failed"):
            await runner.run()
    assert (out / "journal.jsonl").read_bytes() == journal  # nothing written
    assert len(sim.requests) == sent  # nothing sent
    (out / "verify.json").write_bytes(kept)  # restored: the job goes on, Chutes excluded
    summary = await JobRunner(plan, out, base_url=sim.url, api_key=DEFAULT_TEST_KEY).run()
    assert summary.reason is StopReason.COMPLETE
    assert len(_rows(out)) == 60


async def test_an_older_ledger_that_forgot_a_check_is_refused(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    # Run 1 sends 10 prompts without --verify; run 2 sends nothing new but checks the
    # providers (paid from the job's ledger). The ledger as it was after run 1 (what a
    # lost -wal can leave) forgot the check: refused, not a budget larger by its cost.
    sim = await openrouter_sim_factory(seed=3)
    out = tmp_path / "out"
    plan = small_plan(tmp_path, requests=None, prompts=20)
    only = {"p": [f"q{n}" for n in range(10)]}
    first = JobRunner(plan, out, base_url=sim.url, api_key=DEFAULT_TEST_KEY, only=only)
    assert (await first.run()).reason is StopReason.COMPLETE
    old = tmp_path / "old.sqlite"
    shutil.copy(out / "ledger.sqlite", old)
    second = await _run(plan, out, sim, every=10, only=only)
    assert second.reason is StopReason.COMPLETE
    checks = DriftHistory.load(out / "verify.json").checks
    assert [c.trigger for c in checks] == ["start"]
    assert second.spent == _charged(sim)
    assert checks[0].cost > 0
    for path in out.glob("ledger.sqlite*"):
        path.unlink()
    shutil.copy(old, out / "ledger.sqlite")
    sent = len(sim.requests)
    for verify in (True, False):
        runner = JobRunner(plan, out, base_url=sim.url, api_key=DEFAULT_TEST_KEY, verify=verify)
        with pytest.raises(pr.DataFileError, match=r"less than the .* verification checks"):
            await runner.run()
    assert len(sim.requests) == sent  # refused before anything was sent


def _chutes_twice(directory: Path, serves: dict[str, float] | None = None) -> Path:
    """The default market with Chutes serving from two endpoints (``chutes/int4`` and a
    ``chutes/fp8`` copy of it), both serving ``serves`` when given."""
    directory.mkdir(exist_ok=True)

    def retag(endpoint: dict[str, Any]) -> None:
        if endpoint["slug"] == "chutes":
            endpoint["tag"] = "chutes/int4"
            if serves is not None:
                endpoint["serves"] = serves

    path = edited_market(directory, retag)
    data = yaml.safe_load(path.read_text())
    for model in data["models"]:
        if model["id"] == "moonshotai/kimi-k2.5":
            chutes = next(e for e in model["endpoints"] if e["slug"] == "chutes")
            model["endpoints"].append({**chutes, "tag": "chutes/fp8", "quantization": "fp8"})
    path.write_text(yaml.safe_dump(data))
    return path


async def test_a_flagging_done_again_flags_from_the_earliest_pass_of_a_providers_endpoints(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    # Chutes serves from two endpoints. Run 1 checks every 10 rows, both pass; then the
    # history as a check that could not tell chutes/fp8 leaves it: its last pass is the
    # first check, chutes/int4's a later one. Run 2's first check fails both (Chutes
    # turned degraded): the rows since the earlier pass are flagged, and a kill cuts
    # that flagging short. Run 3 (a plain resume) flags them again: the same rows.
    honest = await openrouter_sim_factory(market=_chutes_twice(tmp_path / "honest"), seed=3)
    out = tmp_path / "out"
    plan = small_plan(tmp_path, requests=None, prompts=40)
    only = {"p": [f"q{n}" for n in range(30)]}
    assert (await _run(plan, out, honest, every=10, only=only)).reason is StopReason.COMPLETE
    data = json.loads((out / "verify.json").read_text())
    last = data["drift"]["last_pass"]
    assert last["chutes/fp8"] == last["chutes/int4"] > 0
    last["chutes/fp8"] = 0
    (out / "verify.json").write_text(json.dumps(data))
    chutes = {r["id"]: r["drift_check"] for r in _rows(out) if r["provider"] == "Chutes"}
    later = {pid for pid, check in chutes.items() if check >= last["chutes/int4"]}
    assert later < set(chutes)  # rows Chutes served between the two passes

    degraded = _chutes_twice(tmp_path / "degraded", {"agreement": 0.6})
    sim = await openrouter_sim_factory(market=degraded, seed=3)
    assert (await _run(plan, out, sim, every=10, only=only)).reason is StopReason.COMPLETE
    history = DriftHistory.load(out / "verify.json")
    assert history.failed.keys() == {"chutes/fp8", "chutes/int4"}
    flagged = {r["id"] for r in _rows(out) if r["drift_flagged"]}
    assert flagged == set(chutes)  # the check itself: from the earlier pass

    _cut_short_flagging(out, flagged)
    runner = JobRunner(plan, out, base_url=sim.url, api_key=DEFAULT_TEST_KEY, only=only)
    assert (await runner.run()).reason is StopReason.COMPLETE
    assert {r["id"] for r in _rows(out) if r.get("drift_flagged")} == flagged
    assert DriftHistory.load(out / "verify.json").flagged == len(flagged)
