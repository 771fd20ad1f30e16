"""What the SQLite ledger adds to a request, without the network (#13 wave 3).

Run: ``python -m bench ledger_path`` (``--rounds``, ``--n``, ``--workers``,
``--latency``, ``--per-commit``). Two measurements, each in a fresh process:

* **paced**: ``--workers`` coroutines loop reserve → ``sleep(--latency)`` → settle,
  started at random offsets (the shape of ``bench perf``'s load, without HTTP), on
  a ``MemoryLedger`` (the baseline, same run) and on a ``SQLiteLedger`` (WAL,
  ``synchronous=FULL``, the defaults). Reported: the process's CPU per request
  (user + system, every thread) minus the baseline's, commits and operations per
  commit, and the mean extra time a request spends in the two ledger calls.
* **store**: the SQLite store alone (no event loop, no futures), ``--per-commit``
  reserves plus as many settles per transaction, the settles closing rows written
  100 transactions earlier, cyclic GC off: CPU per request, best of three; and the
  WAL pages each such commit writes (every page is written and fsync'd again by
  the commit, so they are most of its cost with ``synchronous=FULL``).

``bench perf`` moves ±5 % between runs on a shared machine; these move far less,
so a change of a few microseconds per request shows. Compare two trees by running
this from each (``PYTHONPATH=<tree>``) alternately in the same minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

AMOUNT = Decimal("0.0123456")
COST = Decimal("0.003141592653")


def _cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


async def _paced(kind: str, n: int, workers: int, latency: float, tmp: str) -> dict[str, Any]:
    from provider_router import Ledger, MemoryLedger, SQLiteLedger

    ledger: Ledger = (
        MemoryLedger(Decimal(10**6))
        if kind == "memory"
        else SQLiteLedger(Path(tmp) / "paced.ledger", Decimal(10**6))
    )
    commits, ops = 0, 0
    store = getattr(ledger, "_store", None)
    if store is not None:  # count transactions (every batch opens one)
        staged = store.stage if hasattr(store, "stage") else store.apply

        def counted(batch: list[Any]) -> Any:
            nonlocal commits, ops
            commits, ops = commits + 1, ops + len(batch)
            return staged(batch)

        setattr(store, "stage" if hasattr(store, "stage") else "apply", counted)
    rnd = random.Random(7)
    in_ledger = 0.0

    async def worker() -> None:
        nonlocal in_ledger
        await asyncio.sleep(rnd.random() * latency)
        for _ in range(n // workers):
            t0 = time.perf_counter()
            res = await ledger.reserve(AMOUNT, key="req-1", wait=600)
            await asyncio.sleep(latency)
            await ledger.settle(res, COST, estimate=AMOUNT)
            in_ledger += time.perf_counter() - t0 - latency

    async with ledger:
        cpu = _cpu()
        await asyncio.gather(*(worker() for _ in range(workers)))
        cpu = _cpu() - cpu
    done = n // workers * workers
    return {
        "cpu_us": cpu / done * 1e6,
        "commits": commits,
        "ops_per_commit": ops / commits if commits else 0.0,
        "ledger_ms": in_ledger / done * 1e3,
    }


def _store(per_commit: int, requests: int) -> float:
    """CPU µs per request of the store alone (one reserve and one settle each)."""
    from provider_router.ledger import _group_commit as b
    from provider_router.ledger import sqlite as s

    best = float("inf")
    for _ in range(3):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "store.ledger"
            con = s._connect(path, "FULL", s._BUSY_TIMEOUT_MS)
            s._open_totals(con, path, Decimal(10**6), keep_limit=False)
            store = s._Store(con, "bench:1:x", 60.0, time.time, s._BUSY_TIMEOUT_MS)
            held: list[list[tuple[str, int]]] = []
            seq = 0
            gc.disable()
            cpu = _cpu()
            for _ in range(requests // per_commit):
                batch = []
                if len(held) >= 100:
                    for rid, units in held.pop(0):
                        op = b.Op(b.SETTLE, rid, units)
                        op.cost, op.estimate = 3141592653, 12345678900
                        batch.append(op)
                new = []
                for _ in range(per_commit):
                    seq += 1
                    op = b.Op(b.RESERVE, f"0123456789abcdef.{seq}", 12345600000, f"req-{seq}")
                    batch.append(op)
                    new.append((op.id, op.units))
                held.append(new)
                store.apply(batch)
            cpu = _cpu() - cpu
            gc.enable()
            con.close()
        best = min(best, cpu / (requests // per_commit * per_commit) * 1e6)
    return best


def _wal_pages(per_commit: int, commits: int = 600) -> float:
    """WAL pages written per commit by the store in the same pattern as :func:`_store`."""
    from provider_router.ledger import _group_commit as b
    from provider_router.ledger import sqlite as s

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "store.ledger"
        wal = Path(f"{path}-wal")
        con = s._connect(path, "FULL", s._BUSY_TIMEOUT_MS)
        s._open_totals(con, path, Decimal(10**6), keep_limit=False)
        con.execute("PRAGMA wal_autocheckpoint = 0")  # the WAL's size counts the pages
        frame = con.execute("PRAGMA page_size").fetchone()[0] + 24
        store = s._Store(con, "bench:1:x", 60.0, time.time, s._BUSY_TIMEOUT_MS)
        held: list[list[tuple[str, int]]] = []
        pages = 0
        for seq in range(commits):
            if seq % 100 == 0:  # keep the WAL short, as the auto-checkpoint does
                pages += (wal.stat().st_size - 32) // frame if wal.exists() else 0
                con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            batch = []
            if len(held) >= 100:
                for rid, units in held.pop(0):
                    op = b.Op(b.SETTLE, rid, units)
                    op.cost, op.estimate, op.provider = 3141592653, 12345678900, "chutes"
                    op.generation_id = f"gen-{seq}-abcdefghijklmnopqrst"
                    batch.append(op)
            new = [
                b.Op(b.RESERVE, f"0123456789abcdef.{seq}.{i}", 12345600000, f"req-{seq}.{i}")
                for i in range(per_commit)
            ]
            held.append([(op.id, op.units) for op in new])
            store.apply(batch + new)
        pages += (wal.stat().st_size - 32) // frame
        con.close()
    return pages / commits


def _child(argv: list[str]) -> int:
    what = argv[0]
    if what == "store":
        print(json.dumps({"cpu_us": _store(int(argv[1]), int(argv[2]))}))
        return 0
    if what == "pages":
        print(json.dumps({"pages": _wal_pages(int(argv[1]))}))
        return 0
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    kind, n, workers, latency = argv[1], int(argv[2]), int(argv[3]), float(argv[4])
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(asyncio.run(_paced(kind, n, workers, latency, tmp))))
    return 0


def _run(*args: object) -> dict[str, Any]:
    done = subprocess.run(  # noqa: S603 - our own fixed command
        [sys.executable, "-m", "bench.bench_ledger_path", "--child", *map(str, args)],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ),
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--child":
        return _child(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m bench ledger_path", description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--n", type=int, default=6000, help="requests per paced run")
    parser.add_argument("--workers", type=int, default=1500)
    parser.add_argument("--latency", type=float, default=1.5, help="seconds held per request")
    parser.add_argument("--per-commit", default="10,25", help="store: requests per commit")
    args = parser.parse_args(argv)
    print(f"load {os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for r in range(args.rounds):
        memory = _run("paced", "memory", args.n, args.workers, args.latency)
        sqlite = _run("paced", "sqlite", args.n, args.workers, args.latency)
        print(
            f"paced round {r + 1}: memory {memory['cpu_us']:.1f} µs/req, sqlite "
            f"{sqlite['cpu_us']:.1f} (+{sqlite['cpu_us'] - memory['cpu_us']:.1f}), "
            f"{sqlite['commits']} commits of {sqlite['ops_per_commit']:.1f} ops, "
            f"{sqlite['ledger_ms']:.1f} ms per request in the ledger calls "
            f"(memory {memory['ledger_ms']:.1f})"
        )
    for k in args.per_commit.split(","):
        store = _run("store", int(k), 8000)
        pages = _run("pages", int(k))
        print(
            f"store, {k} requests per commit: {store['cpu_us']:.1f} µs/req, "
            f"{pages['pages']:.1f} WAL pages per commit"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
