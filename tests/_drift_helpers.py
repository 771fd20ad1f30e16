"""A local OpenRouter whose Chutes turns degraded after a given number of requests: what
the tests of ``run --verify``'s checks during a run (and of their views) are made on."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from _job_helpers import write_prompts
from _markets import degraded_market

import provider_router as pr
from provider_router.testing import SimulatorServer
from provider_router.testing.server import DEFAULT_TEST_KEY

__all__ = ["Factory", "canaries_per_check", "chutes_turning", "turning_cli_job"]

Factory = Callable[..., Awaitable[SimulatorServer]]


async def canaries_per_check(factory: Factory) -> int:
    """Requests one check pins to Chutes (what its onset counts too), as measured on a
    simulator of its own: what ``verify`` sends an endpoint that lists tools."""
    sim = await factory(seed=3)
    policy = pr.ProviderPolicy(only=["chutes"])
    await pr.verify(
        "moonshotai/kimi-k2.5", policy=policy, base_url=sim.url, api_key=DEFAULT_TEST_KEY
    )
    return sum(1 for r in sim.requests if r.route == "chat" and r.tag == "chutes")


async def chutes_turning(
    tmp_path: Path, factory: Factory, *, checks: int, rows: int, **options: Any
) -> tuple[SimulatorServer, int]:
    """A local OpenRouter whose Chutes serves the model's own answers to the canaries of
    ``checks`` checks and ``rows`` of the job's prompts, then degraded (agreement 0.6);
    and the canaries one check pins to it."""
    canaries = await canaries_per_check(factory)
    serves = {"agreement": 0.6, "after_requests": checks * canaries + rows}
    market = degraded_market(tmp_path, {"chutes": serves})
    return await factory(market=market, seed=3, **options), canaries


async def turning_cli_job(
    tmp_path: Path, factory: Factory, *, prompts: int, **options: Any
) -> tuple[SimulatorServer, Path, list[str]]:
    """:func:`chutes_turning` after two checks and 20 rows, ``prompts`` prompts, and the
    ``provider-router run`` of them into ``tmp_path/out`` (add ``--verify``...): the
    simulator, the out directory, the argv."""
    sim, _ = await chutes_turning(tmp_path, factory, checks=2, rows=20, **options)
    path = write_prompts(tmp_path / "p.jsonl", prompts)
    out = tmp_path / "out"
    argv = ["run", str(path), "--model", "moonshotai/kimi-k2.5", "--budget", "5"]
    argv += ["--concurrency", "4", "--max-tokens", "200", "--exclude-below", "int4"]
    return sim, out, [*argv, "--out", str(out), "--base-url", sim.url, "--progress", "off"]
