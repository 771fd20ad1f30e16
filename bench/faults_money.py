"""The fault campaign's money rows (#21): lying costs, a stop in back-off, a fragile preflight.

Registered by :mod:`bench.bench_faults` (not a benchmark of its own; ``--only
cost,stop,preflight``: a group picks every row of its own). Each row runs a small
job (``SMALL_PROMPTS`` prompts at ``SMALL_CONCURRENCY``) against the campaign's
local OpenRouter, then resumes it honestly to its end, and holds it to the
campaign's rules plus three of its own:

* **paid twice**: full answers the simulator billed for the run's prompts beyond the
  outputs kept (a paid answer thrown away, or a prompt paid again), counted in *dup*;
* **burned** may reach, but never pass, the worst case of each disputed answer (what
  a dispute books instead of the figure nobody confirmed);
* **message**: the run's one line says what happened (the generation id of a
  disputed cost, no attempt after a Ctrl-C, no traceback at start-up).

Rows: an answer's ``usage.cost`` absurd ($1,000,000), a string (``"0.001"``),
negative (-5), NaN or far too low (``0``, ``1e-30``), in a JSON and a streamed run and
in the preflight's pinned request (``usage_cost`` fault: the ``/generation`` record
keeps the truth); Ctrl-C while every request backs off a 429; Ctrl-C during start-up;
the preflight under an
insured empty answer (``error_200``), a reset and a truncated body.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from bench.bench_faults import KEY, MODEL, Job, Outcome, _worst_case, audit, ledger_spent

SMALL_PROMPTS = 40
SMALL_CONCURRENCY = 8
STARTUP_INTERRUPTS = 10
BACKOFF_SECONDS = 5.0
"""Real seconds every request waits on its 429 (``Retry-After``) when Ctrl-C comes."""

Run = Callable[[Job, Any], Awaitable[Outcome]]


@dataclass
class MoneyOutcome(Outcome):
    """An :class:`Outcome` with a dispute allowance and a message check."""

    allowance: Decimal = Decimal(0)
    message: str = ""
    message_ok: bool = True

    def ok(self) -> bool:
        return (
            self.lost == 0
            and self.duplicated == 0
            and self.overspend == 0
            and self.forgotten == 0
            and self.burned <= self.allowance
            and self.message_ok
        )

    def row(self) -> str:
        return (
            f"| {self.name} | {self.prompts} | {self.interruptions} | {self.lost} | "
            f"{self.duplicated} | ${self.overspend:.6f} | ${self.forgotten:.6f} | "
            f"${self.burned:.6f} (≤ ${self.allowance:.6f}: disputed worst cases) | "
            f"{'ok' if self.ok() else 'FAIL'} | {self.message[:160]} |"
        )


def _small(job: Job, seed: int = 2026) -> None:
    job.prompts, job.concurrency = SMALL_PROMPTS, SMALL_CONCURRENCY
    job.write_prompts(seed)


def _paid_answers(sim: Any) -> int:
    """Full answers billed for the run's prompts (not the preflight's 1-token request)."""
    return sum(
        1
        for r in sim.requests
        if r.route == "chat"
        and r.max_tokens != 1
        and r.cost_units > 0
        and r.outcome in ("ok", "usage_cost")
    )


def _runner(job: Job, *, preflight: bool, stream: bool) -> Any:
    from provider_router.jobs.observe.standard import standard_observers
    from provider_router.jobs.runner import JobRunner
    from provider_router.planning.plan import Plan

    plan = Plan.single(
        [job.input], model=MODEL, budget=job.budget, max_tokens=job.max_tokens,
        concurrency=job.concurrency, exclude_below="int4",
    )  # fmt: skip
    return JobRunner(
        plan,
        job.out,
        base_url=job.url,
        api_key=KEY,
        preflight=preflight,
        stream=stream,
        observers=standard_observers(),
    )


async def _run_once(job: Job, *, preflight: bool, stream: bool) -> tuple[str, Any]:
    """One in-process run: its one line (the summary's, or the failed preflight's)."""
    from provider_router._exceptions import PreflightFailed

    try:
        summary = await _runner(job, preflight=preflight, stream=stream).run()
    except PreflightFailed as exc:
        return "; ".join(c.detail for c in exc.report.failures), None
    return summary.message or f"{summary.reason.value}", summary


async def _audit(outcome: MoneyOutcome, job: Job, sim: Any) -> MoneyOutcome:
    await audit(outcome, sim, job.ids(), job.prompts, ledger_spent(job.out / "ledger.sqlite"))
    outcome.duplicated = max(outcome.duplicated, _paid_answers(sim) - job.records())
    return outcome


# --- an answer's usage.cost ----------------------------------------------------------


COSTS: dict[str, Any] = {
    "absurd": 1000000,
    "string": "0.001",
    "negative": -5,
    "nan": float("nan"),
    "zero": 0,
    "tiny": 1e-30,
}
LOW: Final = ("zero", "tiny")
"""Far below what the answer's tokens cost: checked with /generation, the record booked."""


def lying_cost(label: str, *, stream: bool, preflight: bool) -> Run:
    reported = COSTS[label]
    where = "preflight" if preflight else ("streamed run" if stream else "JSON run")

    async def run(job: Job, sim: Any) -> Outcome:
        _small(job)
        # The preflight's pinned request is JSON and is the job's first request.
        sim.add_fault(
            {
                "kind": "usage_cost",
                "reported": reported,
                "times": 1,
                "stream": False if preflight else stream,
            }
        )
        outcome = MoneyOutcome(f"usage.cost {label} ({where})")
        message, _ = await _run_once(job, preflight=preflight, stream=stream)
        outcome.interruptions = 1
        outcome.message = message
        sim.simulator.faults.clear()
        _, final = await _run_once(job, preflight=preflight, stream=stream)
        disputed = len(final.disputed) if final is not None else 0
        outcome.allowance = disputed * _worst_case(job)
        if label in ("absurd", "negative"):
            outcome.message_ok = (
                "\n" not in message
                and message.count("disputed cost: the server's usage.cost") == 1
                and "check generation gen-" in message
                and disputed == 1
            )
        elif label in LOW:  # booked as OpenRouter's record says; nothing halts
            outcome.message_ok = "\n" not in message and not message.startswith("stopped")
        elif preflight:  # missing: the preflight says so and books /generation's figure
            outcome.message_ok = "no usage.cost (as a JSON number)" in message and not disputed
        else:  # missing: asked of /generation, the run goes on
            outcome.message_ok = message == "complete" and not disputed
        if final is None or (label not in LOW and str(reported) in f"{final.spent}"):
            outcome.message_ok = False  # the honest rerun must finish, never show the figure
        outcome.notes.append(f"final: {final.reason.value if final else 'refused'}")
        return await _audit(outcome, job, sim)

    return run


# --- stopping --------------------------------------------------------------------------


def _chats(sim: Any) -> int:
    return sum(1 for r in sim.requests if r.route == "chat")


async def ctrl_c_in_backoff(job: Job, sim: Any) -> Outcome:
    """Every request's first attempt gets a 429 asking for 5 s; Ctrl-C comes meanwhile."""
    _small(job)
    job.extra = ["--no-preflight"]
    sim.add_fault(
        {
            "kind": "rate_limit",
            "times": job.concurrency,
            "retry_after": BACKOFF_SECONDS * sim.simulator.speed,
            "no_fallback": True,
        }
    )
    outcome = MoneyOutcome("Ctrl-C while retries back off")
    proc = await job.start()
    while _chats(sim) < job.concurrency and proc.returncode is None:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # every one is in its back-off now
    before = _chats(sim)
    signalled = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, stderr = await proc.communicate()
    took = time.monotonic() - signalled
    started_after = _chats(sim) - before
    summary = json.loads((job.out / "summary.json").read_text())
    outcome.interruptions = 1
    outcome.message = f"{summary['reason']}: {summary['message']}"  # the run's own line
    outcome.message_ok = (
        summary["reason"] == "interrupted"
        and started_after == 0
        and proc.returncode == 130
        and took < BACKOFF_SECONDS
        and "Traceback" not in stderr.decode()
    )
    outcome.notes.append(
        f"exit {proc.returncode} {took:.2f} s after SIGINT; {started_after} attempt(s) after it"
    )
    sim.simulator.faults.clear()
    job.extra = []
    await job.finish()
    return await _audit(outcome, job, sim)


async def ctrl_c_at_start_up(job: Job, sim: Any) -> Outcome:
    """SIGINT at spread moments of start-up: one line each, never a traceback."""
    _small(job)
    outcome = MoneyOutcome(f"Ctrl-C during start-up (×{STARTUP_INTERRUPTS})")
    tracebacks = 0
    for n in range(STARTUP_INTERRUPTS):
        proc = await job.start()
        await asyncio.sleep(0.05 + n * 0.1)
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        _, stderr = await proc.communicate()
        text = stderr.decode()
        if "Traceback" in text:
            tracebacks += 1
            where = [line.strip() for line in text.splitlines() if line.startswith("  File")]
            outcome.notes.append(f"traceback at {0.05 + n * 0.1:.2f} s: {where[-3:]}")
        lines = [line for line in text.splitlines() if line.strip()]
        outcome.message = lines[-1] if lines else outcome.message
        outcome.interruptions += 1
    outcome.message_ok = tracebacks == 0
    outcome.notes.append(f"{tracebacks} traceback(s)")
    await job.finish()
    return await _audit(outcome, job, sim)


# --- the preflight ---------------------------------------------------------------------


def preflight_under(kind: str) -> Run:
    async def run(job: Job, sim: Any) -> Outcome:
        _small(job)
        sim.add_fault({"kind": kind, "times": 1, "stream": False})  # the pinned request
        outcome = MoneyOutcome(f"preflight under {kind}")
        message, summary = await _run_once(job, preflight=True, stream=True)
        outcome.interruptions = 1
        outcome.message = message
        outcome.message_ok = summary is not None and message == "complete"
        return await _audit(outcome, job, sim)

    return run


def money_scenarios() -> list[tuple[str, dict[str, Any], Run]]:
    """The rows, as ``(key, simulator options, run)`` for the campaign's loop."""
    rows: list[tuple[str, dict[str, Any], Run]] = []
    for label in COSTS:
        rows.append((f"cost-{label}-json", {}, lying_cost(label, stream=False, preflight=False)))
        rows.append((f"cost-{label}-stream", {}, lying_cost(label, stream=True, preflight=False)))
        rows.append((f"cost-{label}-preflight", {}, lying_cost(label, stream=True, preflight=True)))
    rows.append(("stop-backoff", {}, ctrl_c_in_backoff))
    rows.append(("stop-startup", {}, ctrl_c_at_start_up))
    for kind in ("error_200", "reset", "truncate"):
        rows.append((f"preflight-{kind}", {}, preflight_under(kind)))
    return rows
