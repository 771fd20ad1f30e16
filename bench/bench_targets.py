"""Output-token targets: how far a run lands past its target, at 2,000 in flight.

Run: ``python -m bench targets`` (``--quick`` for the two smaller targets only).
The local OpenRouter runs in its own process with log-normal completion lengths
(median 400 tokens, sigma 0.6, capped by ``max_tokens`` 2,048) and time-scaled
latency (``--speed``, default 200: a 400-token answer takes ~0.08 s), so short
answers return first, as on the real service. For each target (20×, 200× and
2,000× the concurrency, in output tokens) one dataset runs to its target twice
in the same run, each in a child process of its own:

* ``old``: the rule before issue #11 (each request in flight priced at
  ``max_tokens / 2`` until an answer returns, then at the mean of the answers
  returned so far);
* ``new``: :class:`~provider_router.jobs.targets.InFlightPricer` (the cap until
  an unbiased sample exists, then the observed distribution plus 3 σ).

Reported: output tokens completed, overshoot (tokens past the target, in % of
it), the *floor* (the overshoot of the shortest prefix of the prompts, in file order,
whose answers reach the target: what any rule that sends prompts in order and never
cuts an answer short must complete; the grain of the last request), how far the run
landed past that floor, requests, and wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_client import KEY, MODEL

MAX_TOKENS = 2048
CONCURRENCY = 2000


def _serve(speed: float, seed: int, ready: Any) -> None:
    import uvloop

    from provider_router.testing import SimulatorServer

    async def main() -> None:
        async with SimulatorServer(
            api_keys=[KEY], credits=10**6, speed=speed, seed=seed, log_limit=1000
        ) as sim:
            ready.send(sim.url)
            await asyncio.Event().wait()

    uvloop.run(main())


class _OldRule:
    """The pricing before #11: max_tokens / 2 blind, then the mean of what returned."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._n = 0
        self._sum = 0

    def sent(self) -> int:
        return 0

    def landed(self, ticket: int, tokens: int | None) -> None:
        if tokens is not None:
            self._n += 1
            self._sum += tokens

    def price(self, in_flight: int) -> float:
        per = self._sum / self._n if self._n else self.cap / 2
        return in_flight * per

    def terms(self) -> tuple[float, float]:
        return self.price(1), 0.0


def _run_child(url: str, directory: str, target: int, rule: str, conn: Any) -> None:
    import structlog
    import uvloop

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    from provider_router.jobs import JobRunner, standard_observers
    from provider_router.jobs import runner as runner_module
    from provider_router.planning import Plan

    if rule == "old":
        runner_module.InFlightPricer = _OldRule  # type: ignore[misc,assignment]
    plan = Plan.model_validate(
        {
            "model": MODEL,
            "budget": "100000",
            "concurrency": CONCURRENCY,
            "policy": {"exclude_below": "int4"},
            "generation": {"max_tokens": MAX_TOKENS},
            "datasets": [
                {"name": "d", "input": f"{directory}/d.jsonl", "target_output_tokens": target}
            ],
        }
    )

    async def main() -> dict[str, Any]:
        runner = JobRunner(
            plan,
            Path(directory) / f"out-{rule}",
            base_url=url,
            api_key=KEY,
            observers=standard_observers(),
        )
        t0 = time.perf_counter()
        summary = await runner.run()
        (report,) = summary.datasets
        return {
            "floor": _floor(Path(directory) / f"out-{rule}" / "d.jsonl", target),
            "tokens": report.output_tokens,
            "requests": report.completed,
            "wall": time.perf_counter() - t0,
            "reason": summary.reason.value,
        }

    conn.send(uvloop.run(main()))


def _floor(outputs: Path, target: int) -> int | None:
    """Output tokens of the shortest prefix of the prompts, in file order, that reaches the
    target, with the lengths this run's answers had: what any rule that sends prompts in
    order and never cuts an answer short must complete (None: the run did not send a prefix).
    """
    lengths: dict[int, int] = {}
    with outputs.open() as fh:
        for line in fh:
            record = json.loads(line)
            lengths[int(record["id"][1:])] = int(record["usage"]["completion_tokens"])
    total = 0
    for n in range(len(lengths)):
        if n not in lengths:
            return None
        total += lengths[n]
        if total >= target:
            return total
    return None


def _child(target: Any, *args: Any) -> Any:
    parent, child = mp.Pipe()
    process = mp.get_context("fork").Process(target=target, args=(*args, child))
    process.start()
    result = parent.recv()
    process.join()
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench targets")
    parser.add_argument("--quick", action="store_true", help="20× and 200× only")
    parser.add_argument("--speed", type=float, default=200.0)
    parser.add_argument("--seeds", type=int, default=3, help="simulator seeds per target")
    parser.add_argument(
        "--multiples", default="20,200,2000", help="targets, in multiples of the concurrency"
    )
    args = parser.parse_args(argv)
    multiples = tuple(int(m) for m in args.multiples.split(","))
    if args.quick:
        multiples = tuple(m for m in multiples if m <= 200)
    print(
        f"python {sys.version.split()[0]}, {platform.machine()}, {os.cpu_count()} cores; "
        f"{CONCURRENCY:,} in flight, max_tokens {MAX_TOKENS:,}, log-normal lengths "
        f"(median 400, sigma 0.6), speed {args.speed:g}, seeds 1..{args.seeds}"
    )
    print(
        "| target | seed | rule | output tokens | overshoot | floor | past the floor "
        "| requests | wall s |"
    )
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    results: dict[tuple[int, str], list[float]] = {}
    for seed in range(1, args.seeds + 1):
        parent, child = mp.Pipe()
        sim = mp.get_context("fork").Process(
            target=_serve, args=(args.speed, seed, child), daemon=True
        )
        sim.start()
        url = parent.recv()
        try:
            for multiple in multiples:
                target = multiple * CONCURRENCY
                prompts = 3 * target // 300 + CONCURRENCY
                with tempfile.TemporaryDirectory() as tmp:
                    with open(f"{tmp}/d.jsonl", "w") as fh:
                        for n in range(prompts):
                            fh.write(json.dumps({"id": f"p{n}", "prompt": f"Task {n}."}) + "\n")
                    for rule in ("old", "new"):
                        r = _child(_run_child, url, tmp, target, rule)
                        over = (r["tokens"] - target) / target * 100
                        results.setdefault((multiple, rule), []).append(over)
                        floor = r["floor"]
                        floor_over = "?" if floor is None else f"{(floor - target) / target:+.2%}"
                        past = "?" if floor is None else f"{(r['tokens'] - floor) / target:+.2%}"
                        print(
                            f"| {multiple:,}× = {target:,} | {seed} | {rule} | {r['tokens']:,} | "
                            f"{over:+.2f} % | {floor_over} | {past} | {r['requests']:,} | "
                            f"{r['wall']:.1f} |",
                            flush=True,
                        )
                        if r["reason"] != "complete":
                            print(f"(run ended: {r['reason']})")
        finally:
            sim.terminate()
            sim.join(5)
    print("\n| target | rule | mean overshoot | worst |")
    print("|---:|---|---:|---:|")
    for (multiple, rule), overs in results.items():
        print(
            f"| {multiple:,}× | {rule} | {sum(overs) / len(overs):+.2f} % | {max(overs):+.2f} % |"
        )
    worst = max(max(o) for (_, rule), o in results.items() if rule == "new")
    print(f"worst overshoot with the new rule: {worst:+.2f} %")
    return 0 if worst <= 2.0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
