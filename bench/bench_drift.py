"""``run --verify`` during a run: what the re-checks cost, and what they catch.

Run: ``python -m bench drift [--prompts 2000] [--every 200] [--onset 0.3]``.
One job of ``--prompts`` prompts (Kimi K2.5's default market, 200 in flight, answers
capped at 400 tokens) runs three times in the same process, each against a fresh local
OpenRouter (instant answers, seed 3):

* ``plain``: no ``--verify`` (the baseline);
* ``honest``: ``--verify --verify-every N``, no provider degraded;
* ``drift``: the same, Chutes (the cheapest, so it serves the job) turning degraded
  (``serves: {agreement: 0.6, after_requests: K}``) once ``--onset`` of the job's
  prompts have been sent to it.

Reported: wall and CPU seconds (and their ratio to ``plain``), checks, what they cost
and their share of the spend, rows flagged, rows the simulator served degraded, and of
those the ones left unflagged (must be 0); the ledger against the simulator's bill.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from provider_router.checks.verify import DEFAULT_SAMPLES, DEFAULT_TOOL_SAMPLES
from provider_router.jobs.drift_history import DriftHistory
from provider_router.jobs.observe.standard import standard_observers
from provider_router.jobs.runner import JobRunner
from provider_router.jobs.store.outputs import read_outputs
from provider_router.planning.plan import Plan
from provider_router.testing import SimulatorServer
from provider_router.testing.server import DEFAULT_TEST_KEY

CANARIES = DEFAULT_SAMPLES + DEFAULT_TOOL_SAMPLES
"""Requests one check pins to Chutes (it lists tools)."""


def _market(directory: Path, serves: dict[str, Any] | None) -> Path | None:
    if serves is None:
        return None
    from importlib import resources

    text = (resources.files("provider_router.testing") / "markets" / "kimi-k2.5.yaml").read_text()
    data = yaml.safe_load(text)
    for model in data["models"]:
        for endpoint in model["endpoints"]:
            if model["id"] == "moonshotai/kimi-k2.5" and endpoint["slug"] == "chutes":
                endpoint["serves"] = serves
    path = directory / "market.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _plan(directory: Path, prompts: int) -> Plan:
    path = directory / "p.jsonl"
    with path.open("w") as fh:
        for n in range(prompts):
            fh.write(json.dumps({"id": f"q{n}", "prompt": f"question {n}"}) + "\n")
    return Plan.model_validate(
        {
            "model": "moonshotai/kimi-k2.5",
            "budget": "100",
            "concurrency": 200,
            "policy": {"exclude_below": "int4"},
            "generation": {"max_tokens": 400},
            "datasets": [{"name": "p", "input": str(path)}],
        }
    )


async def _one(name: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        serves = None
        if name == "drift":
            onset = CANARIES + round(args.onset * args.prompts)
            serves = {"agreement": 0.6, "after_requests": onset}
        market = _market(directory, serves)
        async with SimulatorServer(
            api_keys=[DEFAULT_TEST_KEY], speed=math.inf, seed=3, market=market
        ) as sim:
            out = directory / "out"
            runner = JobRunner(
                _plan(directory, args.prompts),
                out,
                base_url=sim.url,
                api_key=DEFAULT_TEST_KEY,
                verify=name != "plain",
                verify_every=args.every,
                observers=standard_observers(),
            )
            wall, cpu = time.perf_counter(), time.process_time()
            summary = await runner.run()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            rows = [record for _, record in read_outputs(out / "p.jsonl")]
            degraded = {r.generation_id for r in sim.requests if r.route == "chat" and r.degraded}
            charged = sum((r.cost for r in sim.requests), Decimal(0))
            history = DriftHistory.load(out / "verify.json")
        served_degraded = [r for r in rows if r["generation_id"] in degraded]
        return {
            "name": name,
            "reason": summary.reason.value,
            "rows": len(rows),
            "unique": len({r["id"] for r in rows}),
            "wall": wall,
            "cpu": cpu,
            "checks": len(history.checks),
            "check_cost": history.cost,
            "spent": summary.spent,
            "ledger_is_bill": summary.spent == charged,
            "excluded": ",".join(history.failed) or "-",
            "flagged": sum(1 for r in rows if r.get("drift_flagged")),
            "served_degraded": len(served_degraded),
            "degraded_unflagged": sum(1 for r in served_degraded if not r.get("drift_flagged")),
        }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench drift")
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--every", type=int, default=200)
    parser.add_argument("--onset", type=float, default=0.3)
    args = parser.parse_args(argv)
    print(f"machine: {platform.machine()}, Python {platform.python_version()}; ", end="")
    print(f"{args.prompts} prompts, 200 in flight, --verify-every {args.every}")
    results = [asyncio.run(_one(name, args)) for name in ("plain", "honest", "drift")]
    base = results[0]
    print(
        "| run | rows (unique) | wall s (×plain) | CPU s (×plain) | checks | checks' cost "
        "(share) | excluded | flagged | served degraded | degraded unflagged | ledger = bill |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        share = r["check_cost"] / r["spent"] if r["spent"] else Decimal(0)
        print(
            f"| {r['name']} | {r['rows']} ({r['unique']}) | {r['wall']:.1f} "
            f"({r['wall'] / base['wall']:.2f}) | {r['cpu']:.1f} ({r['cpu'] / base['cpu']:.2f}) "
            f"| {r['checks']} | ${r['check_cost']:.4f} ({share:.1%}) | {r['excluded']} "
            f"| {r['flagged']} | {r['served_degraded']} | {r['degraded_unflagged']} "
            f"| {r['ledger_is_bill']} |"
        )
    bad = [r for r in results if r["degraded_unflagged"] or not r["ledger_is_bill"]]
    return 1 if bad else 0
