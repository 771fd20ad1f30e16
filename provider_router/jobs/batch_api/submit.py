"""Submitting the batch route's batches: what may go, the worst case held, the intent
journaled before the submit and the batch id after its 202.

A prompt may go when it is in no live batch, not done, in fewer than ``max_attempts``
batches OpenRouter took, and fits the pinned endpoint (one that would fail its whole
batch is never put in one; one that might goes in batches of its own kind); targets and
caps limit each wave (:func:`wave_room`). Each batch holds its lines' worst case before
its intent is fsynced, and the intent is fsynced before a byte is sent. A submit that
provably never left is released at once (:data:`MAX_UNSENT_SUBMITS` in a row stop the
run); a definite refusal is released, and a 402 stops the run for credits; anything
else may have made a batch: it stays held for the lost-202 search (:mod:`.lost`).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from decimal import Decimal
from typing import Final

from provider_router._exceptions import (
    APIConnectionError,
    APIStatusError,
    BudgetExhausted,
    ConfigurationError,
    PaymentRequiredError,
)
from provider_router._log import get_logger
from provider_router.jobs.batch_api._parts import RoutePart, RouteParts
from provider_router.jobs.batch_api.body import LineFit
from provider_router.jobs.batch_api.journal import BatchIntent
from provider_router.jobs.batch_api.money import NoRoom
from provider_router.jobs.batch_api.unmatched import prompt_digest
from provider_router.ledger._base import Reservation
from provider_router.planning.prompts import Prompt
from provider_router.routing.batch_endpoints import BatchRoute

__all__ = ["BatchSubmitter", "MAX_UNSENT_SUBMITS", "WAVE_SHARE", "WAVE_TAIL_LINES", "wave_room"]


WAVE_SHARE: Final = 0.95
"""The most of the lines an output-token target still needs that one wave sends."""
WAVE_TAIL_LINES: Final = 20
"""When no more than this many lines are left to a target, they go in one wave."""


def wave_room(
    target: int | None,
    cap: int | None,
    completed: int,
    output_tokens: int,
    max_tokens: int,
    live: int,
) -> int:
    """Lines that may go now: ``completed`` lines wrote ``output_tokens``, ``live`` are
    in batches; ``target`` output tokens and ``cap`` requests (None: no limit)."""
    room = 1 << 62
    if cap is not None:
        room = min(room, cap - completed - live)
    if target is not None:
        per_line = output_tokens / completed if completed else max_tokens
        left = target - output_tokens
        lines = left / max(per_line, 1)
        # A wave covers what is left at the observed mean, shrunk so that a mean
        # read from few lines (answer lengths vary about as much as their mean) two
        # standard errors too low still does not overshoot; the last few go at once.
        share = min(WAVE_SHARE, 1 / (1 + 2 / math.sqrt(max(completed, 1))))
        wave = lines if lines <= WAVE_TAIL_LINES else lines * share
        room = min(room, math.ceil(wave) - live if left > 0 else 0)
    return max(room, 0)


log = get_logger(__name__)

MAX_UNSENT_SUBMITS: Final = 5
"""Submits in a row that never left (each after a longer wait) before the run stops."""


class BatchSubmitter(RoutePart):
    """Submit what may go, for one run of the batch route (see the module docstring)."""

    def __init__(
        self,
        parts: RouteParts,
        *,
        route: BatchRoute,
        limits: Mapping[str, tuple[int | None, int | None]],
        max_attempts: int,
    ) -> None:
        super().__init__(parts)
        self.route = route
        self.limits = limits
        self.max_attempts = max_attempts
        self.unsent = 0
        """Submits in a row that never left (a connection that could not be made)."""
        self.refused: dict[str, dict[str, str]] = {}
        """Per dataset, prompts never put in a batch (each would fail its whole batch):
        id -> where it is and why."""
        self._fits: dict[tuple[str, str], LineFit] = {}

    def _eligible(self, dataset: str, items: Mapping[str, Prompt]) -> list[Prompt]:
        live = self.batches.live_ids(dataset)
        attempts = self.attempts(dataset)
        eligible = [
            p
            for pid, p in items.items()
            if pid not in live
            and not self.journal.is_done(dataset, pid)
            and attempts.get(pid, 0) < self.max_attempts
            and self._fit(dataset, p).refused is None
        ]
        return eligible[: self._room(dataset, len(live))]

    def _fit(self, dataset: str, prompt: Prompt) -> LineFit:
        """The line checked against the pinned endpoint's limits once a run; one that
        would fail its whole batch is noted (:attr:`refused`) and never put in one."""
        key = (dataset, prompt.id)
        fit = self._fits.get(key)
        if fit is None:
            fit = self._fits[key] = self.body.fit(dataset, prompt)
            if fit.refused is not None:
                where = f"{prompt.source}:{prompt.line} (id {prompt.id[:80]!r})"
                self.refused.setdefault(dataset, {})[prompt.id] = f"{where}: {fit.refused}"
        return fit

    def attempts(self, dataset: str) -> dict[str, int]:
        """How many batches each prompt of ``dataset`` went out in."""
        attempts: dict[str, int] = {}
        for intent in self.batches:
            # Only batches OpenRouter took count (not refused or never created).
            if intent.dataset == dataset and intent.batch_id is not None:
                for pid in intent.prompt_ids:
                    attempts[pid] = attempts.get(pid, 0) + 1
        return attempts

    def _room(self, dataset: str, live: int) -> int:
        """How many more lines the dataset's target and request cap allow now."""
        target, cap = self.limits.get(dataset, (None, None))
        tally = self.journal.tally(dataset)
        max_tokens = int(self.body.params(dataset)["max_tokens"])
        return wave_room(target, cap, tally.completed, tally.output_tokens, max_tokens, live)

    async def submit_all(self, prompts: Mapping[str, Mapping[str, Prompt]]) -> bool:
        sent = False
        for dataset, items in prompts.items():
            eligible = self._eligible(dataset, items)
            # A line that may overflow the context goes in batches of its own kind: if
            # it fails its batch, it fails no line that surely fits.
            sure = [p for p in eligible if self._fit(dataset, p).sure]
            doubtful = [p for p in eligible if not self._fit(dataset, p).sure]
            for todo in (sure, doubtful):
                while todo and self.result.stop is None:
                    chunk = self.body.chunk(dataset, todo)
                    todo = todo[len(chunk) :]
                    sent |= await self._submit(dataset, chunk)
        return sent

    async def _reserve(self, dataset: str, chunk: list[Prompt]) -> tuple[list[Prompt], Reservation]:
        count, reservation = await self.money.reserve(
            f"batch:{dataset}", [self.body.worst(dataset, p) for p in chunk]
        )
        if count < len(chunk):
            self.result.stopped_by = "budget"
            self.result.stop = (
                f"the budget is spent: it held the worst case of {count} of the "
                f"{len(chunk)} lines of the last batch"
            )
        return chunk[:count], reservation

    async def _submit(self, dataset: str, chunk: list[Prompt]) -> bool:
        try:
            chunk, reservation = await self._reserve(dataset, chunk)
        except (BudgetExhausted, NoRoom) as exc:
            self.result.stopped_by = "budget"
            self.result.stop = f"the budget is spent: {exc}"
            return False
        intent_id = "b" + uuid.uuid4().hex[:12]
        created_after = int(self.clock()) - 1
        held = {
            "id": reservation.id,
            "units": reservation.units,
            "key": reservation.key,
            "owner": reservation.owner,
        }
        intent = self.batches.record_intent(
            intent_id,
            dataset,
            [p.id for p in chunk],
            created_after,
            held,
            reservation.units,
            digests=[prompt_digest(p) for p in chunk],
        )
        self.money.remember(intent_id, reservation)
        lines = [self.body.line(dataset, intent_id, n, p) for n, p in enumerate(chunk)]
        try:
            batch = await self.api.submit(self.route.model_id, lines, self.route.provider_object())
        except APIConnectionError as exc:
            if not exc.request_sent:
                # Provably never reached OpenRouter: nothing can have been created or billed.
                await self.money.close(intent, Decimal(0))
                self.batches.record_ended(intent.intent, "not_sent")
                self.unsent += 1
                if self.unsent >= MAX_UNSENT_SUBMITS:
                    self.result.stopped_by = "error"
                    self.result.stop = (
                        f"OpenRouter could not be reached: {self.unsent} submits in a row "
                        f"never left ({exc}); nothing of them was sent or billed"
                    )
                return False
            return await self._submit_failed(intent, exc)
        except APIStatusError as exc:
            return await self._submit_failed(intent, exc)
        self.batches.record_submitted(intent_id, str(batch["id"]))
        self.result.submitted += 1
        self.unsent = 0
        log.info("batch.submitted", dataset=dataset, batch=batch["id"], lines=len(chunk))
        return True

    async def _submit_failed(self, intent: BatchIntent, exc: Exception) -> bool:
        definite = isinstance(exc, APIStatusError) and exc.status in (
            400,
            401,
            402,
            403,
            404,
            413,
            422,
        )
        if not definite:
            # Unknown: it may have been created. Its prompts wait, held, for the lost-202
            # search (batch_route).
            self.result.events.append(f"submit of {intent.intent} got no answer ({exc})")
            return False
        await self.money.close(intent, Decimal(0))
        self.batches.record_ended(intent.intent, "refused")
        if isinstance(exc, PaymentRequiredError):
            self.result.stopped_by = "credits"
            self.result.stop = f"OpenRouter refused the batch for credits: {exc}"
            return False
        assert isinstance(exc, APIStatusError)
        raise ConfigurationError(f"OpenRouter refused the batch ({exc.status}): {exc}") from exc
