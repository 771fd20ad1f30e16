"""The simulated Batch API's state: every batch, its state machine, its bill.

A batch's whole life is drawn when it is submitted (how long it runs, whether it
fails or expires) and read off the simulated clock whenever it is looked at, so no
background task runs and a test that fixes the clock sees the same batch every
time. ``validating → in_progress → finalizing → completed``; ``failed`` right after
validation (a body rule such as ``stream: true``, or a fault); ``expired`` at the end
of the 24 h window. At finalize each successful line is priced at the batch
endpoint and the batch is billed once; when the balance cannot cover it, the
results are withheld (402) until a top-up covers it, and the batch is not re-run.
Every assumption the sources do not settle is a row of docs/simulator.md.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from provider_router._money import from_units
from provider_router.testing.batch_api.lines import LineAnswer, Submission, answer_line
from provider_router.testing.billing import Account, KeyState
from provider_router.testing.chat import bodies
from provider_router.testing.chat.synth import Lengths
from provider_router.testing.draws import Draws

__all__ = ["Batch", "BatchBook", "BatchFaults", "TERMINAL"]

MEDIAN_SECONDS = 7 * 60.0
"""The median batch's time to done ("across 230k+ batches … the median finished in 7 minutes")."""
P90_SECONDS = 3600.0
"""The 90th percentile ("90% finished within an hour")."""
_Z90 = 1.2815515655446004
SIGMA = math.log(P90_SECONDS / MEDIAN_SECONDS) / _Z90
"""The log-normal's sigma that puts its 90th percentile at :data:`P90_SECONDS`."""
WINDOW_SECONDS = 24 * 3600.0
VALIDATING_SECONDS = 5.0
FINALIZING_SECONDS = 10.0
TERMINAL = frozenset(["completed", "failed", "expired", "cancelled"])


@dataclass(slots=True)
class BatchFaults:
    """Batch faults, each for the next ``n`` submits (``slow`` and rates: for all)."""

    fail: int = 0
    """Batches that fail right after validating (``error.message`` says why)."""
    expire: int = 0
    """Batches that are still running when their 24 h window ends."""
    lose_202: int = 0
    """Submits that create the batch and then drop the connection before the 202."""
    slow: float = 1.0
    """Every batch's run time multiplied by this."""
    line_failure_rate: float = 0.0
    """Share of lines that fail (partial results; a failed line costs nothing)."""
    fresh_404s: int = 0
    """GETs of a new batch answering 404 before it shows up (per batch)."""
    list_lag: float = 0.0
    """Simulated seconds a new batch stays out of ``GET /batches`` (and GET by id)."""
    drop_submit: int = 0
    """Submits that are read whole and then dropped, unanswered, creating no batch."""
    fail_late: int = 0
    """Batches that run, then fail at their end with their first half of lines answered
    and billed (ASSUMPTION, no source says whether OpenRouter bills the lines a failed
    batch ran: the route takes the side that never underpays, docs/simulator.md)."""
    served_by: str | None = None
    """A provider name every new batch runs on whatever ``provider.only`` pins (the
    batch object's ``provider`` and each line's ``provider`` say it; prices stay the
    pinned endpoint's): a what-if, no source shows the Batch API ignoring its pin."""
    unreachable: bool = False
    """Every Batch API route answers 404, as OpenRouter did for some keys (field
    reports of ``/api/beta/batches``, August 2026)."""

    def take(self, name: str) -> bool:
        """Whether the next submit gets fault ``name`` (and count it used)."""
        left: int = getattr(self, name)
        if left > 0:
            setattr(self, name, left - 1)
            return True
        return False


@dataclass(slots=True)
class Batch:
    """One submitted batch: what was sent, its drawn fate, and its bill once finalized."""

    id: str
    key: KeyState
    submission: Submission
    created_at: int
    """Unix seconds."""
    started: float
    """Simulated seconds (``Simulator.now``) at submit."""
    duration: float
    """Simulated seconds from submit to completed (infinite: it expires)."""
    failure: str | None
    lines: list[LineAnswer] = field(default_factory=list)
    cost: int = 0
    paid: bool = False
    finalized: bool = False
    deleted: bool = False
    misses: int = 0
    hidden_until: float = 0.0
    """Simulated seconds before which the list and GET do not show it (``list_lag``)."""
    late_failure: str | None = None
    """Why it fails at its end, after running (``fail_late``)."""

    def status(self, now: float) -> str:
        elapsed = now - self.started
        validating = min(VALIDATING_SECONDS, self.duration / 10)
        if elapsed < validating:
            return "validating"
        if self.failure is not None:
            return "failed"
        if math.isinf(self.duration):
            return "expired" if elapsed >= WINDOW_SECONDS else "in_progress"
        finalizing = self.duration - min(FINALIZING_SECONDS, self.duration / 10)
        if elapsed < finalizing:
            return "in_progress"
        if elapsed < self.duration:
            return "finalizing"
        return "failed" if self.late_failure is not None else "completed"

    def done_fraction(self, now: float) -> float:
        if math.isinf(self.duration):
            return min(1.0, (now - self.started) / WINDOW_SECONDS) * 0.5
        return min(1.0, max(0.0, (now - self.started) / max(self.duration, 1e-9)))

    def finalized_at(self, now: float) -> int | None:
        status = self.status(now)
        if status == "failed" and self.late_failure is not None:
            return self.created_at + math.ceil(self.duration)
        if status == "failed":
            return self.created_at + math.ceil(min(VALIDATING_SECONDS, self.duration / 10))
        if status == "expired":
            return self.created_at + int(WINDOW_SECONDS)
        if status == "completed":
            return self.created_at + math.ceil(self.duration)
        return None


class SimulatorView(Protocol):
    """What the book reads of its :class:`~provider_router.testing.Simulator`."""

    seed: int
    account: Account
    lengths: Lengths
    instant: bool

    def now(self) -> float: ...


class BatchBook:
    """Every batch of one simulator, newest last, with the faults that apply to them."""

    def __init__(self, sim: SimulatorView, wall: Callable[[], float] = time.time) -> None:
        self.sim = sim
        self.faults = BatchFaults()
        self._epoch = int(wall())
        self._batches: dict[str, Batch] = {}
        self._serial = 0

    def __iter__(self) -> Iterator[Batch]:
        return iter(self._batches.values())

    def __len__(self) -> int:
        return len(self._batches)

    def unix_now(self) -> int:
        return self._epoch + int(self.sim.now())

    def submit(self, key: KeyState, submission: Submission, failure: str | None) -> Batch:
        """Record a new batch and draw its fate (it is ``validating`` now)."""
        self._serial += 1
        rng = Draws(b"%d:batch:%d" % (self.sim.seed, self._serial))
        created = self.unix_now()
        batch_id = f"batch-{created}-{rng.alnum(20)}"
        if failure is None and self.faults.take("fail"):
            failure = "The upstream provider rejected the batch."
        if self.sim.instant:
            duration = 0.0
        elif failure is None and self.faults.take("expire"):
            duration = math.inf
        else:
            duration = MEDIAN_SECONDS * math.exp(rng.gauss(0.0, SIGMA)) * self.faults.slow
            duration = max(duration, VALIDATING_SECONDS + FINALIZING_SECONDS)
            if duration > WINDOW_SECONDS:
                duration = math.inf
        batch = Batch(
            batch_id,
            key,
            submission,
            created,
            self.sim.now(),
            duration,
            failure,
            misses=self.faults.fresh_404s,
            hidden_until=self.sim.now() + self.faults.list_lag,
        )
        if failure is None and math.isfinite(duration) and self.faults.take("fail_late"):
            batch.late_failure = "The upstream provider failed the batch while it ran."
        self._batches[batch_id] = batch
        return batch

    def get(self, batch_id: str, key: KeyState) -> Batch | None:
        """A live batch of ``key`` (None: unknown, another key's, deleted, or not visible yet)."""
        batch = self._batches.get(batch_id)
        if batch is None or batch.deleted or batch.key is not key:
            return None
        if self.sim.now() < batch.hidden_until:
            return None
        if batch.misses > 0:
            batch.misses -= 1
            return None
        self.settle(batch)
        return batch

    def listed(self, key: KeyState) -> list[Batch]:
        """``key``'s live batches, newest first, each settled."""
        now = self.sim.now()
        found = [
            b
            for b in reversed(self._batches.values())
            if b.key is key and not b.deleted and now >= b.hidden_until
        ]
        for batch in found:
            self.settle(batch)
        return found

    def settle(self, batch: Batch) -> None:
        """Finalize a batch whose time has come, and bill it when the balance covers it."""
        status = batch.status(self.sim.now())
        if status != "completed" and (status != "failed" or batch.late_failure is None):
            return
        if not batch.finalized:
            self._finalize(batch)
        if not batch.paid:
            account = self.sim.account
            key = batch.key
            key_room = math.inf if key.limit is None else key.limit - key.usage - key.holds
            if batch.cost <= account.balance - account.holds and batch.cost <= key_room:
                account.charge(key, batch.cost)
                batch.paid = True

    def settle_all(self) -> None:
        """Settle every batch (tests and the ledger comparison call this)."""
        for batch in self._batches.values():
            self.settle(batch)

    def _finalize(self, batch: Batch) -> None:
        sub = batch.submission
        rate = self.faults.line_failure_rate
        created = batch.created_at + math.ceil(batch.duration)
        ran = len(sub.requests) // 2 if batch.late_failure is not None else len(sub.requests)
        for n, (custom_id, body) in enumerate(sub.requests):
            rng = Draws(b"%d:%s:%s" % (self.sim.seed, batch.id.encode(), custom_id.encode()))
            fails = (rate > 0 and rng.random() < rate) or n >= ran
            batch.lines.append(
                answer_line(sub, custom_id, body, rng, self.sim.lengths, created, fails)
            )
        batch.cost = sum(line.cost.total for line in batch.lines if line.cost is not None)
        batch.finalized = True

    @property
    def charged(self) -> int:
        """Picodollars billed for batches so far (paid ones)."""
        return sum(b.cost for b in self._batches.values() if b.paid)

    # --- the wire shapes ----------------------------------------------------

    def counts(self, batch: Batch, now: float) -> dict[str, int]:
        total = len(batch.submission.requests)
        status = batch.status(now)
        if batch.finalized:
            failed = sum(1 for line in batch.lines if line.cost is None)
            return {"total": total, "completed": total - failed, "failed": failed}
        if status in ("failed", "expired"):
            return {"total": total, "completed": 0, "failed": total if status == "failed" else 0}
        done = 0 if status == "validating" else math.floor(total * batch.done_fraction(now))
        return {"total": total, "completed": min(done, total), "failed": 0}

    def usage(self, batch: Batch) -> dict[str, Any] | None:
        if not batch.finalized:
            return None
        prompt = sum(line.prompt_tokens for line in batch.lines)
        completion = sum(line.completion_tokens for line in batch.lines)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "cost": bodies.usd(batch.cost),
            "is_byok": False,
        }

    def body(self, batch: Batch, *, with_results: bool) -> dict[str, Any]:
        """The batch object (``results`` only when asked, terminal and paid for)."""
        now = self.sim.now()
        status = batch.status(now)
        results: list[dict[str, Any]] | None = None
        if with_results and status in TERMINAL and (batch.paid or status != "completed"):
            results = [line.result for line in batch.lines]
        sub = batch.submission
        window_end = batch.created_at + int(WINDOW_SECONDS)
        return {
            "id": batch.id,
            "object": "batch",
            "endpoint": "/v1/chat/completions",
            "model": sub.model_slug,
            "completion_window": "24h",
            "status": status,
            "created_at": batch.created_at,
            "finalized_at": batch.finalized_at(now),
            "expires_at": window_end,
            "provider": None if status == "validating" else sub.provider,
            "request_counts": self.counts(batch, now),
            "usage": self.usage(batch),
            "results": results,
            "error": (
                {"message": batch.failure or batch.late_failure} if status == "failed" else None
            ),
        }

    def owed_message(self, batch: Batch) -> str:
        return (
            f"Insufficient credits to release this batch's results: it cost "
            f"${from_units(batch.cost)} and the balance is ${from_units(self.sim.account.balance)}"
            ". Add credits to unlock the already-computed results; the batch is not re-run."
        )
