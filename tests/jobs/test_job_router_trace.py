"""What a job asks of OpenRouter besides the route, and keeps of the answer's trace:
router metadata on every request (attempts and pipeline in each row, the report and the
summary), context compression turned off (compressed rows flagged and counted when it is
allowed), distillable models only by default (docs/batch.md, docs/output.md)."""

from __future__ import annotations

import io
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from _job_helpers import assert_consistent, read_records, runner, small_plan, write_prompts

from provider_router.jobs.observe.report import load_run, render_report, write_report
from provider_router.jobs.observe.standard import standard_observers
from provider_router.jobs.observe.status import status_lines
from provider_router.jobs.runner import JobRunner
from provider_router.jobs.store.outputs import export_conversations
from provider_router.jobs.summary import StopReason
from provider_router.planning.plan import Plan
from provider_router.testing import DEFAULT_TEST_KEY, Market, SimulatorServer

Factory = Callable[..., Awaitable[SimulatorServer]]


async def test_every_request_asks_for_the_trace_compression_off_and_distillable_text(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(
        seed=2, faults=[{"kind": "provider_error", "provider": "chutes", "times": 2}]
    )
    summary = await runner(small_plan(tmp_path), tmp_path / "out", sim).run()
    assert summary.reason is StopReason.COMPLETE
    chats = sim.simulator.log.chat()
    assert chats
    for record in chats:
        assert record.routing["enforce_distillable_text"] is True
    records = assert_consistent(tmp_path / "out", ["p"])
    assert len(records) == 6
    for row in records:
        trace = row["router_metadata"]
        assert trace["attempts"][-1] == {
            "provider": row["provider"],
            "model": "moonshotai/kimi-k2.5",
            "status": 200,
        }
        assert trace["attempt"] == len(trace["attempts"])
        assert trace["pipeline"] == []
        assert "context_compressed" not in row
    fallbacks = sum(len(r["router_metadata"]["attempts"]) - 1 for r in records)
    data = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert data["openrouter"] == {
        "router_metadata": True,
        "context_compression": "off",
        "enforce_distillable_text": True,
    }
    this_run = data["datasets"]["p"]["this_run"]
    assert this_run["openrouter_fallbacks"] == fallbacks
    assert this_run["context_compressed"] == 0


async def test_the_plugin_that_turns_compression_off_is_in_every_body(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    """The simulator's record keeps the ``provider`` object only: the body's
    ``plugins`` are seen through a small endpoint, which compresses unless told not to."""
    market = _small_market(tmp_path)
    sim = await openrouter_sim_factory(market=market, seed=1)
    plan = _long_plan(tmp_path, compression=False)
    summary = await runner(plan, tmp_path / "off", sim).run()
    # Compression off: a prompt too long for the only endpoint is a 400, never a cut.
    assert summary.reason is not StopReason.COMPLETE
    assert not any(r.compressed for r in sim.simulator.log.chat())
    assert read_records(tmp_path / "off" / "long.jsonl") == []
    short = [r for r in read_records(tmp_path / "off" / "short.jsonl")]
    assert len(short) == 2
    assert all("context_compressed" not in r for r in short)


def _small_market(tmp_path: Path) -> Market:
    path = tmp_path / "market.yaml"
    path.write_text(
        "models:\n  - id: a/small\n    endpoints:\n"
        "      - provider: Tiny\n        pricing: {prompt: 1, completion: 2}\n"
        "        context_length: 8192\n        supported_parameters: [max_tokens]\n"
    )
    return Market.from_file(path)


def _long_plan(tmp_path: Path, *, compression: bool) -> Plan:
    text = " ".join(["word"] * 400)
    turns: list[dict[str, Any]] = []
    for i in range(20):
        turns += [
            {"role": "user", "content": f"{i}: {text}"},
            {"role": "assistant", "content": f"{i}: {text}"},
        ]
    long = tmp_path / "long.jsonl"
    long.write_text(
        "".join(
            json.dumps({"id": f"l{n}", "messages": [*turns, {"role": "user", "content": f"{n}?"}]})
            + "\n"
            for n in range(3)
        )
    )
    short = write_prompts(tmp_path / "short.jsonl", 2)
    return Plan.model_validate(
        {
            "model": "a/small",
            "budget": "10",
            "concurrency": 2,
            "generation": {"max_tokens": 100},
            "context_compression": compression,
            "datasets": [
                {"name": "long", "input": str(long)},
                {"name": "short", "input": str(short)},
            ],
        }
    )


async def test_compressed_rows_are_flagged_counted_reported_and_left_out_of_exports(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(market=_small_market(tmp_path), seed=1)
    out = tmp_path / "out"
    plan = _long_plan(tmp_path, compression=True)
    job = JobRunner(
        plan, out, base_url=sim.url, api_key=DEFAULT_TEST_KEY, observers=standard_observers()
    )
    summary = await job.run()
    assert summary.reason is StopReason.COMPLETE
    long = read_records(out / "long.jsonl")
    assert len(long) == 3
    for row in long:
        assert row["context_compressed"] is True
        (stage,) = row["router_metadata"]["pipeline"]
        assert stage["type"] == "context_compression"
        assert stage["data"]["original_count"] == len(row["messages"]) - 1
        assert len(row["messages"]) == 42, "the record keeps the prompt as it was sent"
    assert all("context_compressed" not in r for r in read_records(out / "short.jsonl"))
    data = json.loads((out / "summary.json").read_text())
    assert data["datasets"]["long"]["this_run"]["context_compressed"] == 3
    assert data["datasets"]["short"]["this_run"]["context_compressed"] == 0
    assert data["providers"]["Tiny"]["context_compressed"] == 3
    assert data["openrouter"]["context_compression"] == "allowed"
    assert data["openrouter"]["enforce_distillable_text"] is True

    lines = status_lines(out, now=0)
    assert any("context compression cut 3 prompts" in line for line in lines), lines
    assert any("asked of OpenRouter: routing trace on" in line for line in lines), lines
    page = render_report(load_run(out))
    assert "<h2>OpenRouter's routing trace</h2>" in page
    assert "context compression allowed" in page
    assert "long/l0" in page
    assert write_report(out).exists()

    sink = io.StringIO()
    everything = [out / "long.jsonl", out / "short.jsonl"]
    report = export_conversations(everything, sink, finish_reasons=None)
    assert report.written == 2
    assert report.skipped == {"context_compressed": 3}
    kept = export_conversations(
        [out / "long.jsonl"], io.StringIO(), finish_reasons=None, flagged=True
    )
    assert kept.written == 3


async def test_distillable_text_can_be_turned_off_and_the_summary_says_so(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=4)
    plan = small_plan(tmp_path, requests=2).with_overrides(distillable_text=False)
    await runner(plan, tmp_path / "out", sim).run()
    assert all("enforce_distillable_text" not in r.routing for r in sim.simulator.log.chat())
    data = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert data["openrouter"]["enforce_distillable_text"] is False


async def test_a_model_whose_author_forbids_distillation_sends_nothing_paid(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    path = tmp_path / "market.yaml"
    path.write_text(
        "models:\n  - id: a/closed\n    distillable: false\n    endpoints:\n"
        "      - provider: Shut\n        pricing: {prompt: 1, completion: 2}\n"
    )
    sim = await openrouter_sim_factory(market=Market.from_file(path))
    prompts = write_prompts(tmp_path / "p.jsonl", 3)
    plan = Plan.model_validate(
        {"model": "a/closed", "budget": "1", "datasets": [{"name": "p", "input": str(prompts)}]}
    )
    summary = await runner(plan, tmp_path / "out", sim).run()
    assert summary.reason is not StopReason.COMPLETE
    assert sim.simulator.usage == 0
    assert read_records(tmp_path / "out" / "p.jsonl") == []
    assert summary.datasets[0].run.failures_by_kind == {"NotFoundError": 3}


def test_the_run_command_opts_out_of_distillable_text_for_one_file_or_a_plan(
    tmp_path: Path,
) -> None:
    from provider_router.cli import build_parser
    from provider_router.cli.run import plan_from_args

    prompts = write_prompts(tmp_path / "p.jsonl", 1)
    base = ["run", str(prompts), "--out", "o", "--model", "a/b", "--budget", "1"]
    assert plan_from_args(build_parser().parse_args(base)).distillable_text is True
    off = build_parser().parse_args([*base, "--no-distillable-text"])
    assert plan_from_args(off).distillable_text is False
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(
        "model: a/b\nbudget: 1\ndistillable_text: false\ncontext_compression: true\n"
        f"datasets: [{{name: p, input: {prompts}}}]\n"
    )
    plan = plan_from_args(
        build_parser().parse_args(["run", "--plan", str(plan_file), "--out", "o"])
    )
    assert (plan.distillable_text, plan.context_compression) == (False, True)
