"""A run that meets a spend limit OpenRouter keeps stops as a budget stop, and resumes.

The field's form of a key past its limit is a bare 403 ``Key limit exceeded``: the run
must stop with exit 3 and a resume line saying which cap and what lifts it, mark no
prompt failed, and a resume with a working key must finish each prompt exactly once.
Checked on the local OpenRouter (its ``key_limit_status=403``), through the command
line, and on a scripted raw server that answers 403 after exactly N requests.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path

from _job_helpers import assert_consistent, ledger_spent, read_records, run_cli, write_prompts
from _wire_server import Serve, answer, wire_fixture  # noqa: F401  (the wire fixture)

from provider_router.catalog.fetch import Catalog
from provider_router.cli._exit_codes import EXIT_CODES
from provider_router.jobs.runner import JobRunner
from provider_router.jobs.summary import StopReason
from provider_router.planning.plan import Plan
from provider_router.testing import SimulatorServer

MODEL = "moonshotai/kimi-k2.5"
CAPPED, WORKING = "sk-or-v1-capped-test-key", "sk-or-v1-working-test-key"
KEY_CAP = (
    b'{"error":{"message":"Key limit exceeded (total limit). Manage it using '
    b'https://openrouter.ai/settings/keys","code":403}}'
)
Factory = Callable[..., Awaitable[SimulatorServer]]


def plan_of(tmp_path: Path, *, prompts: int = 60, concurrency: int = 8) -> Plan:
    path = write_prompts(tmp_path / "p.jsonl", prompts)
    return Plan.model_validate(
        {
            "model": MODEL,
            "budget": "10",
            "concurrency": concurrency,
            "policy": {"exclude_below": "int4"},
            "generation": {"max_tokens": 600},
            "datasets": [{"name": "p", "input": str(path)}],
        }
    )


async def test_a_key_past_its_limit_is_a_budget_stop_and_a_working_key_finishes(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(
        seed=3, key_limit_status=403, api_keys={CAPPED: "0.03", WORKING: None}
    )
    out = tmp_path / "out"
    plan = plan_of(tmp_path)
    summary = await JobRunner(plan, out, base_url=sim.url, api_key=CAPPED).run()
    assert summary.reason is StopReason.BUDGET
    assert EXIT_CODES[summary.reason] == 3
    assert any(r.status == 403 for r in sim.requests)
    done = summary.datasets[0].completed
    assert 0 < done < 60
    assert summary.datasets[0].run.failures == 0  # refused for money is not failed
    assert summary.spend_limit is not None
    assert summary.spend_limit.kind == "key_limit"
    assert "raise the key's limit on https://openrouter.ai/settings/keys" in summary.message
    assert summary.message.endswith("then run the same command again to resume")
    assert summary.reserved == 0
    saved = json.loads((out / "summary.json").read_text())
    assert saved["reason"] == "budget_exhausted"
    assert saved["spend_limit"]["kind"] == "key_limit"
    assert saved["spend_limit"]["status"] == 403
    assert_consistent(out, ["p"])
    # Resumed with a key that works: every prompt once, the money everywhere the same.
    summary = await JobRunner(plan, out, base_url=sim.url, api_key=WORKING).run()
    assert summary.reason is StopReason.COMPLETE, summary.message
    assert summary.spend_limit is None
    records = assert_consistent(out, ["p"])
    assert sorted(r["id"] for r in records) == sorted(f"q{n}" for n in range(60))
    assert ledger_spent(out) == sim.simulator.usage


async def test_the_command_exits_3_naming_the_cap_and_resumes(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(
        seed=5, key_limit_status=403, api_keys={CAPPED: "0.03", WORKING: None}
    )
    prompts = write_prompts(tmp_path / "p.jsonl", 40)
    out = tmp_path / "out"
    argv = [
        "--log-level", "error", "run", str(prompts), "--out", str(out), "--model", MODEL,
        "--budget", "10", "--max-tokens", "600", "--concurrency", "8",
        "--exclude-below", "int4", "--base-url", sim.url, "--progress", "off",
    ]  # fmt: skip
    code, _, err = await run_cli(*argv, key=CAPPED)
    assert code == 3, err[-2000:]
    assert (
        "Stopped by the API key's limit (HTTP 403): raise the key's limit on "
        "https://openrouter.ai/settings/keys or use another key; then resume." in err
    )
    assert "To resume: provider-router --log-level error run" in err
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["reason"], summary["exit_code"]) == ("budget_exhausted", 3)
    assert summary["datasets"]["p"]["this_run"]["failures"] == 0
    code, _, err = await run_cli(*argv, key=WORKING)
    assert code == 0, err[-2000:]
    records = assert_consistent(out, ["p"])
    assert sorted(r["id"] for r in records) == sorted(f"q{n}" for n in range(40))


def served(n: int) -> bytes:
    """The n-th answer of the scripted server: its own generation id, a small cost."""
    body = {
        "id": f"gen-wire-{n}",
        "provider": "Chutes",
        "model": "moonshotai/kimi-k2.5-0127",
        "choices": [
            {"message": {"role": "assistant", "content": f"answer {n}"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "cost": 0.0001},
    }
    return answer(json.dumps(body).encode(), ("X-Generation-Id", f"gen-wire-{n}"))


async def test_a_raw_server_that_answers_403_after_n_requests(
    tmp_path: Path, wire: Serve, openrouter_sim: SimulatorServer
) -> None:
    async with Catalog(openrouter_sim.url) as catalog:
        listing = await catalog.endpoints(MODEL)
    plan = plan_of(tmp_path, prompts=12, concurrency=1)
    out = tmp_path / "out"
    n = 5
    capped = await wire(*([served(i)] for i in range(n)), [answer(KEY_CAP, status="403 Forbidden")])
    options = {"endpoints": listing}
    runner = JobRunner(
        plan, out, base_url=capped.url, api_key=CAPPED, stream=False, router_options=options
    )
    summary = await runner.run()
    assert summary.reason is StopReason.BUDGET
    assert EXIT_CODES[summary.reason] == 3
    assert len(capped.requests) == n + 1  # the refused one is not retried, nothing after it
    assert summary.datasets[0].completed == n
    assert summary.datasets[0].run.failures == 0
    assert summary.spend_limit is not None
    assert (summary.spend_limit.kind, summary.spend_limit.interval) == ("key_limit", "total")
    assert summary.spent == Decimal("0.0001") * n
    assert summary.reserved == 0
    # The resume against a working server sends each remaining prompt once.
    working = await wire(*([served(i)] for i in range(n, 12)))
    runner = JobRunner(
        plan, out, base_url=working.url, api_key=WORKING, stream=False, router_options=options
    )
    summary = await runner.run()
    assert summary.reason is StopReason.COMPLETE, summary.message
    assert len(working.requests) == 12 - n
    records = assert_consistent(out, ["p"])
    assert sorted(r["id"] for r in records) == sorted(f"q{i}" for i in range(12))
    assert len(read_records(out / "p.jsonl")) == 12
    assert summary.spent == Decimal("0.0001") * 12
