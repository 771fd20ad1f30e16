"""Ledger benchmarks: reserve+settle pairs per second and CPU per pair, per backend.

Run: ``python -m bench ledger`` (``--quick`` for a smaller run). Each scenario runs
``--tasks`` coroutines that loop reserve → settle on a budget that never runs out.
CPU is the process's user + system time (it includes the SQLite writer thread),
divided by the pairs done. Baselines in the same run: the memory ledger (the floor)
and SQLite with one transaction per operation (a single caller, so no batch ever
holds more than one op: what a ledger without group commit costs).

"four processes" runs four copies of the grouped scenario at once against one
store (one SQLite file, one Redis); CPU is the sum over the four.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

from provider_router import Ledger, MemoryLedger, RedisLedger, SQLiteLedger

AMOUNT = Decimal("0.01")
COST = Decimal("0.003141592653")


def _make(kind: str, target: str, name: str) -> Ledger:
    limit = Decimal(10**6)
    if kind == "memory":
        return MemoryLedger(limit)
    if kind == "redis":
        return RedisLedger(target, name, Decimal(9000))
    executor = "loop" if kind == "sqlite-loop" else "thread"
    return SQLiteLedger(target, None, executor=executor)


async def _pairs(ledger: Ledger, pairs: int, tasks: int) -> None:
    per_task = pairs // tasks

    async def loop() -> None:
        for _ in range(per_task):
            res = await ledger.reserve(AMOUNT, key="k")
            await ledger.settle(res, COST, estimate=AMOUNT)

    await asyncio.gather(*(loop() for _ in range(tasks)))


def _run(kind: str, target: str, name: str, pairs: int, tasks: int) -> tuple[float, float]:
    """One scenario in this process: (wall seconds, CPU seconds)."""
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run

    async def main() -> tuple[float, float]:
        async with _make(kind, target, name) as ledger:
            await _pairs(ledger, min(pairs, 64), min(tasks, 64))  # warm-up
            wall, cpu = time.perf_counter(), time.process_time()
            await _pairs(ledger, pairs, tasks)
            return time.perf_counter() - wall, time.process_time() - cpu

    result: tuple[float, float] = runner(main())
    return result


def _child(args: tuple[str, str, str, int, int], out: Any) -> None:
    out.put(_run(*args))


def _parallel(
    kind: str, target: str, name: str, pairs: int, tasks: int, procs: int
) -> tuple[float, float]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    workers = [
        ctx.Process(target=_child, args=((kind, target, name, pairs, tasks), queue))
        for _ in range(procs)
    ]
    for w in workers:
        w.start()
    results = [queue.get() for _ in workers]
    for w in workers:
        w.join()
    # Each child times its own measured phase; they overlap, so the slowest is the wall.
    return max(r[0] for r in results), sum(r[1] for r in results)


def _prepare(kind: str, tmp: Path, redis_url: str | None, tag: str) -> tuple[str, str]:
    if kind == "memory":
        return "", ""
    if kind == "redis":
        assert redis_url is not None
        name = f"bench-{tag}"
        asyncio.run(_create_redis(redis_url, name))
        return redis_url, name
    path = tmp / f"{tag}.ledger"
    asyncio.run(_create_sqlite(path))
    return str(path), ""


async def _create_sqlite(path: Path) -> None:
    async with SQLiteLedger(path, Decimal(10**6)) as ledger:
        await ledger.snapshot()


async def _create_redis(url: str, name: str) -> None:
    async with RedisLedger(url, name, Decimal(9000)) as ledger:
        await ledger.snapshot()


def _start_redis() -> tuple[subprocess.Popen[str] | None, str | None]:
    binary = shutil.which("redis-server")
    if binary is None:
        print("redis-server not found: skipping the Redis rows", file=sys.stderr)
        return None, None
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(  # noqa: S603 - fixed arguments
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if "Ready to accept connections" in line:
            break
    proc.stdout.close()
    return proc, f"redis://127.0.0.1:{port}/0"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench ledger")
    parser.add_argument("--quick", action="store_true", help="fewer pairs")
    parser.add_argument("--tasks", type=int, default=256, help="concurrent coroutines")
    args = parser.parse_args(argv)
    scale = 0.2 if args.quick else 1.0

    def n(pairs: int) -> int:
        return max(int(pairs * scale) // args.tasks * args.tasks, args.tasks)

    redis_proc, redis_url = _start_redis()
    rows: list[tuple[str, int, float, float]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp_dir:
            tmp = Path(tmp_dir)
            scenarios: list[tuple[str, str, int, int, int]] = [
                ("memory", "memory", n(200_000), args.tasks, 1),
                ("sqlite, one transaction per op", "sqlite", 400, 1, 1),
                ("sqlite, grouped (thread)", "sqlite", n(40_000), args.tasks, 1),
                ("sqlite, grouped (in-loop)", "sqlite-loop", n(40_000), args.tasks, 1),
                ("sqlite, grouped, 4 processes", "sqlite", n(20_000), args.tasks, 4),
            ]
            if redis_url is not None:
                scenarios += [
                    ("redis, one script call per op", "redis", 2_000, 1, 1),
                    ("redis, grouped", "redis", n(40_000), args.tasks, 1),
                    ("redis, grouped, 4 processes", "redis", n(20_000), args.tasks, 4),
                ]
            for i, (label, kind, pairs, tasks, procs) in enumerate(scenarios):
                target, name = _prepare(kind, tmp, redis_url, f"s{i}")
                if procs == 1:
                    wall, cpu = _run(kind, target, name, pairs, tasks)
                else:
                    wall, cpu = _parallel(kind, target, name, pairs, tasks, procs)
                total = pairs * procs
                rows.append((label, total, total / wall, cpu / total * 1e6))
                print(
                    f"  {label}: {total / wall:,.0f} pairs/s, {cpu / total * 1e6:.1f} µs CPU/pair",
                    file=sys.stderr,
                )
    finally:
        if redis_proc is not None:
            redis_proc.terminate()
            redis_proc.wait()

    base_cpu = rows[1][3]
    machine = f"{platform.machine()}, {mp.cpu_count()} cores"
    print(f"\nmachine: {machine}, Python {platform.python_version()}")
    print(f"concurrent coroutines: {args.tasks}; synchronous=FULL, WAL\n")
    print("| scenario | pairs | pairs/s | CPU µs per pair | CPU vs one txn per op |")
    print("|---|---:|---:|---:|---:|")
    for label, total, rate, cpu_us in rows:
        print(f"| {label} | {total:,} | {rate:,.0f} | {cpu_us:.1f} | {cpu_us / base_cpu:.2f}× |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
