"""Batch runner benchmarks: wall time against ideal, memory, and resuming a huge journal.

Run: ``python -m bench batch`` (``--quick`` for a smaller run). The local OpenRouter
runs in its own process (:class:`bench.bench_client.Sim`); each measured runner runs
in a child process of its own, so its CPU and peak RSS are its own.

Sections:
1. throughput: a two-dataset run of ``--requests`` prompts at ``--concurrency`` in
   flight with time-scaled latency; wall time against the ideal
   (requests × latency ÷ concurrency), in the same run as a bare aiohttp loop
   sending the same number of requests at the same concurrency;
2. memory: peak RSS of the runner at 2,000 in flight, for an input of N lines and
   of 5 N lines (the inputs are streamed: the ratio should stay near 1);
3. resume: a journal holding ``--resume-ids`` completed ids (default 1,000,000);
   seconds from starting the runner to its first new request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import resource
import shutil
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

from bench.bench_client import (
    BASE_LATENCY,
    COMPLETION_TOKENS,
    KEY,
    MAX_TOKENS,
    MODEL,
    Sim,
    _provider_object,
)

DATASETS = ("d1", "d2")


def _uvloop() -> None:
    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def _write_prompts(directory: Path, total: int) -> list[Path]:
    paths = []
    per = total // len(DATASETS)
    for name in DATASETS:
        path = directory / f"{name}.jsonl"
        with path.open("w") as fh:
            for n in range(per):
                fh.write(json.dumps({"id": f"{name}-{n}", "prompt": f"Task {n}: one line."}) + "\n")
        paths.append(path)
    return paths


def _plan(paths: list[Path], concurrency: int, max_requests: int | None = None) -> Any:
    from provider_router.planning import Plan

    return Plan.model_validate(
        {
            "model": MODEL,
            "budget": "100000",
            "concurrency": concurrency,
            "policy": {"exclude_below": "int4"},
            "generation": {"max_tokens": MAX_TOKENS},
            "datasets": [
                {"name": name, "input": str(path), "max_requests": max_requests}
                for name, path in zip(DATASETS, paths, strict=True)
            ],
        }
    )


# --- child processes ------------------------------------------------------------------


def _run_child(url: str, directory: str, concurrency: int, conn: Any) -> None:
    """Run the batch runner over the prompts in ``directory``; report time, CPU, RSS."""
    _uvloop()
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    from provider_router.jobs import JobRunner, standard_observers

    work = Path(directory)
    paths = [work / f"{name}.jsonl" for name in DATASETS]

    async def main() -> dict[str, Any]:
        runner = JobRunner(
            _plan(paths, concurrency),
            work / "out",
            base_url=url,
            api_key=KEY,
            observers=standard_observers(),
        )
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        summary = await runner.run()
        return {
            "wall": time.perf_counter() - t0,
            "cpu": time.process_time() - cpu0,
            "requests": sum(d.run.requests for d in summary.datasets),
            "failures": sum(d.run.failures for d in summary.datasets),
            "reason": summary.reason.value,
        }

    result = asyncio.run(main())
    result["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    conn.send(result)


def _bare_child(
    url: str, requests: int, concurrency: int, provider: dict[str, Any], conn: Any
) -> None:
    """The baseline: a bare aiohttp loop sending the same requests (no routing, no money).

    It sends the runner's ``provider`` object, so both reach the same endpoints (the
    simulator's providers differ in latency; without it OpenRouter's default spread
    answers faster than the endpoint the runner's route plan puts first).
    """
    _uvloop()
    import aiohttp

    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Task: one line."}],
            "max_tokens": MAX_TOKENS,
            "provider": provider,
        }
    ).encode()

    async def main() -> dict[str, float]:
        connector = aiohttp.TCPConnector(limit=concurrency)
        headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        latencies: list[float] = []
        async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
            started = 0

            async def worker() -> None:
                nonlocal started
                while started < requests:
                    started += 1
                    sent = time.perf_counter()
                    async with session.post(f"{url}/chat/completions", data=body) as response:
                        json.loads(await response.read())
                    latencies.append(time.perf_counter() - sent)

            t0 = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            wall = time.perf_counter() - t0
        latencies.sort()
        return {
            "wall": wall,
            "mean_latency": sum(latencies) / len(latencies),
            "max_latency": latencies[-1],
        }

    conn.send(asyncio.run(main()))


def _child(target: Any, *args: Any) -> dict[str, Any]:
    parent, child = mp.Pipe()
    process = mp.get_context("fork").Process(target=target, args=(*args, child))
    process.start()
    child.close()  # so that recv() raises EOFError, not waits forever, if the child dies
    result: dict[str, Any] = parent.recv()
    process.join()
    return result


# --- sections -----------------------------------------------------------------------------


def throughput(requests: int, concurrency: int, speed: float, rounds: int = 1) -> None:
    latency = BASE_LATENCY / speed
    ideal = requests * latency / concurrency
    print(
        f"\n## throughput: {requests:,} requests, 2 datasets, {concurrency:,} in flight, "
        f"latency {latency * 1000:.0f} ms ({COMPLETION_TOKENS} tokens), ideal {ideal:.2f} s"
    )
    print(
        "| round | loop | wall s | vs ideal | vs bare | CPU s per 1,000 | peak RSS MB "
        "| mean / max latency s |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    sim = Sim(speed)
    try:
        provider = _provider_object(sim.url)
        for n in range(1, rounds + 1):
            bare = _child(_bare_child, sim.url, requests, concurrency, provider)
            with tempfile.TemporaryDirectory() as tmp:
                _write_prompts(Path(tmp), requests)
                ours = _child(_run_child, sim.url, tmp, concurrency)
            print(
                f"| {n} | bare aiohttp | {bare['wall']:.2f} | {bare['wall'] / ideal:.3f}× | "
                f"1.000× | - | - | {bare['mean_latency']:.2f} / {bare['max_latency']:.2f} |"
            )
            print(
                f"| {n} | batch runner | {ours['wall']:.2f} | {ours['wall'] / ideal:.3f}× | "
                f"{ours['wall'] / bare['wall']:.3f}× | "
                f"{ours['cpu'] / ours['requests'] * 1000:.2f} | {ours['rss_mb']:.0f} | - |",
                flush=True,
            )
            if ours["failures"] or ours["reason"] != "complete":
                print(f"(runner: {ours['failures']} failures, {ours['reason']})")
    finally:
        sim.stop()


def memory(lines: int, concurrency: int, speed: float) -> None:
    sim = Sim(speed)
    rows = []
    try:
        for total in (lines, lines * 5):
            with tempfile.TemporaryDirectory() as tmp:
                _write_prompts(Path(tmp), total)
                result = _child(_run_child, sim.url, tmp, concurrency)
            rows.append((total, result))
    finally:
        sim.stop()
    print(f"\n## memory: peak RSS of the runner at {concurrency:,} in flight")
    print("| input lines | requests | peak RSS MB | ratio |")
    print("|---:|---:|---:|---:|")
    base = rows[0][1]["rss_mb"]
    for total, result in rows:
        print(
            f"| {total:,} | {result['requests']:,} | {result['rss_mb']:.0f} | "
            f"{result['rss_mb'] / base:.2f}× |"
        )


def _resume_child(url: str, directory: str, done: int, conn: Any) -> None:
    _uvloop()
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    from provider_router.jobs import FileJournal, JobRunner, standard_observers

    work = Path(directory)
    paths = [work / f"{name}.jsonl" for name in DATASETS]

    async def main() -> dict[str, float]:
        t0 = time.perf_counter()
        journal = FileJournal.open(work / "out")
        load = time.perf_counter() - t0
        journal.close("bench")
        runner = JobRunner(
            _plan(paths, 64),
            work / "out",
            base_url=url,
            api_key=KEY,
            observers=standard_observers(),
        )
        t0 = time.perf_counter()
        task = asyncio.ensure_future(runner.run())
        for _ in range(10**7):  # until the first completion beyond the journal's
            if runner._datasets and sum(d.tally.completed for d in runner._datasets) > done:
                break
            if task.done():  # the run ended (or was refused) before any new completion
                task.result()
                raise RuntimeError("the resumed run ended without a new completion")
            await asyncio.sleep(0.001)
        first = time.perf_counter() - t0
        runner.stop()
        await task
        return {"load": load, "first": first}

    conn.send(asyncio.run(main()))


async def _job_ledger(path: Path, spent: Decimal) -> None:
    from provider_router import SQLiteLedger

    ledger = SQLiteLedger(path, Decimal(100_000))
    # It holds what the journal's outputs cost: a ledger behind them is refused.
    reservation = await ledger.reserve(spent, key="bench")
    await ledger.settle(reservation, spent)
    await ledger.close()


def resume(done: int) -> None:
    from provider_router.jobs import FileJournal
    from provider_router.jobs.datasets import input_fingerprint
    from provider_router.jobs.identity import manifest_of
    from provider_router.jobs.store.manifest import write_manifest
    from provider_router.planning import PromptReader

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        paths = _write_prompts(work, done + 2 * 50)
        t0 = time.perf_counter()
        journal = FileJournal.open(work / "out")
        record = b'{"id":"x"}\n'
        per = done // len(DATASETS)
        for name, path in zip(DATASETS, paths, strict=True):
            # As a run of this release leaves it: its inputs recorded, its rows checked
            # against them, and the job's manifest beside them.
            journal.record_inputs(name, input_fingerprint((path,)))
            journal.record_checked(name, input_fingerprint((path,)))
            for n, prompt in enumerate(PromptReader([path])):
                if n >= per:
                    break
                journal.claim(name, prompt.id)
                journal.complete(
                    name,
                    prompt.id,
                    record,
                    output_tokens=10,
                    prompt_tokens=5,
                    cost_units=1,
                    location=prompt.location,
                )
                if n % 500 == 0:
                    journal.flush()
        spent = journal.committed_cost
        journal.close("bench")
        write_manifest(work / "out", manifest_of(_plan(paths, 64)))
        # The job's own ledger beside its journal: a journal that shows money spent
        # without it is refused (the budget never resets silently).
        asyncio.run(_job_ledger(work / "out" / "ledger.sqlite", spent))
        built = time.perf_counter() - t0
        size = (work / "out" / "journal.jsonl").stat().st_size
        sim = Sim(float("inf"))
        try:
            result = _child(_resume_child, sim.url, tmp, done)
        finally:
            sim.stop()
        shutil.rmtree(work / "out", ignore_errors=True)
    print(
        f"\n## resume: journal of {done:,} completed ids ({size / 1e6:.0f} MB, built in "
        f"{built:.0f} s)"
    )
    print("| step | seconds |")
    print("|---|---:|")
    print(f"| open the journal alone (baseline) | {result['load']:.2f} |")
    print(f"| start the runner → first new request done | {result['first']:.2f} |")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench batch")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=2_000)
    parser.add_argument("--speed", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=1, help="throughput rounds (bare, runner)")
    parser.add_argument("--resume-ids", type=int, default=1_000_000)
    parser.add_argument("--sections", default="throughput,memory,resume")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.resume_ids = 4_000, 100_000
    sections = set(args.sections.split(","))
    import structlog  # quiet the parent's own catalog fetch

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    print(f"python {sys.version.split()[0]}; budget-free plan (${Decimal(100000)}), model {MODEL}")
    if "throughput" in sections:
        throughput(args.requests, args.concurrency, args.speed, args.rounds)
    if "memory" in sections:
        memory(args.requests, args.concurrency, args.speed * 10)
    if "resume" in sections:
        resume(args.resume_ids)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
