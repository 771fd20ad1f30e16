"""Output-token targets land: the in-flight pricing, overshoot, and targets out of reach."""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from _job_helpers import assert_consistent, write_prompts

from provider_router.cli._exit_codes import EXIT_CODES
from provider_router.jobs.runner import JobRunner
from provider_router.jobs.summary import StopReason
from provider_router.jobs.targets import InFlightPricer
from provider_router.planning.plan import Plan
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

MODEL = "moonshotai/kimi-k2.5"
Factory = Callable[..., Awaitable[SimulatorServer]]


def plan(tmp_path: Path, prompts: int, *, concurrency: int, max_tokens: int, **ds: Any) -> Plan:
    path = write_prompts(tmp_path / "a.jsonl", prompts, prefix="a")
    return Plan.model_validate(
        {
            "model": MODEL,
            "budget": "50",
            "concurrency": concurrency,
            "policy": {"exclude_below": "int4"},
            "generation": {"max_tokens": max_tokens},
            "datasets": [{"name": "a", "input": str(path), **ds}],
        }
    )


# --- the pricer ------------------------------------------------------------------------


def test_before_any_length_is_known_each_request_is_priced_at_its_cap() -> None:
    pricer = InFlightPricer(1000)
    assert pricer.price(0) == 0
    assert pricer.price(7) == 7000
    for ticket in [pricer.sent() for _ in range(3)]:
        pricer.landed(ticket, 10)
    assert pricer.price(7) == 7000  # 3 samples are not enough to trust


def test_only_the_completed_prefix_in_send_order_is_sampled() -> None:
    """Short answers land first; counting them alone would price the rest far too low."""
    pricer = InFlightPricer(1000, min_samples=2)
    tickets = [pricer.sent() for _ in range(10)]
    for ticket in tickets[1:]:  # everything but the first, all short
        pricer.landed(ticket, 5)
    assert pricer.samples == 0
    assert pricer.price(4) == 4000
    pricer.landed(tickets[0], 900)  # the long first one lands: the whole prefix counts
    assert pricer.samples == 10


def test_failures_resolve_the_prefix_without_counting_as_zero_tokens() -> None:
    pricer = InFlightPricer(100, min_samples=2)
    first, second, third = pricer.sent(), pricer.sent(), pricer.sent()
    pricer.landed(second, 50)
    pricer.landed(first, None)
    pricer.landed(third, 50)
    assert pricer.samples == 2
    for _ in range(10_000):
        pricer.landed(pricer.sent(), 50)
    # No spread: the mean's bound tightens to 50 as samples grow.
    assert 500 < pricer.price(10) < 510


def test_a_few_short_samples_do_not_make_the_rest_cheap() -> None:
    """Lengths run to the cap now and then: nine short answers prove little."""
    pricer = InFlightPricer(2048)
    for tokens in (210, 260, 300, 310, 330, 350, 380, 400, 420):
        pricer.landed(pricer.sent(), tokens)
    assert pricer.price(50) == 50 * 2048


@pytest.mark.parametrize("in_flight", [10, 200, 2000])
def test_the_price_covers_the_sum_of_what_is_in_flight(in_flight: int) -> None:
    """Over many draws, the real sum of ``in_flight`` lengths rarely exceeds the price.

    (One request alone can be longer: that much overshoot is the target's grain.)
    """
    rng = random.Random(in_flight)

    def draw() -> int:
        return min(2000, max(1, round(400 * rng.lognormvariate(0, 0.6))))

    pricer = InFlightPricer(2000)
    for _ in range(200):
        pricer.landed(pricer.sent(), draw())
    price = pricer.price(in_flight)
    assert price <= in_flight * 2000
    over = sum(sum(draw() for _ in range(in_flight)) > price for _ in range(200))
    assert over <= 4  # 2 %


def test_a_bad_cap_is_refused() -> None:
    with pytest.raises(ValueError, match="cap"):
        InFlightPricer(0)


# --- the runner ------------------------------------------------------------------------


async def test_a_first_wave_longer_than_half_the_cap_does_not_overshoot(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    """Every answer is 900 of 1,000 tokens: the old max_tokens/2 guess doubled the target."""
    sim = await openrouter_sim_factory(completion_tokens=900)
    out = tmp_path / "out"
    p = plan(tmp_path, 500, concurrency=200, max_tokens=1000, target_output_tokens=10_000)
    summary = await JobRunner(p, out, base_url=sim.url, api_key=DEFAULT_TEST_KEY).run()
    assert summary.reason is StopReason.COMPLETE
    (report,) = summary.datasets
    assert 10_000 <= report.output_tokens < 10_000 + 1000  # at most one request over
    assert_consistent(out, ["a"])


async def test_a_target_the_prompts_cannot_reach_is_not_complete(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(completion_tokens=100)
    out = tmp_path / "out"
    p = plan(tmp_path, 5, concurrency=4, max_tokens=200, target_output_tokens=50_000)
    summary = await JobRunner(p, out, base_url=sim.url, api_key=DEFAULT_TEST_KEY).run()
    assert summary.reason is StopReason.TARGET_NOT_REACHED
    assert EXIT_CODES[summary.reason] != 0
    assert "a: its prompts ran out at 500 of 50,000 target output tokens" in summary.message
    saved = json.loads((out / "summary.json").read_text())
    assert saved["reason"] == "target_not_reached"
    # The exit code is the command's (cli/_exit_codes.py, noted by `run`): none here.
    assert "exit_code" not in saved


async def test_a_request_cap_below_the_prompts_is_still_complete(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    """The cap stops the dataset first: the unreached target is what the user asked for."""
    sim = await openrouter_sim_factory(completion_tokens=100)
    p = plan(
        tmp_path, 20, concurrency=4, max_tokens=200, target_output_tokens=50_000, max_requests=5
    )
    summary = await JobRunner(p, tmp_path / "o", base_url=sim.url, api_key=DEFAULT_TEST_KEY).run()
    assert summary.reason is StopReason.COMPLETE


async def test_the_command_exits_6_and_suggests_no_resume(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(completion_tokens=100)
    prompts = write_prompts(tmp_path / "p.jsonl", 5)
    env = {**os.environ, "OPENROUTER_API_KEY": DEFAULT_TEST_KEY}
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "provider_router", "run", str(prompts)),
        *("--out", str(tmp_path / "out"), "--model", MODEL, "--budget", "5"),
        *("--max-tokens", "200", "--target-output-tokens", "50000", "--base-url", sim.url),
        *("--progress", "off"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    stdout, stderr = await proc.communicate()
    assert proc.returncode == 6, stderr.decode()[-2000:]
    text = stdout.decode() + stderr.decode()
    assert "its prompts ran out at 500 of 50,000 target output tokens" in text
    assert "To resume" not in text
