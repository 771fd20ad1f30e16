"""A worker process for the multi-process ledger tests (run as a script).

``spend BACKEND TARGET NAME LIMIT``: reserve/settle with 16 concurrent tasks until
the budget is exhausted, then print the sum of its settled costs.
``hold BACKEND TARGET NAME``: open three reservations (one with a generation id),
print ``ready`` and wait to be killed.
"""

from __future__ import annotations

import asyncio
import random
import sys
from decimal import Decimal

from provider_router import BudgetExhausted, Ledger, RedisLedger, SQLiteLedger


def open_ledger(backend: str, target: str, name: str, limit: Decimal | None) -> Ledger:
    if backend == "redis":
        return RedisLedger(target, name, limit)
    return SQLiteLedger(target, limit)


async def spend(ledger: Ledger, seed: int) -> Decimal:
    rng = random.Random(seed)
    spent: list[Decimal] = []

    async def task() -> None:
        while True:
            amount = Decimal(rng.randint(1, 50)) / 1000
            try:
                res = await ledger.reserve(amount, key="w", wait=True)
            except BudgetExhausted:
                return
            await asyncio.sleep(0)
            cost = amount * rng.randint(1, 100) / 100
            await ledger.settle(res, cost)
            spent.append(cost)

    await asyncio.gather(*(task() for _ in range(16)))
    return sum(spent, Decimal(0))


async def main(argv: list[str]) -> None:
    mode, backend, target, name = argv[:4]
    async with open_ledger(backend, target, name, None) as ledger:
        if mode == "spend":
            print(await spend(ledger, int(argv[4])), flush=True)
            return
        first = await ledger.reserve(Decimal("1"), key="with-generation")
        await ledger.attach(first, "gen-first")
        await ledger.reserve(Decimal("2"), key="unknown")
        await ledger.reserve(Decimal("3"), key="also-unknown")
        print("ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
