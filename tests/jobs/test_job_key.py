"""``run --job-key``: each run makes its own key, limited to what the budget has left,
sends with it, and disables it when it ends; the key is in no file of the job."""

from __future__ import annotations

import json
import pickle
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path

import pytest
from _job_helpers import assert_consistent, ledger_spent, run_cli, write_prompts

from provider_router import JobRefused, PermissionDeniedError
from provider_router._constants import ENV_API_KEY, ENV_MANAGEMENT_KEY
from provider_router.jobs.job_key import JobKeyLease
from provider_router.jobs.run import run_plan
from provider_router.jobs.store.job_keys import KeyRecords
from provider_router.jobs.summary import StopReason
from provider_router.planning.plan import Plan
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer
from provider_router.testing.billing import KeyState, key_hash

MODEL = "moonshotai/kimi-k2.5"
MANAGEMENT = "sk-or-v1-job-key-management-key"
Factory = Callable[..., Awaitable[SimulatorServer]]


@pytest.fixture(autouse=True)
def _management_key_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A management key in the environment and no API key: every request must go with
    the key the run makes."""
    monkeypatch.setenv(ENV_MANAGEMENT_KEY, MANAGEMENT)
    monkeypatch.delenv(ENV_API_KEY, raising=False)


def plan_of(tmp_path: Path, *, budget: str = "5", max_requests: int | None = None) -> Plan:
    path = write_prompts(tmp_path / "p.jsonl", 24)
    return Plan.model_validate(
        {
            "model": MODEL,
            "budget": budget,
            "concurrency": 4,
            "policy": {"exclude_below": "int4"},
            "generation": {"max_tokens": 300},
            "datasets": [{"name": "p", "input": str(path), "max_requests": max_requests}],
        }
    )


def made_keys(sim: SimulatorServer) -> dict[str, KeyState]:
    """The keys the management API made (the simulator knows their plaintext)."""
    account = sim.simulator.account
    return {token: state for token, state in account.keys.items() if state.name.startswith("pro")}


def files_holding(root: Path, needle: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


async def test_each_run_makes_its_own_key_sends_with_it_and_disables_it(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=2, management_keys=[MANAGEMENT])
    out = tmp_path / "out"
    first = await run_plan(plan_of(tmp_path, max_requests=10), out, base_url=sim.url, job_key=True)
    assert first.reason is StopReason.COMPLETE
    ((token, state),) = made_keys(sim).items()
    assert state.disabled
    assert state.limit is not None
    assert Decimal(state.limit) / 10**12 == Decimal(5)  # a new job: the whole budget
    assert state.expires_at is not None
    chats = [r for r in sim.requests if r.route == "chat"]
    assert chats
    assert {r.key_label for r in chats} == {state.label}  # every request, preflight too
    (record,) = KeyRecords(out / "job_keys.json").read()
    assert record.hash == key_hash(token) == state.hash
    assert record.limit_usd == "5"
    assert record.disabled_at is not None
    assert files_holding(out, token) == []
    spent = ledger_spent(out)

    # The resume: a new key (the last one's plaintext is gone), limited to what is left.
    second = await run_plan(plan_of(tmp_path), out, base_url=sim.url, job_key=True)
    assert second.reason is StopReason.COMPLETE
    keys = made_keys(sim)
    assert len(keys) == 2
    (new_token, new_state) = next((t, s) for t, s in keys.items() if t != token)
    left = (Decimal(5) - spent).quantize(Decimal("0.01"), rounding="ROUND_DOWN")
    assert new_state.limit is not None
    assert Decimal(new_state.limit) / 10**12 == left
    assert new_state.disabled
    assert [r.disabled_at is not None for r in KeyRecords(out / "job_keys.json")] == [True, True]
    assert files_holding(out, new_token) == []
    assert len(assert_consistent(out, ["p"])) == 24
    assert ledger_spent(out) == sim.simulator.usage


async def test_a_key_a_killed_run_left_enabled_is_disabled_by_the_next(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(management_keys=[MANAGEMENT])
    out = tmp_path / "out"
    out.mkdir()
    killed = JobKeyLease(out, budget_left=Decimal(5), base_url=sim.url)
    left_behind = await killed.make()  # and never ended: the process died
    assert (
        await run_plan(plan_of(tmp_path, max_requests=2), out, base_url=sim.url, job_key=True)
    ).reason is StopReason.COMPLETE
    states = {s.hash: s for s in made_keys(sim).values()}
    assert states[left_behind.hash].disabled
    assert all(r.disabled_at for r in KeyRecords(out / "job_keys.json"))
    # Its requests never went with the old key.
    assert states[left_behind.hash].usage == 0


async def test_the_job_keys_limit_used_up_is_the_budgets_stop(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    # A budget of $0.015 makes a key limited to $0.01 (rounded down to the cent): the key
    # refuses before the ledger does, and the run stops as on its own budget.
    sim = await openrouter_sim_factory(seed=4, management_keys=[MANAGEMENT], key_limit_status=403)
    out = tmp_path / "out"
    outcome = await run_plan(
        plan_of(tmp_path, budget="0.015"), out, base_url=sim.url, job_key=True, preflight=False
    )
    assert outcome.reason is StopReason.BUDGET
    summary = outcome.summary
    assert summary is not None
    assert summary.spend_limit is None  # the budget's own hint, not "raise the key's limit"
    assert "the job key's limit" in summary.message
    assert any(r.status == 403 for r in sim.requests)
    assert all(d.run.failures == 0 for d in summary.datasets)
    assert_consistent(out, ["p"])


async def test_what_a_job_key_needs_is_checked_before_anything_is_sent(
    tmp_path: Path, openrouter_sim_factory: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = await openrouter_sim_factory(management_keys=[MANAGEMENT])
    plan = plan_of(tmp_path)
    with pytest.raises(JobRefused, match=r"--own-key .* --job-key"):
        await run_plan(plan, tmp_path / "a", base_url=sim.url, job_key=True, account_horizon=-1)
    batch = plan.model_copy(
        update={"datasets": (plan.datasets[0].model_copy(update={"route": "batch"}),)}
    )
    with pytest.raises(JobRefused, match="batch outlives the run"):
        await run_plan(batch, tmp_path / "b", base_url=sim.url, job_key=True)
    monkeypatch.delenv(ENV_MANAGEMENT_KEY)
    with pytest.raises(JobRefused, match=ENV_MANAGEMENT_KEY):
        await run_plan(plan, tmp_path / "c", base_url=sim.url, job_key=True)
    assert sim.requests == []
    # A key that is not a management key: refused by OpenRouter before any prompt.
    monkeypatch.setenv(ENV_MANAGEMENT_KEY, DEFAULT_TEST_KEY)
    with pytest.raises(PermissionDeniedError, match="Only management keys"):
        await run_plan(plan, tmp_path / "d", base_url=sim.url, job_key=True)
    assert [r for r in sim.requests if r.route == "chat"] == []


async def test_a_job_key_never_shows_itself(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(management_keys=[MANAGEMENT])
    lease = JobKeyLease(tmp_path, budget_left=Decimal("1.239"), base_url=sim.url)
    async with lease as key:
        secret = key.secret.get_secret_value()
        assert secret not in repr(key)
        assert secret not in repr(lease)
        assert key.limit == Decimal("1.23")
        with pytest.raises(TypeError, match="not pickled"):
            pickle.dumps(key)
    assert json.loads((tmp_path / "job_keys.json").read_text())["keys"][0]["disabled_at"]
    assert files_holding(tmp_path, secret) == []


async def test_the_command_runs_with_a_job_key(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(management_keys=[MANAGEMENT])
    prompts = write_prompts(tmp_path / "p.jsonl", 6)
    out = tmp_path / "out"
    argv = [
        "--log-level", "info", "run", str(prompts), "--out", str(out), "--model", MODEL,
        "--budget", "2", "--max-tokens", "200", "--base-url", sim.url, "--progress", "off",
        "--job-key", "--job-key-hours", "2",
    ]  # fmt: skip
    code, stdout, err = await run_cli(*argv, key=None)
    assert code == 0, err[-2000:]
    ((token, state),) = made_keys(sim).items()
    assert state.disabled
    assert token not in stdout + err  # not even at --log-level info
    assert files_holding(out, token) == []
    assert state.expires_at is not None
