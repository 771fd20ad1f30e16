"""The fault campaign's spend-limit rows: a key's limit met mid-run, again and again.

Registered by :mod:`bench.bench_faults` (``--only limit``). The campaign's key gets a
limit a little above what it has been charged, so the run meets the limit mid-run
with requests in flight; each run must stop with exit 3 (a budget stop, nothing
failed), then the limit is raised a little again, and so on, before the job is resumed
with no limit to its end and held to the campaign's rules. Two rows: the limit refused
as the docs say (402 ``openrouter_key_limit``) and as the field answers it (a bare 403
``Key limit exceeded (total limit)``, the simulator's ``key_limit_status=403``).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from bench.bench_faults import KEY, Job, Outcome, audit, ledger_spent

STOPS = 4
"""Runs the key's limit stops before the job is let finish."""
STEP_REQUESTS = 12
"""About how many requests' worth of money each raise of the limit allows."""

Run = Callable[[Job, Any], Awaitable[Outcome]]


@dataclass
class LimitOutcome(Outcome):
    """An :class:`Outcome` that also holds every stop to the budget's exit code."""

    stops_ok: bool = True

    def ok(self) -> bool:
        return self.stops_ok and super().ok()


def key_limit(status: int, seed: int) -> Run:
    async def run(job: Job, sim: Any) -> Outcome:
        outcome = LimitOutcome(f"key limit met mid-run ({status})")
        rng = random.Random(seed)
        account = sim.simulator.account
        account.key_limit_status = status
        key = account.keys.get(KEY) or account.key(KEY)
        assert key is not None
        codes: list[int] = []
        for _ in range(STOPS):
            # A raise of a few requests' worth: the run meets it with requests in flight.
            step = Decimal("0.001") * STEP_REQUESTS * Decimal(rng.uniform(0.5, 1.5))
            key.limit = key.usage + int(step * 10**12)
            proc = await job.start()
            await proc.communicate()
            code = proc.returncode or 0
            codes.append(code)
            outcome.interruptions += 1
            outcome.in_flight_worst += job.open_worst_case()
            if job.records() >= job.prompts:
                break  # the last raise was enough to finish (exit 0 then)
            outcome.stops_ok = outcome.stops_ok and code == 3
        key.limit = None  # the key's limit raised for good: the job finishes
        await job.finish()
        await audit(outcome, sim, job.ids(), job.prompts, ledger_spent(job.out / "ledger.sqlite"))
        refused = sum(1 for r in sim.requests if r.limit_source == "openrouter_key_limit")
        outcome.notes.append(f"exits {codes}, {refused} refusals")
        return outcome

    return run


def limit_scenarios(seed: int = 2026) -> list[tuple[str, dict[str, Any], Run]]:
    """The rows, as ``(key, simulator options, run)`` for the campaign's loop."""
    return [
        ("limit-key-402", {}, key_limit(402, seed)),
        ("limit-key-403", {}, key_limit(403, seed)),
    ]
