"""Dispatch: keeping up to ``concurrency`` requests in flight over a run's datasets.

:class:`Dispatcher` is a run's engine. It takes the next prompt round-robin over the
datasets, claims it in the journal, sends it as one task on the
:class:`~provider_router.Router`, and gives the task's end to
:class:`~provider_router.jobs.outcomes.Outcomes`; a dataset is asked before each prompt
whether another may go out, so dispatch slows as a target nears. It also holds the
run's stop switch: :meth:`Dispatcher.stop` lets requests in flight finish,
:meth:`Dispatcher.abandon` cancels them, and the reason it keeps is what the summary
reports.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from decimal import Decimal

from provider_router._exceptions import LedgerWriteError
from provider_router._log import get_logger
from provider_router.client.router import Router
from provider_router.jobs.datasets import DatasetRun
from provider_router.jobs.outcomes import Outcomes
from provider_router.jobs.store.journal import FileJournal, Journal
from provider_router.jobs.summary import StopReason
from provider_router.planning.prompts import Prompt

__all__ = ["Dispatcher"]

log = get_logger(__name__)


class Dispatcher:
    """Sends a run's prompts and knows why it stops (see the module docstring).

    Args:
        outcomes: what each request's end is given to.

    The runner fills :attr:`datasets` before
    :meth:`run`; :meth:`stop` and :meth:`abandon` may come at any time, before
    :meth:`run` too.
    """

    def __init__(self, outcomes: Outcomes) -> None:
        self.outcomes = outcomes
        self.datasets: list[DatasetRun] = []
        self.reason: StopReason | None = None
        """Why the run stopped taking work, or None while it runs."""
        self.message = ""
        """What the summary says about :attr:`reason`."""
        self.tasks: set[asyncio.Task[None]] = set()
        self.running = 0  # requests dispatched and not yet finished (exact, unlike `tasks`)
        self._wake = asyncio.Event()
        self._stream = True
        self._router: Router | None = None

    # --- the stop switch ------------------------------------------------------------------

    def stop(self, reason: StopReason = StopReason.INTERRUPTED, message: str = "") -> None:
        """Stop taking new work; requests in flight finish (the first Ctrl-C).

        No request starts another attempt either (:meth:`Router.stop`): a retry's
        back-off under way is cut short, and its prompt is left for the next run.
        """
        if self._router is not None:
            self._router.stop()
        if self.reason is None:
            self.reason = reason
            self.message = message
            log.info("batch.stopping", reason=reason.value, in_flight=len(self.tasks))
        self._wake.set()

    def abandon(self) -> None:
        """Cancel requests in flight (the second Ctrl-C); they are counted at worst case."""
        self.reason = StopReason.ABANDONED
        self.message = "requests in flight were abandoned and counted at their worst case"
        for task in list(self.tasks):
            task.cancel()
        self._wake.set()

    def fail(self, message: str) -> None:
        """An error found once dispatch ended: it replaces a clean ending, never a stop."""
        if self.reason in (None, StopReason.COMPLETE, StopReason.INCOMPLETE):
            self.reason = StopReason.ERROR
            self.message = message

    # --- the loop -------------------------------------------------------------------------

    async def run(
        self, journal: Journal, router: Router, *, concurrency: int, stream: bool
    ) -> None:
        """Send prompts until none is left or the run stops; then wait for those in flight.

        Args:
            journal: claims, results and releases go there.
            router: sends each request.
            concurrency: requests in flight at most.
            stream: send streaming requests.
        """
        # A plain count of requests running, not an asyncio.Semaphore: each finished
        # request sets `_wake`, and one wake-up refills every slot freed since (the
        # semaphore's per-slot wake-ups and scans cost more than its bookkeeping).
        self._stream = stream
        self._router = router
        if self.reason is not None:  # stopped before dispatch began (a Ctrl-C at start-up)
            router.stop()
        turn = itertools.count()
        assert isinstance(journal, FileJournal)
        while self.reason is None:
            if self.running >= concurrency:
                self._wake.clear()
                await self._wake.wait()
                continue
            picked = self._next(journal, next(turn))
            if picked is None:
                # (A finished task leaves `tasks` a loop turn later; `inflight` is exact.)
                if not any(ds.inflight for ds in self.datasets):
                    break
                self._wake.clear()
                await self._wake.wait()
                continue
            ds, prompt = picked
            ds.inflight += 1
            self.running += 1
            ticket = ds.pricer.sent()
            task = asyncio.ensure_future(self._one(journal, router, ds, prompt, ticket))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        journal.flush()
        if self.reason is None:
            unfinished = [d for d in self.datasets if d.counter.failures and not d.done()]
            self.reason = StopReason.INCOMPLETE if unfinished else StopReason.COMPLETE
            if unfinished:
                self.message = "some prompts failed; run the same command again to retry them"

    def check_targets(self) -> None:
        """A run that did every prompt and still missed a target says so (on final tallies)."""
        short = [d for d in self.datasets if d.short_of_target()]
        if self.reason is StopReason.COMPLETE and short:
            self.reason = StopReason.TARGET_NOT_REACHED
            self.message = (
                "; ".join(
                    f"{d.spec.name}: its prompts ran out at {d.tally.output_tokens:,} of "
                    f"{d.spec.target_output_tokens:,} target output tokens"
                    for d in short
                )
                + " (add prompts, or lower target_output_tokens)"
            )

    # --- the next prompt ------------------------------------------------------------------

    def _next(self, journal: FileJournal, start: int) -> tuple[DatasetRun, Prompt] | None:
        count = len(self.datasets)
        for step in range(count):
            ds = self.datasets[(start + step) % count]
            name = ds.spec.name
            while ds.can_send():
                prompt = next(ds.prompts, None)
                if prompt is None:
                    ds.exhausted = True
                    break
                if journal.claim(name, prompt.id):
                    return ds, prompt
                if ds.relocate and journal.is_done(name, prompt.id):
                    journal.relocate(name, prompt.id, prompt.location)
        return None

    # --- one request ----------------------------------------------------------------------

    async def _one(
        self,
        journal: Journal,
        router: Router,
        ds: DatasetRun,
        prompt: Prompt,
        ticket: int,
    ) -> None:
        name = ds.spec.name
        landed: int | None = None
        counter = ds.counter
        outcomes = self.outcomes
        started = time.time()
        counter.started(started)
        params = {**ds.params, **prompt.request_fields} if prompt.request_fields else ds.params
        try:
            result = await router.chat(
                prompt.messages,
                max_tokens=ds.max_tokens,
                key=f"{name}/{prompt.id}",
                stream=self._stream,
                **params,
            )
        except LedgerWriteError as exc:
            # Paid for and whole: keep and journal it (never sent again), then stop.
            outcomes.completed(journal, ds, prompt, exc.result, started)
            if isinstance(journal, FileJournal) and exc.result.cost is not None:
                journal.note_unsettled(f"{name}/{prompt.id}", exc.result.cost)
            if not outcomes.ledger_full(exc):
                self.stop(
                    StopReason.ERROR,
                    f"the ledger could not record a paid answer ({exc.__cause__!r}); the "
                    "answer is kept and its reservation held for recovery",
                )
        except asyncio.CancelledError:
            journal.release(name, prompt.id, reason="abandoned")
            counter.failed("Abandoned")
            raise
        except BaseException as exc:
            # Counted (and a stop for money decided) first.
            outcomes.failed(ds, exc)
            journal.release(name, prompt.id, reason=type(exc).__name__)
            if not isinstance(exc, Exception):
                raise
        else:
            landed = outcomes.completed(journal, ds, prompt, result, started, params.get("tools"))
            if result.disputed_cost is not None and isinstance(journal, FileJournal):
                journal.note_disputed(
                    f"{name}/{prompt.id}",
                    result.generation_id,
                    result.disputed_cost,
                    result.cost or Decimal(0),
                )
            if router.halted is not None:  # a cost anomaly, violations in a row
                self.stop(StopReason.ERROR, f"stopped: {router.halted}")
        finally:
            ds.pricer.landed(ticket, landed)
            ds.inflight -= 1
            self.running -= 1
            counter.ended(time.time())
            self._wake.set()
