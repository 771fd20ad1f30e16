"""A plan's ``response_cache``: a job whose outputs file was lost gets its answers back
from OpenRouter's response cache for free, and repeated prompts (samples) still get
answers of their own."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path

from _job_helpers import ledger_spent, read_records

from provider_router.jobs.runner import JobRunner
from provider_router.jobs.summary import StopReason
from provider_router.planning.plan import Plan
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

Factory = Callable[..., Awaitable[SimulatorServer]]


def _plan(prompts: Path, response_cache: int | None) -> Plan:
    # One at a time: a sample sent with the same body as the one before would hit.
    return Plan.model_validate(
        {
            "model": "moonshotai/kimi-k2.5",
            "budget": "5",
            "concurrency": 1,
            "response_cache": response_cache,
            "policy": {"exclude_below": "int4"},
            "generation": {"max_tokens": 60},
            "datasets": [{"name": "d", "input": str(prompts)}],
        }
    )


async def test_a_lost_outputs_file_comes_back_free_and_samples_stay_apart(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(speed=1000, generation_404s=0)
    prompts = tmp_path / "p.jsonl"
    # Three samples of one prompt (no id: q, q-2, q-3) and two prompts of their own.
    lines = [{"prompt": "Write a haiku."}] * 3 + [
        {"id": f"x{n}", "prompt": f"n={n}"} for n in (1, 2)
    ]
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out"
    plan = _plan(prompts, 3600)

    summary = await JobRunner(plan, out, base_url=sim.url, api_key=DEFAULT_TEST_KEY).run()
    assert summary.reason is StopReason.COMPLETE
    first = {r["id"]: r for r in read_records(out / "d.jsonl")}
    assert len(first) == 5
    chats = sim.log.chat()
    assert [r.outcome for r in chats] == ["ok"] * 5  # three samples: three answers bought
    charged = sim.simulator.usage
    assert len({r["generation_id"] for r in first.values()}) == 5

    (out / "d.jsonl").unlink()  # the outputs file is lost
    summary = await JobRunner(plan, out, base_url=sim.url, api_key=DEFAULT_TEST_KEY).run()
    assert summary.reason is StopReason.COMPLETE
    again = {r["id"]: r for r in read_records(out / "d.jsonl")}
    assert again.keys() == first.keys()
    for key, record in again.items():
        assert record["messages"][-1] == first[key]["messages"][-1]  # the same answer
        assert record["cost"] == "0"
    assert [r.outcome for r in sim.log.chat()[5:]] == ["cache_hit"] * 5
    assert sim.simulator.usage == charged  # not paid twice
    assert ledger_spent(out) == charged


async def test_without_response_cache_a_lost_outputs_file_is_paid_again(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(speed=1000)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(json.dumps({"id": f"x{n}", "prompt": f"n={n}"}) + "\n" for n in range(3))
    )
    out = tmp_path / "out"
    plan = _plan(prompts, None)
    await JobRunner(plan, out, base_url=sim.url, api_key=DEFAULT_TEST_KEY).run()
    charged = sim.simulator.usage
    (out / "d.jsonl").unlink()
    await JobRunner(plan, out, base_url=sim.url, api_key=DEFAULT_TEST_KEY).run()
    assert sim.simulator.usage > charged
    assert all(r.outcome == "ok" for r in sim.log.chat())


def test_a_ray_run_refuses_the_response_cache_rather_than_ignore_it(tmp_path: Path) -> None:
    import pytest

    from provider_router import ConfigurationError
    from provider_router.ray.plan_run import _check_plan

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    plan = _plan(prompts, 600).with_overrides(ledger="redis://127.0.0.1:6379/0", ledger_name="j")
    with pytest.raises(ConfigurationError, match="not available with --ray"):
        _check_plan(plan)
    _check_plan(_plan(prompts, None).with_overrides(ledger="redis://x:1/0", ledger_name="j"))
