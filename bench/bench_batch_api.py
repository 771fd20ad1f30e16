"""The Batch API route on the local OpenRouter: projected against actual, money, kills.

Run: ``python -m bench batch_api`` (``--tokens N`` output tokens per dataset, default
250k; ``--kills N`` SIGKILL points, default 20; ``--kills 0`` skips them).

1. A seeds-like plan (six datasets, one output-token target each, ``route: batch``) on
   ``moonshotai/kimi-k3``: the projection's batch cost (``compare_routes``, prompt
   tokens measured from the files as ``provider-router project`` does, the simulator's
   mean answer length as a pilot would measure it) against what the simulator billed;
   the ledger against the simulator's charges, to the picodollar; every prompt once.
2. ``provider-router run`` as a process, killed with SIGKILL at random moments across
   submit, poll and collect (two lost 202s injected), then resumed to the end: prompts
   submitted twice, prompts lost, the ledger against the simulator.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import tempfile
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

from provider_router import ProviderPolicy
from provider_router.catalog.fetch import Catalog
from provider_router.jobs.batch_api.journal import BatchJournal
from provider_router.jobs.batch_api_runner import batch_datasets, run_plan_batches
from provider_router.jobs.observe.standard import standard_observers
from provider_router.ledger.sqlite import SQLiteLedger
from provider_router.planning.compare import compare_routes
from provider_router.planning.plan import load_plan
from provider_router.planning.workload import DatasetDemand, WorkloadEstimate
from provider_router.planning.workload_stats import measure_prompts
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

MODEL = "moonshotai/kimi-k3"
DATASETS = tuple(f"b{i}" for i in range(1, 7))
MAX_TOKENS = 4096
MEDIAN_TOKENS, SIGMA = 400.0, 0.6
"""The simulator's answer lengths (log-normal); a pilot measures their mean."""


def write_inputs(directory: Path, prompts: int) -> None:
    for n, name in enumerate(DATASETS):
        lines = [
            json.dumps(
                {"id": f"{name}-{i}", "prompt": f"Write test {i} for module {n}. " * (1 + i % 4)}
            )
            for i in range(prompts)
        ]
        (directory / f"{name}.jsonl").write_text("\n".join(lines) + "\n")


def write_plan(directory: Path, tokens: int | None, budget: int) -> Path:
    plan = directory / "plan.yaml"
    target = "" if tokens is None else f", target_output_tokens: {tokens}"
    plan.write_text(
        f"model: {MODEL}\nbudget: {budget}\npolicy: {{exclude_below: int4}}\n"
        f"generation: {{max_tokens: {MAX_TOKENS}}}\ndatasets:\n"
        + "".join(f"  - {{name: {n}, input: {n}.jsonl{target}, route: batch}}\n" for n in DATASETS)
    )
    return plan


def submitted_counts(out: Path, sim: SimulatorServer) -> Counter[str]:
    with BatchJournal.open(out) as journal:
        intents = {i.intent: i for i in journal}
    seen: Counter[str] = Counter()
    for batch in sim.simulator.batches:
        for custom_id, _ in batch.submission.requests:
            intent = intents.get(custom_id.rpartition("-")[0])
            pid = None if intent is None else intent.prompt_for(custom_id)
            seen[pid or f"unknown:{custom_id}"] += 1
    return seen


def output_ids(out: Path) -> list[str]:
    ids: list[str] = []
    for name in DATASETS:
        path = out / f"{name}.jsonl"
        if path.exists():
            ids += [json.loads(line)["id"] for line in path.read_text().splitlines()]
    return ids


async def ledger_spent(out: Path) -> Decimal:
    async with SQLiteLedger(out / "ledger.sqlite", keep_limit=True) as ledger:
        return (await ledger.snapshot()).spent


def count_results_in_gets(sim: SimulatorServer) -> list[int]:
    """A counter of the result lines batch objects carried to the client (a terminal
    batch's ``GET /batches/{id}`` carries all of them; results pages are not counted)."""
    read = [0]
    book = sim.simulator.batches
    body = book.body

    def counted(batch: Any, *, with_results: bool) -> dict[str, Any]:
        answer = body(batch, with_results=with_results)
        read[0] += len(answer.get("results") or [])
        return answer

    book.body = counted  # type: ignore[method-assign]
    return read


async def projected_vs_actual(tokens: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        prompts = math.ceil(tokens / 300) + 50
        write_inputs(root, prompts)
        plan = load_plan(write_plan(root, tokens, budget=100))
        async with SimulatorServer(speed=math.inf, seed=25, credits=100) as sim:
            async with Catalog(sim.url) as catalog:
                sync, batch = await catalog.endpoints(MODEL), await catalog.batch_endpoints(MODEL)
            stats = measure_prompts(plan.datasets[0].inputs)
            mean = Decimal(str(round(MEDIAN_TOKENS * math.exp(SIGMA**2 / 2), 1)))
            workload = WorkloadEstimate(stats.mean_tokens, mean)
            demands = [DatasetDemand(d.name, target_output_tokens=tokens) for d in plan.datasets]
            routes = compare_routes(
                demands, sync, batch, ProviderPolicy(exclude_below="int4"), workload, budget=100
            )
            assert routes.batch.expected_cost is not None
            out = root / "out"
            batches = await batch_datasets(plan, base_url=sim.url)
            results_in_gets = count_results_in_gets(sim)
            started = time.perf_counter()
            result = await run_plan_batches(
                plan,
                out,
                batches,
                base_url=sim.url,
                api_key=DEFAULT_TEST_KEY,
                poll_initial=0.01,
                poll_max=0.05,
                observers=standard_observers(),
            )
            wall = time.perf_counter() - started
            sim.simulator.batches.settle_all()
            actual = sim.simulator.usage
            spent = await ledger_spent(out)
            ids = output_ids(out)
            counts = submitted_counts(out, sim)
            calls = sim.simulator.log.counters
            return {
                # Batch API calls by route: polls read the list; results come once.
                "calls": {r: calls[f"route.batch_{r}"] for r in ("list", "get", "results")},
                "result_lines_in_batch_objects": results_in_gets[0],
                "datasets": len(DATASETS),
                "tokens_per_dataset": tokens,
                "projected_batch": str(routes.batch.expected_cost),
                "projected_sync": str(routes.sync.expected_cost),
                "actual": str(actual),
                "error_pct": float((actual - routes.batch.expected_cost) / actual * 100),
                "ledger_minus_simulator": str(spent - actual),
                "lines": len(ids),
                "output_tokens": sum(
                    json.loads(line)["usage"]["completion_tokens"]
                    for name in DATASETS
                    for line in (out / f"{name}.jsonl").read_text().splitlines()
                ),
                "written_twice": len(ids) - len(set(ids)),
                "submitted_twice": sum(1 for n in counts.values() if n > 1),
                "batches": result.submitted,
                "stop": result.stop,
                "wall_s": round(wall, 2),
            }


async def kill_campaign(kills: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_inputs(root, 20)
        plan = write_plan(root, None, budget=20)  # every prompt: "lost" is exact
        out = root / "out"
        env = {**os.environ, "OPENROUTER_API_KEY": DEFAULT_TEST_KEY}
        rng = random.Random(2025)
        async with SimulatorServer(speed=3000, seed=9, credits=50) as sim:
            sim.simulator.batches.faults.lose_202 = 2
            argv = [sys.executable, "-m", "provider_router", "run", "--plan", str(plan), "--out",
                    str(out), "--base-url", sim.url, "--progress", "off", "--batch-poll", "0.02",
                    "--batch-lost-grace", "0.3", "--batch-size", "3"]  # fmt: skip
            landed = 0
            for _ in range(kills):
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                    env=env,
                )
                await asyncio.sleep(rng.uniform(0.2, 2.5))
                if proc.returncode is None:
                    proc.kill()
                    landed += 1
                await proc.wait()
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=env
            )
            _, err = await proc.communicate()
            sim.simulator.batches.settle_all()
            ids = output_ids(out)
            counts = submitted_counts(out, sim)
            expected = {f"{n}-{i}" for n in DATASETS for i in range(20)}
            spent = await ledger_spent(out)
            return {
                "kills": kills,
                "landed": landed,
                "final_exit": proc.returncode,
                "batches": len(sim.simulator.batches),
                "lost_202_injected": 2 - sim.simulator.batches.faults.lose_202,
                "submitted_twice": sum(1 for n in counts.values() if n > 1),
                "written_twice": len(ids) - len(set(ids)),
                "lines": len(ids),
                "lost": len(expected - set(ids)),
                "stderr_tail": err.decode()[-300:] if proc.returncode else "",
                "ledger_minus_simulator": str(spent - sim.simulator.usage),
            }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench batch_api")
    parser.add_argument("--tokens", type=int, default=250_000)
    parser.add_argument("--kills", type=int, default=20)
    args = parser.parse_args(argv)
    report = asyncio.run(projected_vs_actual(args.tokens))
    print(json.dumps({"projected_vs_actual": report}, indent=2))
    if args.kills:
        print(json.dumps({"kill_campaign": asyncio.run(kill_campaign(args.kills))}, indent=2))
    return 0
