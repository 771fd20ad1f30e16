"""``run --verify``: the providers are measured before any prompt, and one that fails
serves nothing of the job, paid from the job's own budget."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path

import pytest
from _job_helpers import small_plan
from _markets import degraded_market

import provider_router as pr
from provider_router.cli import main
from provider_router.jobs import StopReason, read_outputs
from provider_router.jobs.runner import JobRunner
from provider_router.testing import SimulatorServer
from provider_router.testing.server import DEFAULT_TEST_KEY

Factory = Callable[..., Awaitable[SimulatorServer]]


async def test_a_provider_that_fails_verification_serves_nothing_of_the_job(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(
        market=degraded_market(tmp_path, {"chutes": {"agreement": 0.6}}), seed=3
    )
    plan = small_plan(tmp_path, requests=None, prompts=40)
    out = tmp_path / "out"
    runner = JobRunner(plan, out, base_url=sim.url, api_key=DEFAULT_TEST_KEY, verify=True)
    summary = await runner.run()
    assert summary.reason is StopReason.COMPLETE
    report = pr.VerificationReport.load(out / "verify.json")
    assert report.failed == ("chutes",)
    # Chutes, the cheapest allowed provider, served only its pinned canaries.
    served = [r for r in sim.requests if r.route == "chat" and r.tag == "chutes"]
    assert served
    assert all(r.routing["only"] == ["chutes"] for r in served)
    providers = {record["provider"] for _, record in read_outputs(out / "p.jsonl")}
    assert providers
    assert "Chutes" not in providers
    # The canaries were paid from the job's budget: the ledger holds every charge.
    charged = sum((r.cost for r in sim.requests), Decimal(0))
    assert summary.spent == charged
    assert report.cost > 0


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--verify", "--ray"], "--verify measures the providers of the sync route"),
        (["--verify-every", "20"], "--verify-every N re-checks the providers of a run with"),
    ],
)
def test_verify_is_refused_where_it_would_not_apply(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    said: str,
) -> None:
    monkeypatch.setenv("OPENROUTER_API_KEY", DEFAULT_TEST_KEY)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hi"}\n')
    argv = ["run", str(prompts), "--model", "moonshotai/kimi-k2.5", "--budget", "1"]
    argv += ["--out", str(tmp_path / "out"), *flags]
    assert main(argv) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
