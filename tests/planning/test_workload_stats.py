"""Workload statistics: confidence intervals, prompt-token estimates, pilots on the simulator."""

from __future__ import annotations

import json
import math
import statistics
from decimal import Decimal
from pathlib import Path

import pytest

from provider_router import ConfigurationError, DataFileError, ProviderPolicy, Router
from provider_router.planning.workload import SampleStats, _t_quantile, estimate_from_samples
from provider_router.planning.workload_stats import (
    approx_prompt_tokens,
    measure_prompts,
    run_pilot,
    sample_prompts,
)
from provider_router.testing.chat.synth import count_prompt_tokens
from provider_router.testing.server import SimulatorServer

MODEL = "moonshotai/kimi-k2.5"


@pytest.mark.parametrize(
    ("degrees", "exact"),
    [(5, 2.570582), (10, 2.228139), (30, 2.042272), (199, 1.971957)],
)
def test_the_t_quantile_is_close_to_the_table(degrees: int, exact: float) -> None:
    assert _t_quantile(0.975, degrees) == pytest.approx(exact, rel=2e-3)
    assert _t_quantile(0.975, degrees) > 1.959963  # always wider than the normal


def test_sample_stats_give_the_t_interval_of_the_mean() -> None:
    values = [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1100]
    stats = SampleStats.of(values)
    half = 2.228139 * statistics.stdev(values) / math.sqrt(11)
    assert stats.mean == 600
    assert stats.mean_low == pytest.approx(600 - half, rel=1e-3)
    assert stats.mean_high == pytest.approx(600 + half, rel=1e-3)
    assert (stats.minimum, stats.p50, stats.maximum) == (100, 600, 1100)
    assert stats.relative_half_width == pytest.approx(half / 600, rel=1e-3)


def test_a_wider_confidence_gives_a_wider_interval() -> None:
    values = [10, 12, 9, 14, 11, 13]
    narrow, wide = SampleStats.of(values, confidence=0.8), SampleStats.of(values, confidence=0.99)
    assert wide.mean_low < narrow.mean_low < narrow.mean_high < wide.mean_high


@pytest.mark.parametrize(
    ("values", "confidence", "message"),
    [
        ([5], 0.95, "at least 2 measured values"),
        ([5, -1], 0.95, "finite and ≥ 0"),
        ([5, float("nan")], 0.95, "finite and ≥ 0"),
        ([5, 6], 1.0, "between 0 and 1"),
    ],
)
def test_bad_samples_are_refused(values: list[float], confidence: float, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        SampleStats.of(values, confidence=confidence)


def test_an_estimate_from_samples_uses_the_ci_of_the_mean() -> None:
    estimate = estimate_from_samples(
        [100, 120, 140, 160],
        [1000, 1500, 2000, 2500],
        reasoning_tokens=[500, 500, 500, 500],
        cached_tokens=[0, 60, 0, 0],
    )
    stats = SampleStats.of([1000, 1500, 2000, 2500])
    assert estimate.prompt_tokens == Decimal(130)
    assert estimate.completion_tokens == Decimal(1750)
    assert estimate.low == Decimal(repr(stats.mean_low)).quantize(Decimal("0.01"))
    assert estimate.high == Decimal(repr(stats.mean_high)).quantize(Decimal("0.01"))
    assert estimate.reasoning_tokens == Decimal(500)
    assert estimate.cached_prompt_share == Decimal(60) / Decimal(520)
    assert "pilot of 4 requests" in estimate.source


def test_samples_of_different_lengths_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="one prompt, completion"):
        estimate_from_samples([1, 2, 3], [10, 20])
    with pytest.raises(ConfigurationError, match="0 output tokens"):
        estimate_from_samples([1, 2], [0, 0])


def test_the_prompt_approximation_and_a_real_tokenizer() -> None:
    messages = [
        {"role": "system", "content": "x" * 40},
        {"role": "user", "content": [{"type": "text", "text": "y" * 9}]},
    ]
    assert approx_prompt_tokens(messages) == 3 + (4 + 10) + (4 + 3)
    assert approx_prompt_tokens(messages, count_tokens=lambda s: len(s.split())) == 3 + 5 + 5


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_measure_prompts_streams_files_and_reports_bad_lines(tmp_path: Path) -> None:
    good = [json.dumps({"prompt": "a" * (4 * n)}) for n in range(1, 11)]
    path = write_jsonl(tmp_path / "p.jsonl", [*good[:5], "{not json", *good[5:]])
    stats = measure_prompts([path])
    assert stats.prompts == 10
    assert stats.method == "approximation"
    assert stats.mean_tokens == Decimal("12.50")  # 3 + 4 + mean(1..10)
    assert [(p.path, p.line) for p in stats.problems] == [(path, 6)]
    assert measure_prompts([path], limit=3).prompts == 3


def test_measure_prompts_without_a_usable_prompt_names_the_problem(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", ['{"text": "no prompt"}'])
    with pytest.raises(DataFileError, match=r"bad\.jsonl:1: no usable prompt.*neither"):
        measure_prompts([path])
    with pytest.raises(DataFileError, match="cannot read prompt file"):
        measure_prompts([tmp_path / "missing.jsonl"])


def test_sampling_is_uniform_seeded_and_in_file_order(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [json.dumps({"prompt": f"q{i}"}) for i in range(100)])
    first, seen = sample_prompts([path], 10, seed=1)
    again, _ = sample_prompts([path], 10, seed=1)
    other, _ = sample_prompts([path], 10, seed=2)
    assert seen == 100
    assert [p.id for p in first] == [p.id for p in again]
    assert [p.id for p in first] != [p.id for p in other]
    assert [p.line for p in first] == sorted(p.line for p in first)
    everything, _ = sample_prompts([path], 500)
    assert len(everything) == 100
    with pytest.raises(ConfigurationError, match="at least 1 prompt"):
        sample_prompts([path], 0)


async def test_a_pilot_measures_what_the_simulator_bills(
    openrouter_sim: SimulatorServer, openrouter_api_key: str
) -> None:
    prompts = [[{"role": "user", "content": f"question {i} " * (i % 7 + 1)}] for i in range(30)]
    async with Router(
        MODEL,
        policy=ProviderPolicy(exclude_below="int4"),
        base_url=openrouter_sim.url,
        api_key=openrouter_api_key,
    ) as router:
        pilot = await run_pilot(router, prompts, max_tokens=4096, concurrency=8)
    assert pilot.requests == 30
    assert pilot.failures == 0
    assert pilot.cost == openrouter_sim.simulator.usage
    assert sum(pilot.providers.values()) == 30
    lengths = [u.completion_tokens for u in pilot.usages]
    assert pilot.estimate.completion_tokens == Decimal(repr(statistics.fmean(lengths))).quantize(
        Decimal("0.01")
    )
    assert pilot.estimate.low < pilot.estimate.completion_tokens < pilot.estimate.high


async def test_a_pilot_with_too_few_successes_says_so(
    openrouter_sim: SimulatorServer, openrouter_api_key: str
) -> None:
    openrouter_sim.set_balance(0)
    async with Router(MODEL, base_url=openrouter_sim.url, api_key=openrouter_api_key) as router:
        with pytest.raises(ConfigurationError, match=r"completed 0 request\(s\) \(3 failed\)"):
            await run_pilot(router, [[{"role": "user", "content": "hi"}]] * 3, max_tokens=64)


async def test_a_pilot_of_multi_turn_conversations_measures_their_cached_share(
    openrouter_sim: SimulatorServer, openrouter_api_key: str
) -> None:
    # EAGLE-3 regeneration: each line is a conversation cut before one of its user turns,
    # all under one system prompt, so later lines share long prefixes with earlier ones.
    system = {"role": "system", "content": "You answer as a senior engineer would. " * 20}
    prompts = []
    for c in range(4):
        turns = [system]
        for t in range(3):
            turns = [*turns, {"role": "user", "content": f"conversation {c} question {t}"}]
            prompts.append(list(turns))
            turns.append({"role": "assistant", "content": f"answer {t} of conversation {c}"})
    async with Router(
        MODEL,
        policy=ProviderPolicy(exclude_below="int4"),
        base_url=openrouter_sim.url,
        api_key=openrouter_api_key,
    ) as router:
        pilot = await run_pilot(router, prompts, max_tokens=256, concurrency=1)
    assert pilot.providers == {"Chutes": len(prompts)}  # one provider: one cache
    cached = [u.cached_tokens for u in pilot.usages]
    system_tokens = count_prompt_tokens([system]) - count_prompt_tokens([])
    assert cached[0] == 0
    assert all(c >= system_tokens for c in cached[1:]), "the shared system prompt is read"
    # A later turn of a conversation reads its earlier turn whole (not just the system).
    assert cached[1] == count_prompt_tokens(prompts[0]) - count_prompt_tokens([])
    share = pilot.estimate.cached_prompt_share
    assert share == Decimal(sum(cached)) / Decimal(sum(u.prompt_tokens for u in pilot.usages))
    assert Decimal("0.5") < share < 1


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_tool_definitions_count_as_prompt_tokens(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    lines = [
        {"id": "plain", "prompt": "hello there"},
        {"id": "own", "prompt": "hello there", "tools": [WEATHER_TOOL, WEATHER_TOOL]},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    messages = [{"role": "user", "content": "hello there"}]
    bare = approx_prompt_tokens(messages)
    one = len(json.dumps([WEATHER_TOOL], separators=(",", ":")))
    two = len(json.dumps([WEATHER_TOOL, WEATHER_TOOL], separators=(",", ":")))
    assert approx_prompt_tokens(messages, tools=[WEATHER_TOOL]) == bare + -(-one // 4)
    assert approx_prompt_tokens(messages, tools=[WEATHER_TOOL], count_tokens=len) == (
        approx_prompt_tokens(messages, count_tokens=len) + one
    )
    # Without plan tools only the line that has its own pays for them; with plan tools
    # every line pays, the line's own replacing the plan's.
    assert measure_prompts([path]).mean_tokens * 2 == 2 * bare + -(-two // 4)
    with_plan = measure_prompts([path], tools=[WEATHER_TOOL])
    assert with_plan.mean_tokens * 2 == 2 * bare + -(-one // 4) + -(-two // 4)


async def test_a_pilot_sends_each_line_with_its_own_tools(
    tmp_path: Path, openrouter_sim: SimulatorServer, openrouter_api_key: str
) -> None:
    path = tmp_path / "p.jsonl"
    lines = [
        {"id": "a", "prompt": "Weather?", "tools": [WEATHER_TOOL], "tool_choice": "required"},
        {"id": "b", "prompt": "Hello."},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    prompts, _ = sample_prompts([path], 2)
    async with Router(
        MODEL,
        policy=ProviderPolicy(exclude_below="int4"),
        base_url=openrouter_sim.url,
        api_key=openrouter_api_key,
    ) as router:
        await run_pilot(router, prompts, max_tokens=256, concurrency=1)
    sent = {r.tool_choice: r.tools for r in openrouter_sim.requests if r.route == "chat"}
    assert sent == {"required": ("weather",), None: ()}
