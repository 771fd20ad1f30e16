"""Redis's own CPU per reserve+settle pair spent in the ledger's Lua script.

Run: ``python -m bench redis_script`` (``--pairs``, ``--rounds``). The client-side
benchmark (``python -m bench ledger``) measures the calling process; this one reads
Redis's counters (``INFO commandstats`` after ``CONFIG RESETSTAT``): the ``usec`` of
every ``evalsha`` divided by the pairs, grouped (256 coroutines) and one op per call.
To compare with another release, run this file directly with ``PYTHONPATH`` pointing
at that release's checkout (``git archive REV | tar -x -C DIR``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from decimal import Decimal
from typing import Any

from bench.bench_ledger import _start_redis


async def _measure(url: str, name: str, pairs: int, tasks: int) -> tuple[int, float]:
    import redis.asyncio as aioredis

    from provider_router import RedisLedger

    admin: Any = aioredis.Redis.from_url(url)
    async with RedisLedger(url, name, Decimal(9000)) as ledger:

        async def loop(count: int) -> None:
            for _ in range(count):
                res = await ledger.reserve(Decimal("0.01"), key="k")
                await ledger.settle(res, Decimal("0.003141592653"), estimate=Decimal("0.01"))

        await asyncio.gather(*(loop(8) for _ in range(8)))  # warm-up: script loaded
        await admin.config_resetstat()
        await asyncio.gather(*(loop(pairs // tasks) for _ in range(tasks)))
    stats = await admin.info("commandstats")
    await admin.aclose()
    done = pairs // tasks * tasks
    return done, stats["cmdstat_evalsha"]["usec"] / done


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench redis_script")
    parser.add_argument("--pairs", type=int, default=40_000, help="pairs per grouped round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    proc, url = _start_redis()
    if proc is None or url is None:
        return 1
    try:
        print("| scenario | pairs | Redis µs per pair |")
        print("|---|---:|---:|")
        for round_ in range(args.rounds):
            for label, pairs, tasks in (
                ("grouped, 256 coroutines", args.pairs, 256),
                ("one op per call", 2_000, 1),
            ):
                done, usec = asyncio.run(_measure(url, f"script-{round_}-{tasks}", pairs, tasks))
                print(f"| {label} | {done:,} | {usec:.1f} |")
    finally:
        proc.terminate()
        proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
