"""The budget stop: how much of a budget is used, and how fast the last callers are refused.

Run: ``python -m bench budget`` (``--runs N``, ``--ledger sqlite|memory``,
``--wait default|true|false``). The scenario of issue #13: 1,500 ``router.chat``
calls gathered at once (the way most users write it) with ``max_concurrency=500``
on a $0.25 ledger, ``max_tokens=128``, the local OpenRouter at speed 1000 in its own
process. Reported per run: the share of the budget spent, the wall time, how many
requests were answered and refused, and the delay between the last answer (the
settle that made the budget final) and the last refusal.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

from bench.bench_client import KEY, MESSAGES, MODEL, Sim, _uvloop

CALLS = 1500
CONCURRENCY = 500
LIMIT = Decimal("0.25")
MAX_TOKENS = 128
SPEED = 1000.0


async def _run(url: str, ledger_kind: str, wait: str) -> dict[str, Any]:
    from provider_router import BudgetExhausted, MemoryLedger, ProviderPolicy, Router, SQLiteLedger

    kwargs: dict[str, Any] = {}
    if wait != "default":
        kwargs["budget_wait"] = wait == "true"
    with tempfile.TemporaryDirectory() as tmp:
        ledger = (
            SQLiteLedger(Path(tmp) / "budget.ledger", limit=LIMIT)
            if ledger_kind == "sqlite"
            else MemoryLedger(LIMIT)
        )
        answered: list[float] = []
        refused: list[float] = []
        other: list[str] = []
        async with (
            ledger,
            Router(
                MODEL,
                policy=ProviderPolicy(exclude_below="int4"),
                ledger=ledger,
                max_concurrency=CONCURRENCY,
                base_url=url,
                api_key=KEY,
                **kwargs,
            ) as router,
        ):

            async def one() -> None:
                try:
                    await router.chat(MESSAGES, max_tokens=MAX_TOKENS)
                except BudgetExhausted:
                    refused.append(time.perf_counter())
                except Exception as exc:
                    other.append(type(exc).__name__)
                else:
                    answered.append(time.perf_counter())

            t0 = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(CALLS)))
            wall = time.perf_counter() - t0
            state = await ledger.snapshot()
    last_answer = max(answered, default=t0)
    return {
        "spent_share": float(state.spent / LIMIT),
        "wall": round(wall, 3),
        "answered": len(answered),
        "refused": len(refused),
        "other_errors": other[:5],
        "last_refusal_after_last_answer": round(max(refused, default=last_answer) - last_answer, 3),
    }


def _client(url: str, ledger_kind: str, wait: str, out: Any) -> None:
    _uvloop()
    out.send(asyncio.run(_run(url, ledger_kind, wait)))


def run_once(ledger_kind: str, wait: str) -> dict[str, Any]:
    import multiprocessing as mp

    sim = Sim(SPEED, completion_tokens=None)  # the simulator's own length distribution
    try:
        parent, child = mp.Pipe()
        process = mp.get_context("fork").Process(
            target=_client, args=(sim.url, ledger_kind, wait, child)
        )
        process.start()
        result: dict[str, Any] = parent.recv()
        process.join()
    finally:
        sim.stop()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench budget", description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ledger", choices=["sqlite", "memory"], default="sqlite")
    parser.add_argument("--wait", choices=["default", "true", "false"], default="default")
    args = parser.parse_args(argv)
    rows = []
    for _ in range(args.runs):
        rows.append(run_once(args.ledger, args.wait))
        print(f"[budget {args.ledger} wait={args.wait}] {rows[-1]}", file=sys.stderr)
    summary = {
        "ledger": args.ledger,
        "wait": args.wait,
        "runs": args.runs,
        "spent_share_min": min(r["spent_share"] for r in rows),
        "spent_share_median": statistics.median(r["spent_share"] for r in rows),
        "wall_median": statistics.median(r["wall"] for r in rows),
        "stop_delay_max": max(r["last_refusal_after_last_answer"] for r in rows),
    }
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
