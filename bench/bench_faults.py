"""The fault campaign (issue #10): every cent accounted through crashes and faults.

Run: ``python -m bench faults`` (``--quick`` for the small version the ``slow`` test
runs; ``--seed``, ``--kills``, ``--only NAME,...``). Each scenario runs the batch
CLI (``provider-router run``, one child process per run) or, where a fault must be
injected into the process itself, its :class:`~provider_router.jobs.JobRunner`, against
the local OpenRouter in this process with ``cancellation="none"``: a request whose
client went away (a kill, a timeout) is still generated and billed in full, as a
provider that does not cancel does (the cache rows, ``bench/faults_cache.py``, take
each provider's own way). After each scenario a clean run resumes the job
to its end, then the simulator's exact charge record is compared with the ledger.

Per scenario it prints:

* **lost**: prompts of the input with no output after the final run;
* **dup**: prompts with more than one output;
* **overspend**: simulator charges above the budget;
* **forgotten**: simulator charges the ledger does not hold (charges − ledger spent);
* **burned**: ledger spent above the simulator's charges, as a share of the worst
  case of the requests in flight at the interruptions (what a crash could burn).

Targets: 0, 0, $0, $0, ≤ 1 %.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

MODEL = "moonshotai/kimi-k2.5"
KEY = "sk-sim-faults-campaign"
PICO = Decimal("1e-12")


@dataclass
class Outcome:
    """What one scenario did to the money and the prompts."""

    name: str
    prompts: int = 0
    lost: int = 0
    duplicated: int = 0
    overspend: Decimal = Decimal(0)
    forgotten: Decimal = Decimal(0)
    burned: Decimal = Decimal(0)
    in_flight_worst: Decimal = Decimal(0)
    interruptions: int = 0
    charged: Decimal = Decimal(0)
    spent: Decimal = Decimal(0)
    notes: list[str] = field(default_factory=list)

    @property
    def burned_share(self) -> Decimal | None:
        if self.in_flight_worst <= 0:
            return None
        return self.burned / self.in_flight_worst

    def ok(self) -> bool:
        share = self.burned_share
        return (
            self.lost == 0
            and self.duplicated == 0
            and self.overspend == 0
            and self.forgotten == 0
            and (share is None or share <= Decimal("0.01"))
        )

    def row(self) -> str:
        share = self.burned_share
        burned = "n/a" if share is None else f"{share * 100:.2f} %"
        return (
            f"| {self.name} | {self.prompts} | {self.interruptions} | {self.lost} | "
            f"{self.duplicated} | ${self.overspend:.6f} | ${self.forgotten:.6f} | "
            f"{burned} (${self.burned:.6f} of ${self.in_flight_worst:.6f}) | "
            f"{'ok' if self.ok() else 'FAIL'} |"
        )


HEADER = (
    "| scenario | prompts | interruptions | lost | dup | overspend | forgotten | "
    "burned (of in-flight worst case) | |\n|---|---|---|---|---|---|---|---|---|"
)


# --- the job: prompts, the CLI, the audit ------------------------------------------


@dataclass
class Job:
    """One scenario's job directory and the CLI arguments that run it."""

    root: Path
    prompts: int
    budget: Decimal
    max_tokens: int
    concurrency: int
    url: str
    extra: list[str] = field(default_factory=list)
    horizon: float = 3.0

    @property
    def out(self) -> Path:
        return self.root / "out"

    @property
    def input(self) -> Path:
        return self.root / "p.jsonl"

    def write_prompts(self, seed: int) -> None:
        rng = random.Random(seed)
        with self.input.open("w") as fh:
            for n in range(self.prompts):
                words = " ".join(rng.choice(("route", "cost", "token", "ledger")) for _ in range(8))
                fh.write(json.dumps({"id": f"q{n}", "prompt": f"{n}: {words}"}) + "\n")

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "provider_router",
            "--log-level",
            "error",
            "run",
            str(self.input),
            "--out",
            str(self.out),
            "--model",
            MODEL,
            "--budget",
            str(self.budget),
            "--max-tokens",
            str(self.max_tokens),
            "--concurrency",
            str(self.concurrency),
            "--exclude-below",
            "int4",
            "--base-url",
            self.url,
            "--progress",
            "off",
            *(
                # The campaign's key is its own: bound worst cases by its /key usage.
                ["--own-key", str(self.horizon)] if self.horizon >= 0 else []
            ),
            *self.extra,
        ]

    async def start(self, preexec: Callable[[], None] | None = None) -> asyncio.subprocess.Process:
        env = {**os.environ, "OPENROUTER_API_KEY": KEY, "PYTHONUNBUFFERED": "1"}
        return await asyncio.create_subprocess_exec(
            *self.argv(),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            preexec_fn=preexec,  # only resource limits, set before exec
        )

    async def finish(self) -> int:
        """Run the job to its end with nothing injected (resuming up to 3 times); exit code."""
        code = -1
        for _ in range(3):
            proc = await self.start()
            _, stderr = await proc.communicate()
            code = proc.returncode or 0
            if code not in (0, 5):
                print(stderr.decode()[-1500:], file=sys.stderr)
            if code != 5:  # 5: some prompts failed; running again retries them
                break
        if self.horizon >= 0:
            # Once every cut request is past the horizon, one more run lets the account
            # check take back what the key's usage shows was never charged.
            await asyncio.sleep(self.horizon)
            proc = await self.start()
            await proc.communicate()
        return code

    def records(self) -> int:
        path = self.out / "p.jsonl"
        return path.read_bytes().count(b"\n") if path.exists() else 0

    def open_worst_case(self) -> Decimal:
        """The worst case held by open reservations now (after a kill: what was in flight)."""
        return open_units(self.out / "ledger.sqlite")

    def ids(self) -> list[str]:
        path = self.out / "p.jsonl"
        if not path.exists():
            return []
        return [json.loads(line)["id"] for line in path.read_text().splitlines()]


def open_units(path: Path) -> Decimal:
    if not path.exists():
        return Decimal(0)
    con = sqlite3.connect(path, timeout=30)
    try:
        row = con.execute("SELECT sum(units) FROM reservations WHERE state = 'open'").fetchone()
    except sqlite3.Error:
        return Decimal(0)
    finally:
        con.close()
    return Decimal(row[0] or 0) * PICO


def ledger_spent(path: Path) -> Decimal:
    con = sqlite3.connect(path, timeout=30)
    try:
        (units,) = con.execute("SELECT spent FROM totals").fetchone()
    finally:
        con.close()
    return Decimal(units) * PICO


async def audit(outcome: Outcome, sim: Any, ids: list[str], expected: int, spent: Decimal) -> None:
    await sim.simulator.settle_abandoned(now=True)
    charged = sim.simulator.usage
    outcome.prompts = expected
    outcome.lost = len({f"q{n}" for n in range(expected)} - set(ids))
    outcome.duplicated = len(ids) - len(set(ids))
    outcome.charged, outcome.spent = charged, spent
    outcome.forgotten = max(charged - spent, Decimal(0))
    outcome.burned = max(spent - charged, Decimal(0))


async def wait_records(proc: asyncio.subprocess.Process, job: Job, count: int) -> None:
    while job.records() < count and proc.returncode is None:  # noqa: ASYNC110 - a file
        await asyncio.sleep(0.005)


# --- scenarios ---------------------------------------------------------------------


Sim = Callable[..., Awaitable[Any]]


async def kill9(job: Job, sim: Any, rng: random.Random, kills: int) -> Outcome:
    """kill -9 at seeded moments at high concurrency; each kill is an interruption."""
    outcome = Outcome("kill -9")
    for _ in range(kills):
        proc = await job.start()
        if rng.random() < 0.2:
            await asyncio.sleep(rng.uniform(0.2, 1.5))  # start-up, recovery, first sends
        else:
            await wait_records(proc, job, job.records() + rng.randint(1, job.concurrency // 4))
        if proc.returncode is not None:
            break
        proc.kill()
        await proc.wait()
        outcome.interruptions += 1
        outcome.in_flight_worst += job.open_worst_case()
    await job.finish()
    await audit(outcome, sim, job.ids(), job.prompts, ledger_spent(job.out / "ledger.sqlite"))
    outcome.notes.append(row_states(job.out / "ledger.sqlite"))
    return outcome


def row_states(path: Path) -> str:
    """How the ledger closed its reservations (recovered = counted at worst case)."""
    con = sqlite3.connect(path)
    try:
        rows = con.execute(
            "SELECT state, generation_id IS NOT NULL, count(*) FROM reservations GROUP BY 1, 2"
        ).fetchall()
    finally:
        con.close()
    return ", ".join(f"{state}{'+id' if has_id else ''}: {n}" for state, has_id, n in rows)


def _fsize_limit(limit: int) -> Callable[[], None]:
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def _filled(stderr: bytes) -> str:
    """Which file the run said it could not write (the ledger's, or the job's files)."""
    errors = [line for line in stderr.decode().splitlines() if ": error: " in line]
    if not errors:
        return "no error line"
    return "the ledger" if errors[-1].endswith("ledger.sqlite") else "outputs/journal"


async def disk_full(job: Job, sim: Any, rng: random.Random) -> Outcome:
    """Files stop growing mid-run (RLIMIT_FSIZE: every write past the limit fails)."""
    outcome = Outcome("disk full")
    for limit in (48_000, 160_000, 400_000):
        proc = await job.start(_fsize_limit(limit))
        _, stderr = await proc.communicate()
        outcome.interruptions += 1
        outcome.in_flight_worst += job.open_worst_case()
        outcome.notes.append(f"limit {limit} B: exit {proc.returncode} ({_filled(stderr)})")
    await job.finish()
    await audit(outcome, sim, job.ids(), job.prompts, ledger_spent(job.out / "ledger.sqlite"))
    return outcome


async def clean_with_faults(name: str, job: Job, sim: Any) -> Outcome:
    """A run whose every fault is inside the exchange (the sim's fault rules)."""
    outcome = Outcome(name)
    await job.finish()
    outcome.in_flight_worst = job.concurrency * _worst_case(job)
    await audit(outcome, sim, job.ids(), job.prompts, ledger_spent(job.out / "ledger.sqlite"))
    return outcome


def _worst_case(job: Job) -> Decimal:
    con = sqlite3.connect(job.out / "ledger.sqlite")
    try:
        (units,) = con.execute("SELECT max(units) FROM reservations").fetchone()
    finally:
        con.close()
    return Decimal(units or 0) * PICO


async def redis_outage(job: Job, sim: Any, rng: random.Random) -> Outcome | None:
    """The shared Redis ledger stops answering for a few seconds mid-run (SIGSTOP)."""
    server = shutil.which("redis-server")
    if server is None:
        return None
    port = _free_port()
    redis = await asyncio.create_subprocess_exec(
        server, "--port", str(port), "--save", "", "--appendonly", "no",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    outcome = Outcome("redis outage")
    try:
        await asyncio.sleep(0.3)
        job.extra = ["--ledger", f"redis://127.0.0.1:{port}/0", "--ledger-name", "faults"]
        proc = await job.start()
        await wait_records(proc, job, job.prompts // 4)
        redis.send_signal(signal.SIGSTOP)
        await asyncio.sleep(3.0)
        redis.send_signal(signal.SIGCONT)
        await proc.communicate()
        outcome.notes.append(f"first run exit {proc.returncode}")
        await job.finish()
        spent = await _redis_spent(port)
        outcome.interruptions = 1
        outcome.in_flight_worst = job.concurrency * _redis_worst(job)
        await audit(outcome, sim, job.ids(), job.prompts, spent)
    finally:
        redis.send_signal(signal.SIGCONT)
        redis.kill()
        await redis.wait()
    return outcome


def _redis_worst(job: Job) -> Decimal:
    # Priced like the SQLite runs: the highest worst case one request can reserve.
    return Decimal(job.max_tokens) * Decimal("2.85") / Decimal(1_000_000) + Decimal("0.0005")


async def _redis_spent(port: int) -> Decimal:
    from provider_router.ledger.redis import RedisLedger

    async with RedisLedger(f"redis://127.0.0.1:{port}/0", name="faults") as ledger:
        return (await ledger.snapshot()).spent


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def ledger_write_error(job: Job, sim: Any, rng: random.Random) -> Outcome:
    """The ledger's settles fail: first for a while (retried), then for good (the run stops)."""
    from provider_router.jobs.observe.standard import standard_observers
    from provider_router.jobs.runner import JobRunner
    from provider_router.ledger.sqlite import SQLiteLedger
    from provider_router.planning.plan import Plan

    class Failing(SQLiteLedger):
        """Settles fail a few times at ``flaky`` (retried), then for good from ``broken``."""

        def __init__(self, *args: Any, flaky: int, broken: int, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.settles = 0
            self.flaky, self.broken = flaky, broken

        async def settle(self, reservation: Any, cost: Decimal, **kwargs: Any) -> None:
            self.settles += 1
            if self.flaky <= self.settles < self.flaky + 3 or self.settles >= self.broken:
                raise OSError(5, "Input/output error")
            await super().settle(reservation, cost, **kwargs)

    outcome = Outcome("ledger write error")
    plan = Plan.single(
        [job.input], model=MODEL, budget=job.budget, max_tokens=job.max_tokens,
        concurrency=job.concurrency, exclude_below="int4",
    )  # fmt: skip
    path = job.out / "ledger.sqlite"
    job.out.mkdir(parents=True, exist_ok=True)
    ledger = Failing(path, job.budget, flaky=job.prompts // 10, broken=job.prompts // 3, lease=1.0)
    try:
        runner = JobRunner(
            plan,
            job.out,
            base_url=job.url,
            api_key=KEY,
            ledger=ledger,
            observers=standard_observers(),
        )
        summary = await runner.run()
        outcome.notes.append(f"first run: {summary.reason.value}")
        outcome.interruptions = 1
        # In flight when the ledger broke: whatever it could not settle stays open.
        outcome.in_flight_worst = open_units(path)
    finally:
        await ledger.close()
    await asyncio.sleep(1.2)  # the unsettled leases run out: the resume recovers them
    await job.finish()
    await audit(outcome, sim, job.ids(), job.prompts, ledger_spent(path))
    outcome.notes.append(row_states(path))
    return outcome


FIELD_CASES: dict[str, dict[str, Any]] = {
    "max_completion_tokens": {"max_completion_tokens": 4000},
    "tools": {
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": f"tool_{i}",
                    "description": "Looks a thing up in a large catalogue. " * 20,
                    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
                },
            }
            for i in range(20)
        ]
    },
    "image": {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Describe it."},
                    {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                ],
            }
        ]
    },
    "n": {"n": 3},
}


async def request_fields(job: Job, sim: Any, rng: random.Random) -> Outcome:
    """Fields the reservation must price or refuse: each spends a small budget to its end."""
    from provider_router import BudgetExhausted, ConfigurationError, MemoryLedger, Router

    outcome = Outcome("request fields")
    limit = Decimal("0.02")
    messages = [{"role": "user", "content": "Say something."}]
    for name, fields in FIELD_CASES.items():
        before = sim.simulator.usage
        ledger = MemoryLedger(limit)
        params = dict(fields)
        prompt = params.pop("messages", messages)
        refused = 0
        async with Router(MODEL, ledger=ledger, base_url=job.url, api_key=KEY) as router:

            async def one(
                router: Router = router, prompt: Any = prompt, params: Any = params
            ) -> int:
                try:
                    await router.chat(prompt, max_tokens=10, **params)
                except BudgetExhausted:
                    return 1
                except ConfigurationError:
                    return 2
                except Exception:  # a provider's refusal: not a money event
                    return 0
                return 0

            while True:
                results = await asyncio.gather(*(one() for _ in range(16)))
                if 2 in results:
                    refused = 1
                    break
                if 1 in results:
                    break
        await sim.simulator.settle_abandoned(now=True)
        charged = sim.simulator.usage - before
        spent = (await ledger.snapshot()).spent
        outcome.overspend += max(charged - limit, Decimal(0))
        outcome.forgotten += max(charged - spent, Decimal(0))
        outcome.charged += charged
        outcome.spent += spent
        outcome.notes.append(
            f"{name}: {'refused' if refused else f'charged ${charged:.4f} of ${limit}'}"
        )
    return outcome


# --- the campaign ------------------------------------------------------------------


async def campaign(args: argparse.Namespace) -> list[Outcome]:
    from provider_router.testing import SimulatorServer

    rng = random.Random(args.seed)
    only = set(args.only.split(",")) if args.only else None
    outcomes: list[Outcome] = []
    scenarios: list[tuple[str, dict[str, Any], Any]] = [
        ("kill9", {}, lambda j, s: kill9(j, s, rng, args.kills)),
        ("disk", {}, lambda j, s: disk_full(j, s, rng)),
        (
            "cut",
            {"faults": [{"kind": "drop_done", "rate": 0.2}, {"kind": "reset", "rate": 0.05}]},
            lambda j, s: clean_with_faults("stream cut after usage", j, s),
        ),
        (
            "timeout",
            {"faults": [{"kind": "hang", "rate": 0.1, "hang_seconds": 5}]},
            lambda j, s: clean_with_faults("524 / timeout after send", j, s),
        ),
        ("ledger", {}, lambda j, s: ledger_write_error(j, s, rng)),
        ("redis", {}, lambda j, s: redis_outage(j, s, rng)),
        ("fields", {}, lambda j, s: request_fields(j, s, rng)),
    ]
    scenarios += _money_scenarios()
    scenarios += _limit_scenarios(args.seed)
    scenarios += _cache_scenarios(args.seed)
    cache_header = False
    for key, sim_options, run in scenarios:
        if only is not None and not any(key == o or key.startswith(f"{o}-") for o in only):
            continue
        if key.startswith("cache-") and not cache_header:
            from bench.faults_cache import HEADER as CACHE_HEADER

            print(CACHE_HEADER, flush=True)
            cache_header = True
        root = Path(tempfile.mkdtemp(prefix=f"faults-{key}-"))
        try:
            async with SimulatorServer(
                api_keys=[KEY],
                credits=10**6,
                speed=args.speed,
                seed=args.seed,
                log_limit=10**6,
                # No provider cancels (the worst case) unless a row says otherwise.
                **{"cancellation": "none", **sim_options},
            ) as sim:
                job = Job(
                    root, args.prompts, args.budget, args.max_tokens, args.concurrency, sim.url
                )
                job.horizon = args.horizon
                job.write_prompts(args.seed)
                started = time.monotonic()
                outcome = await run(job, sim)
                if outcome is None:
                    print(f"{key}: skipped (needs redis-server)", file=sys.stderr)
                    continue
                if key != "fields":  # that one checks its own small limits
                    outcome.overspend = max(outcome.charged - args.budget, Decimal(0))
                outcome.notes.append(f"{time.monotonic() - started:.0f} s")
                outcomes.append(outcome)
                print(outcome.row(), " ".join(outcome.notes), flush=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return outcomes


def _cache_scenarios(seed: int) -> list[tuple[str, dict[str, Any], Any]]:
    # Kills and a lost outputs file, with and without the response cache, on a provider
    # that cancels streams and one that does not.
    from bench.faults_cache import cache_scenarios

    return list(cache_scenarios(seed))


def _money_scenarios() -> list[tuple[str, dict[str, Any], Any]]:
    # The money rows of #21 (lying costs, a stop in back-off, the preflight).
    from bench.faults_money import money_scenarios

    return list(money_scenarios())


def _limit_scenarios(seed: int) -> list[tuple[str, dict[str, Any], Any]]:
    # A key's limit met mid-run, as the docs and as the field answer it.
    from bench.faults_limits import limit_scenarios

    return list(limit_scenarios(seed))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench faults", description=__doc__)
    p.add_argument("--quick", action="store_true", help="the small version (CI's slow test)")
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--kills", type=int, default=50)
    p.add_argument("--prompts", type=int, default=3000)
    p.add_argument("--concurrency", type=int, default=500)
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--budget", type=Decimal, default=Decimal(100))
    p.add_argument("--speed", type=float, default=50.0)
    p.add_argument(
        "--only",
        default="",
        help="comma list: kill9,disk,cut,timeout,ledger,redis,fields,cost,stop,preflight,"
        "limit,cache,files,locked (a group picks its rows: cost-absurd-json, cache-kill...)",
    )
    p.add_argument(
        "--horizon",
        type=float,
        default=3.0,
        help="--own-key S for the CLI runs (negative: without account reconciliation)",
    )
    p.add_argument("--json", type=Path, help="also write the table here")
    return p


def quick(args: argparse.Namespace) -> argparse.Namespace:
    args.kills, args.prompts, args.concurrency = min(args.kills, 6), 300, 100
    args.max_tokens, args.speed = 1000, 200.0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.quick:
        args = quick(args)
    print(
        f"fault campaign: seed {args.seed}, {args.prompts} prompts, concurrency "
        f"{args.concurrency}, max_tokens {args.max_tokens}, budget ${args.budget}, "
        f"sim speed {args.speed}, {args.kills} kills, "
        + (f"--own-key {args.horizon}" if args.horizon >= 0 else "no account reconciliation")
    )
    print(HEADER)
    outcomes = asyncio.run(campaign(args))
    file_rows = asyncio.run(job_file_rows(args))
    if args.json:
        table = [{**o.__dict__, "ok": o.ok()} for o in [*outcomes, *file_rows]]
        args.json.write_text(json.dumps(table, default=str, indent=1))
    return 0 if all(o.ok() for o in [*outcomes, *file_rows]) else 1


async def job_file_rows(args: argparse.Namespace) -> list[Any]:
    """The job-file rows of #21 (``bench/_faults_files.py``): files cut, moved, locked."""
    from bench import _faults_files

    only = {name.strip() for name in args.only.split(",") if name.strip()} or None

    def job_for(root: Path, sim: Any) -> Job:
        job = Job(root, 150, args.budget, 256, 16, sim.url, horizon=-1.0)
        job.write_prompts(args.seed)
        return job

    return await _faults_files.rows(args, only, job_for)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
