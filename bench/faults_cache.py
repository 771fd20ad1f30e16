"""The fault campaign's cache rows: what a kill and a lost outputs file cost, with and
without OpenRouter's response cache, on a provider that cancels a stream its client
leaves and on one that does not.

Registered by :mod:`bench.bench_faults` (``--only cache``; a row: ``cache-kill-chutes``,
``cache-lost-moonshotai-on``...). Each row runs the CLI against a local OpenRouter
whose only endpoint is that provider's (Chutes cancels; Moonshot AI is on neither of
the docs' lists, so it is taken not to cancel), with ``cancellation="docs"`` and a
fixed completion length, so that what a fault costs is exact: a clean run of the same
job (same seed, same bodies) is the baseline, and **extra** is what the faulted job was
charged above it. ``kill``: kill -9 at seeded moments, then resume to the end.
``lost``: a run to the end, its outputs file deleted, then a resume (the journal says
which answers were lost: each is asked for again). The campaign's rules hold as for
every row: 0 lost, 0 duplicated, the ledger never below what was charged.
"""

from __future__ import annotations

import atexit
import random
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from bench.bench_faults import KEY, Job, Outcome, audit, ledger_spent, wait_records

PROVIDERS = {"chutes": "Chutes", "moonshotai": "Moonshot AI"}
"""Row name → provider: one that cancels a stream, one taken not to (docs/simulator.md)."""
COMPLETION_TOKENS = 400
TTL = 86_400
KILLS = 4

MARKET = """
models:
  - id: moonshotai/kimi-k2.5
    context_length: 262144
    endpoints:
      - provider: {provider}
        slug: {slug}
        quantization: int4
        pricing: {{prompt: "0.45", completion: "2.20"}}
        context_length: 262144
        max_completion_tokens: 65536
        latency_ms: 900
        throughput: 1
"""

Run = Callable[[Job, Any], Awaitable[Outcome]]


@dataclass
class CacheOutcome(Outcome):
    """An :class:`Outcome` with the baseline, the extra charge and the cache's hits."""

    baseline: Decimal = Decimal(0)
    hits: int = 0
    sent: int = 0

    @property
    def extra(self) -> Decimal:
        return self.charged - self.baseline

    def ok(self) -> bool:
        return (
            self.lost == 0 and self.duplicated == 0 and self.overspend == 0 and self.forgotten == 0
        )

    def row(self) -> str:
        return (
            f"| {self.name} | {self.prompts} | {self.interruptions} | {self.lost} | "
            f"{self.duplicated} | ${self.forgotten:.6f} | {self.sent} | {self.hits} | "
            f"${self.baseline:.6f} | ${self.charged:.6f} | ${self.extra:.6f} | "
            f"${self.spent - self.charged:.6f} | {'ok' if self.ok() else 'FAIL'} |"
        )


HEADER = (
    "| row | prompts | interruptions | lost | dup | forgotten | chat requests | cache hits "
    "| clean run | charged | extra | ledger − charged | |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def _market(root: Path, slug: str) -> Path:
    path = root / f"market-{slug}.yaml"
    path.write_text(MARKET.format(provider=PROVIDERS[slug], slug=slug))
    return path


def _sim_options(root: Path, slug: str) -> dict[str, Any]:
    return {
        "market": _market(root, slug),
        "cancellation": "docs",
        "completion_tokens": COMPLETION_TOKENS,
    }


def _cache_args(cache: bool) -> list[str]:
    return ["--no-preflight", *(["--response-cache", str(TTL)] if cache else [])]


async def _clean_charge(job: Job, slug: str, cache: bool, speed: float, seed: int) -> Decimal:
    """What the same job costs without a fault: the same prompts on a fresh simulator."""
    from provider_router.testing import SimulatorServer

    root = Path(tempfile.mkdtemp(prefix="faults-cache-clean-"))
    try:
        async with SimulatorServer(
            api_keys=[KEY], credits=10**6, speed=speed, seed=seed, log_limit=10**6,
            **_sim_options(root, slug),
        ) as sim:  # fmt: skip
            clean = Job(
                root, job.prompts, job.budget, job.max_tokens, job.concurrency, sim.url,
                extra=_cache_args(cache), horizon=-1.0,
            )  # fmt: skip
            shutil.copy(job.input, clean.input)
            await clean.finish()
            await sim.simulator.settle_abandoned(now=True)
            return sim.simulator.usage
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _counts(outcome: CacheOutcome, sim: Any) -> None:
    chats = [r for r in sim.simulator.log.records if r.route == "chat"]
    outcome.sent = len(chats)
    outcome.hits = sum(1 for r in chats if r.outcome == "cache_hit")


def kill_row(slug: str, cache: bool, seed: int) -> Run:
    async def run(job: Job, sim: Any) -> Outcome:
        rng = random.Random(seed)
        job.extra = _cache_args(cache)
        outcome = CacheOutcome(f"kill -9 ×{KILLS}, {slug}, cache {'on' if cache else 'off'}")
        outcome.baseline = await _clean_charge(job, slug, cache, sim.simulator.speed, seed)
        for _ in range(KILLS):
            proc = await job.start()
            await wait_records(proc, job, job.records() + rng.randint(1, job.concurrency // 2))
            if proc.returncode is not None:
                break
            proc.kill()
            await proc.wait()
            outcome.interruptions += 1
            outcome.in_flight_worst += job.open_worst_case()
        await job.finish()
        await audit(outcome, sim, job.ids(), job.prompts, ledger_spent(job.out / "ledger.sqlite"))
        _counts(outcome, sim)
        return outcome

    return run


def lost_row(slug: str, cache: bool, seed: int) -> Run:
    async def run(job: Job, sim: Any) -> Outcome:
        job.extra = _cache_args(cache)
        outcome = CacheOutcome(f"outputs file lost, {slug}, cache {'on' if cache else 'off'}")
        await job.finish()
        await sim.simulator.settle_abandoned(now=True)
        outcome.baseline = sim.simulator.usage  # the clean run is the first one
        (job.out / "p.jsonl").unlink()
        outcome.interruptions = 1
        await job.finish()
        await audit(outcome, sim, job.ids(), job.prompts, ledger_spent(job.out / "ledger.sqlite"))
        _counts(outcome, sim)
        return outcome

    return run


def cache_scenarios(seed: int) -> list[tuple[str, dict[str, Any], Run]]:
    """The rows, as ``(key, simulator options, run)`` for the campaign's loop."""
    rows: list[tuple[str, dict[str, Any], Run]] = []
    options_root = Path(tempfile.mkdtemp(prefix="faults-cache-markets-"))
    atexit.register(shutil.rmtree, options_root, True)
    for slug in PROVIDERS:
        options = _sim_options(options_root, slug)
        for cache in (False, True):
            suffix = f"{slug}-{'on' if cache else 'off'}"
            rows.append((f"cache-kill-{suffix}", options, kill_row(slug, cache, seed)))
            rows.append((f"cache-lost-{suffix}", options, lost_row(slug, cache, seed)))
    return rows
