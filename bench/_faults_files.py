"""The fault campaign's job-file rows (issue #21): each job file lost, cut or locked.

Part of ``python -m bench faults`` (``--only files,locked``). Each row runs
``provider-router run`` as a user would, against the local OpenRouter:

1. a first run stops on its budget (exit 3), as in the issue;
2. one of the job's files is damaged: the journal cut at a line boundary (each of
   the first 10) or at a random byte, with the ledger in place or moved away; the
   ledger moved; the ledger's ``-wal`` removed after a kill -9;
3. the same command runs again, and its exit code and one-line message are kept;
   a refusal must have left every file as it was;
4. what was refused is restored (the moved file put back), and the job is run to
   its end with a budget that finishes it.

The lock rows hold ``BEGIN EXCLUSIVE`` on ``ledger.sqlite`` from this process for
5 s and 60 s while a run is sending (it must wait, then finish), and for 60 s
before a run starts (it must say the ledger is locked, by which process, and
change nothing).

Per row: **overspend** (the simulator's charges after the rerun above the budget
it ran with: a budget reset shows here), **paid lost** (generation ids of the
first run's outputs missing at the end), **paid twice** (charged requests beyond
one per kept output; a kill's abandoned requests excepted), **forgotten**
(charges the ledger does not hold), and the rerun's **message**.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

FIRST_BUDGET = Decimal("0.05")
FINISH_BUDGET = Decimal(10)

HEADER = (
    "| row | rerun exit | overspend | paid lost | paid twice | forgotten | files kept "
    "on refusal | message | |\n|---|---|---|---|---|---|---|---|---|"
)


@dataclass
class FileRow:
    """What one damaged or locked job did to the money, the outputs and the operator."""

    name: str
    rerun_exit: int | None = None
    overspend: Decimal = Decimal(0)
    paid_lost: int = 0
    paid_twice: int = 0
    forgotten: Decimal = Decimal(0)
    unchanged: bool | None = None
    message: str = ""
    truthful: bool = True
    seconds: float = 0.0

    def ok(self) -> bool:
        return (
            self.overspend == 0
            and self.paid_lost == 0
            and self.paid_twice == 0
            and self.forgotten == 0
            and self.unchanged is not False
            and self.truthful
        )

    def row(self) -> str:
        kept = "n/a" if self.unchanged is None else ("yes" if self.unchanged else "NO")
        message = self.message if len(self.message) <= 140 else self.message[:139] + "…"
        return (
            f"| {self.name} | {self.rerun_exit} | ${self.overspend:.6f} | {self.paid_lost} | "
            f"{self.paid_twice} | ${self.forgotten:.6f} | {kept} | {message} | "
            f"{'ok' if self.ok() else 'FAIL'} |"
        )


def _snapshot(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


def _generations(job: Any) -> list[str]:
    path = job.out / "p.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["generation_id"] for line in path.read_text().splitlines()]


def _message(stderr: bytes) -> str:
    """The rerun's one line: its error, else what it repaired or waited for, else its last."""
    lines = [line.strip() for line in stderr.decode(errors="replace").splitlines() if line.strip()]
    for marker in ("error: ", "resumed: ", "locked by another process"):
        found = [line for line in lines if marker in line]
        if found:
            return found[0]
    return lines[-1] if lines else ""


async def _run(job: Any) -> tuple[int, bytes]:
    proc = await job.start()
    _, stderr = await proc.communicate()
    return proc.returncode or 0, stderr


def _charged_requests(sim: Any) -> int:
    """Charged prompt requests (each run's 1-token preflight is not a prompt)."""
    return sum(1 for r in sim.requests if r.cost_units and r.max_tokens != 1)


# --- damage ------------------------------------------------------------------------


Damage = Callable[[Path, Path, random.Random], None]


def cut_lines(lines: int) -> Damage:
    def damage(out: Path, keep: Path, rng: random.Random) -> None:
        path = out / "journal.jsonl"
        shutil.copy(path, keep / path.name)
        path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:lines]))

    return damage


def cut_random_byte(out: Path, keep: Path, rng: random.Random) -> None:
    path = out / "journal.jsonl"
    shutil.copy(path, keep / path.name)
    data = path.read_bytes()
    path.write_bytes(data[: rng.randrange(1, len(data))])


def move_ledger(out: Path, keep: Path, rng: random.Random) -> None:
    for path in out.glob("ledger.sqlite*"):
        shutil.move(path, keep / path.name)


def both(*damages: Damage) -> Damage:
    def damage(out: Path, keep: Path, rng: random.Random) -> None:
        for one in damages:
            one(out, keep, rng)

    return damage


def _restore(out: Path, keep: Path) -> None:
    for path in keep.iterdir():
        shutil.copy(path, out / path.name)


# --- the rows ------------------------------------------------------------------------


async def file_row(name: str, damage: Damage | None, job: Any, sim: Any, seed: int) -> FileRow:
    """One damage of a job stopped by its budget (``None``: the -wal removed after a kill)."""
    started = time.monotonic()
    row = FileRow(name)
    keep = job.root / "kept"
    keep.mkdir()
    first = dataclasses.replace(job, budget=FIRST_BUDGET)
    abandoned = 0
    if damage is None:  # the -wal removed after a kill -9
        proc = await first.start()
        while first.records() < 20 and proc.returncode is None:  # noqa: ASYNC110 - a file
            await asyncio.sleep(0.005)
        proc.kill()
        await proc.wait()
        abandoned = _open_rows(job.out / "ledger.sqlite")
        for path in job.out.glob("ledger.sqlite-*"):
            shutil.move(path, keep / path.name)
    else:
        code, stderr = await _run(first)
        if code != 3:
            row.message = f"first run exit {code}: {_message(stderr)}"
            row.truthful = False
        damage(job.out, keep, random.Random(seed))
    paid_before = set(_generations(job))
    before = _snapshot(job.out)
    row.rerun_exit, stderr = await _run(first)
    await sim.simulator.settle_abandoned(now=True)
    row.overspend = max(sim.simulator.usage - FIRST_BUDGET, Decimal(0))
    row.message = _message(stderr)
    if row.rerun_exit in (0, 3, 5):  # accepted: it must have kept what was paid
        row.truthful = "cut" not in row.message or "paid" in row.message
    else:
        row.unchanged = _snapshot(job.out) == before
        row.truthful = "restore" in row.message.lower() or "locked" in row.message
        _restore(job.out, keep)
    await dataclasses.replace(job, budget=FINISH_BUDGET).finish()
    await _audit(row, job, sim, paid_before, abandoned)
    row.seconds = time.monotonic() - started
    return row


async def lock_row(seconds: float, *, at_start: bool, job: Any, sim: Any) -> FileRow:
    """``ledger.sqlite`` held under ``BEGIN EXCLUSIVE`` for ``seconds`` by this process."""
    started = time.monotonic()
    row = FileRow(f"ledger locked {seconds:g} s {'before start' if at_start else 'mid-run'}")
    finish = dataclasses.replace(job, budget=FINISH_BUDGET)
    ledger = job.out / "ledger.sqlite"
    if at_start:
        await _run(dataclasses.replace(job, budget=FIRST_BUDGET))
        paid_before = set(_generations(job))
        # Before the lock: closing any descriptor of the file (reading it) would drop
        # this process's POSIX locks on it, SQLite's included.
        before = _snapshot(job.out)
        con = _lock(ledger)
        proc = await finish.start()
    else:
        paid_before = set()
        proc = await finish.start()
        while job.records() < 20 and proc.returncode is None:  # noqa: ASYNC110 - a file
            await asyncio.sleep(0.005)
        con = _lock(ledger)
    waiter = asyncio.ensure_future(proc.communicate())
    await asyncio.wait([waiter], timeout=seconds)
    con.rollback()
    con.close()
    _, stderr = await waiter
    row.rerun_exit = proc.returncode
    row.message = _message(stderr)
    if at_start:  # held past the open's busy timeout (30 s): refused, nothing written
        row.unchanged = _snapshot(job.out) == before
        row.truthful = row.rerun_exit != 0 and "is locked by another process" in row.message
    else:
        row.truthful = row.rerun_exit == 0 and "damaged" not in row.message
        if row.truthful:
            row.message = row.message or "complete"
    await finish.finish()
    await _audit(row, job, sim, paid_before, 0)
    row.overspend = max(sim.simulator.usage - FINISH_BUDGET, Decimal(0))
    row.seconds = time.monotonic() - started
    return row


def _lock(path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(path, timeout=30, isolation_level=None)
    con.execute("BEGIN EXCLUSIVE")
    return con


def _open_rows(path: Path) -> int:
    try:
        con = sqlite3.connect(path, timeout=30)
        try:
            (n,) = con.execute("SELECT count(*) FROM reservations WHERE state = 'open'").fetchone()
        finally:
            con.close()
    except sqlite3.Error:
        return 0
    return int(n)


async def _audit(row: FileRow, job: Any, sim: Any, paid_before: set[str], abandoned: int) -> None:
    from bench.bench_faults import ledger_spent

    await sim.simulator.settle_abandoned(now=True)
    generations = _generations(job)
    ids = job.ids()
    row.paid_lost = len(paid_before - set(generations))
    row.paid_twice = max(_charged_requests(sim) - len(set(ids)) - abandoned, 0) + (
        len(ids) - len(set(ids))
    )
    row.forgotten = max(sim.simulator.usage - ledger_spent(job.out / "ledger.sqlite"), Decimal(0))
    if len(set(ids)) != job.prompts:
        row.truthful = False
        row.message += f" [only {len(set(ids))} of {job.prompts} prompts done]"


def damages(quick: bool, seed: int) -> list[tuple[str, Damage | None]]:
    """The rows: every truncation of each job file (fewer with ``--quick``)."""
    boundaries = (2, 4, 6) if quick else tuple(range(1, 11))
    rows: list[tuple[str, Damage | None]] = []
    rows += [(f"journal cut after line {n}", cut_lines(n)) for n in boundaries]
    rows += [
        (f"journal cut after line {n} + ledger moved", both(cut_lines(n), move_ledger))
        for n in boundaries
    ]
    for n in range(1 if quick else 3):
        rows.append((f"journal cut at a random byte #{n + 1}", cut_random_byte))
        rows.append(
            (
                f"journal cut at a random byte #{n + 1} + ledger moved",
                both(cut_random_byte, move_ledger),
            )
        )
    rows.append(("ledger moved", move_ledger))
    rows.append(("WAL removed after kill -9", None))
    return rows


async def rows(args: Any, only: set[str] | None, job_for: Callable[..., Any]) -> list[FileRow]:
    """Run the job-file and lock rows; ``job_for(root, sim)`` builds a scenario's job."""
    from bench.bench_faults import KEY
    from provider_router.testing import SimulatorServer

    plan: list[tuple[str, Callable[[Any, Any], Any]]] = []
    if only is None or "files" in only:
        for index, (name, damage) in enumerate(damages(args.quick, args.seed)):
            plan.append(
                (name, lambda j, s, n=name, d=damage, i=index: file_row(n, d, j, s, args.seed + i))
            )
    if only is None or "locked" in only:
        plan += [
            ("lock 5", lambda j, s: lock_row(5, at_start=False, job=j, sim=s)),
            ("lock 60", lambda j, s: lock_row(60, at_start=False, job=j, sim=s)),
            ("lock 60 start", lambda j, s: lock_row(60, at_start=True, job=j, sim=s)),
        ]
    if not plan:
        return []
    print(HEADER, flush=True)
    done: list[FileRow] = []
    for _name, run in plan:
        root = Path(tempfile.mkdtemp(prefix="faults-files-"))
        try:
            async with SimulatorServer(
                api_keys=[KEY], credits=10**6, speed=args.speed, seed=args.seed,
                cancellation="none", log_limit=10**6,
            ) as sim:  # fmt: skip
                job = job_for(root, sim)
                row = await run(job, sim)
                done.append(row)
                print(row.row(), f"{row.seconds:.0f} s", flush=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return done
