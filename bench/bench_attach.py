"""What durable generation ids cost: the batch runner's CPU, JSON against streamed.

Run: ``python -m bench attach`` (``--requests``, ``--concurrency``, ``--rounds``). The
local OpenRouter runs in its own process; each variant runs the batch runner over the
same prompts in a child process of its own and reports its CPU per 1,000 requests:

* ``json``: non-streaming requests (the old default; no id before the answer);
* ``stream``: streamed, the id attached to the reservation at the first byte (one
  ledger write per request, shared by a group commit) — the default;
* ``stream, no attach``: streamed without the attach (the id only with the settle):
  the attach's own share of the difference.

Ratios are against ``json`` measured in the same run (the machine is shared: noisy).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_batch import DATASETS, _uvloop, _write_prompts
from bench.bench_client import KEY, MODEL, Sim

VARIANTS = ("json", "stream", "stream, no attach")
MAX_TOKENS = 1000
"""Completion cap; lengths are the simulator's seeded log-normal (median 400 tokens,
16 tokens per stream chunk)."""


def _plan(paths: list[Path], concurrency: int) -> Any:
    from provider_router.planning import Plan

    return Plan.model_validate(
        {
            "model": MODEL,
            "budget": "100000",
            "concurrency": concurrency,
            "policy": {"exclude_below": "int4"},
            "generation": {"max_tokens": MAX_TOKENS},
            "datasets": [
                {"name": name, "input": str(path)}
                for name, path in zip(DATASETS, paths, strict=True)
            ],
        }
    )


def _child(url: str, directory: str, variant: str, concurrency: int, conn: Any) -> None:
    _uvloop()
    from provider_router.client._billing import Billing
    from provider_router.jobs import JobRunner, standard_observers

    if variant == "stream, no attach":

        async def no_attach(self: Any, request: Any, reservation: Any, generation_id: str) -> None:
            request.generation_id = generation_id

        Billing.attach = no_attach  # type: ignore[method-assign]

    work = Path(directory)
    paths = sorted(work.glob("*.jsonl"))

    async def main() -> dict[str, Any]:
        runner = JobRunner(
            _plan(paths, concurrency),
            work / f"out-{variant.replace(' ', '').replace(',', '-')}",
            base_url=url,
            api_key=KEY,
            stream=variant != "json",
            observers=standard_observers(),
        )
        cpu0 = time.process_time()
        summary = await runner.run()
        return {
            "cpu": time.process_time() - cpu0,
            "requests": sum(d.run.requests for d in summary.datasets),
        }

    conn.send(asyncio.run(main()))


def _measure(url: str, directory: Path, variant: str, concurrency: int) -> dict[str, Any]:
    parent, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(
        target=_child, args=(url, str(directory), variant, concurrency, child)
    )
    proc.start()
    result: dict[str, Any] = parent.recv()
    proc.join()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench attach", description=__doc__)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2, help="runs per variant (best kept)")
    args = parser.parse_args(argv)
    sim = Sim(speed=200.0, completion_tokens=None)
    cpu: dict[str, float] = {}
    try:
        for _ in range(args.rounds):
            for variant in VARIANTS:
                work = Path(tempfile.mkdtemp(prefix="bench-attach-"))
                try:
                    _write_prompts(work, args.requests)
                    result = _measure(sim.url, work, variant, args.concurrency)
                finally:
                    shutil.rmtree(work, ignore_errors=True)
                per_k = result["cpu"] / max(result["requests"], 1) * 1000
                cpu[variant] = min(cpu.get(variant, per_k), per_k)
    finally:
        sim.stop()
    print(
        f"batch runner CPU per 1,000 requests ({args.requests} at {args.concurrency}, "
        f"max_tokens {MAX_TOKENS}, median 400 output tokens, 16 per chunk)"
    )
    for variant in VARIANTS:
        print(f"  {variant:<18} {cpu[variant]:6.2f} s   × {cpu[variant] / cpu['json']:.2f}")
    return 0
