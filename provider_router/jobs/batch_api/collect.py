"""Collecting a completed batch: its results read once, page by page, each line written
exactly once, and the batch settled from what its lines and its ``usage.cost`` say.

Each page's successful lines go through the output journal (a prompt already done is
skipped: exactly once across kills), and the page is committed before the next is
asked for. A line whose cost is unreadable counts at its worst case (unknown is not
free); a line or batch bill above twice its worst case is disputed. The batch is
settled at the larger of its lines' sum and its own ``usage.cost``; a paid answer to a
prompt no longer in the inputs is kept aside (:mod:`.unmatched`), and one served by a
provider the policy excludes is quarantined (:mod:`.quarantine`). A collect cut short
goes on from its cursor at the next poll.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from provider_router._exceptions import (
    APIStatusError,
    InvalidResponseError,
    PaymentRequiredError,
)
from provider_router._money import from_units, to_units
from provider_router.jobs.batch_api._parts import RoutePart, RouteParts
from provider_router.jobs.batch_api.api import RESULTS_PAGE_LINES
from provider_router.jobs.batch_api.body import RESULTS_PAGE_BYTES
from provider_router.jobs.batch_api.journal import BatchIntent
from provider_router.jobs.batch_api.quarantine import QuarantinedAnswers
from provider_router.jobs.batch_api.results import (
    ResultLine,
    complete_result,
    read_cost,
    read_result,
    result_record,
)
from provider_router.jobs.batch_api.unmatched import UnmatchedAnswers, prompt_digest
from provider_router.jobs.store.digest import request_fields
from provider_router.planning.prompts import Prompt
from provider_router.routing.batch_endpoints import BatchRoute

__all__ = ["BatchCollector", "Quarantine"]


@dataclass(frozen=True, slots=True)
class Quarantine:
    """What a line's served provider is checked against, and where a quarantined one goes."""

    route: BatchRoute
    kept: QuarantinedAnswers


@dataclass(slots=True)
class _Collecting:
    """How far this run has read one completed batch's results."""

    cursor: str | None = None
    seen: set[str] = field(default_factory=set)
    lines_cost: Decimal = Decimal(0)
    failed: list[str] = field(default_factory=list)
    done: bool = False


class BatchCollector(RoutePart):
    """Collect completed batches for one run of the batch route (module docstring)."""

    def __init__(
        self,
        parts: RouteParts,
        *,
        unmatched: UnmatchedAnswers,
        model: str,
        quarantine: Quarantine,
    ) -> None:
        super().__init__(parts)
        self.unmatched = unmatched
        self.quarantine = quarantine
        self.model = model
        self._progress: dict[str, _Collecting] = {}

    async def collect(
        self, intent: BatchIntent, prompts: Mapping[str, Prompt], batch: Mapping[str, Any]
    ) -> bool:
        """Read a completed batch's results page by page (each line once), then settle it
        from ``batch`` (its list item: the status, counts and ``usage`` without results).
        A collect cut short (a blip, a 402) goes on from its cursor on the next poll."""
        assert intent.batch_id is not None
        state = self._progress.setdefault(intent.intent, _Collecting())
        line_bytes = self.body.line_bytes(intent.dataset)
        page_lines = max(1, min(RESULTS_PAGE_LINES, RESULTS_PAGE_BYTES // line_bytes))
        while not state.done:
            try:
                page = await self.api.results_page(
                    intent.batch_id,
                    state.cursor,
                    limit=page_lines,
                    max_bytes=page_lines * line_bytes,
                )
            except PaymentRequiredError as exc:
                await self.money.owed(exc)
                return False
            except APIStatusError as exc:
                if exc.status != 409:
                    raise
                return False  # completed, its results not written yet: the next poll
            fresh = 0
            for result in page.get("data") or []:
                line = read_result(intent, result)
                if line is None or line.prompt_id in state.seen:
                    continue  # not this batch's line, or listed again: counted once
                state.seen.add(line.prompt_id)
                fresh += 1
                state.lines_cost += self._write(intent, line, prompts, state.failed)
            self.journal.flush()  # a page's outputs committed before the next is asked for
            cursor = page.get("next_cursor")
            if (
                not page.get("has_more")
                or cursor is None
                or len(state.seen) == len(intent.prompt_ids)
            ):
                state.done = True  # the last page, or every line is in (a batch has no more)
            elif not fresh:
                # Each page must bring a line not seen before: else it is read forever.
                raise InvalidResponseError(
                    f"GET /batches/{intent.batch_id}/results: a page of no new line and "
                    f"has_more ({len(state.seen)} of {len(intent.prompt_ids)} lines read); "
                    "the batch stays held and is collected again on the next run"
                )
            else:
                state.cursor = str(cursor)
        del self._progress[intent.intent]
        lines_cost, failed = state.lines_cost, state.failed
        usage = batch.get("usage")
        reported = read_cost(usage.get("cost") if isinstance(usage, Mapping) else None)
        if reported is None:
            reported = Decimal(0)  # the lines' sum stands (each unknown one at its worst)
        reported = self.money.checked(intent, "usage.cost", reported, lines_cost)
        if abs(reported - lines_cost) > Decimal("1e-9") * max(1, len(intent.prompt_ids)):
            self.result.events.append(
                f"batch {intent.batch_id}: usage.cost ${reported} differs from its lines' "
                f"${lines_cost}; the larger is booked"
            )
        cost = max(reported, lines_cost)
        await self.money.close(intent, cost)
        self.batches.record_collected(intent.intent, to_units(cost), failed)
        self.result.collected += 1
        self.result.cost += cost
        self.result.lines_failed += len(failed)
        return True

    def _write(
        self,
        intent: BatchIntent,
        line: ResultLine,
        prompts: Mapping[str, Prompt],
        failed: list[str],
    ) -> Decimal:
        if line.body is None:
            failed.append(line.prompt_id)
            return Decimal(0)
        prompt = prompts.get(line.prompt_id)
        n = len(intent.prompt_ids)
        worst = (
            self.body.worst(intent.dataset, prompt)
            if prompt is not None
            else from_units(-(-intent.worst_units // n))
        )
        cost = line.cost
        if cost is None or cost > 2 * worst:
            # Unknown is not free, and an absurd bill is not taken on one answer's word:
            # the line's worst case is booked (a disputed one stops the run).
            said = "has no readable cost" if cost is None else f"says it cost ${cost}"
            note = (
                f"batch {intent.batch_id}: line {line.prompt_id} {said}; booked at its "
                f"worst case ${worst}"
            )
            if cost is None:
                self.result.events.append(note)
            else:
                key = f"{intent.dataset}/{line.prompt_id}"
                gen = line.body.get("id")
                gen_id = gen[:200] if isinstance(gen, str) else None
                self.money.dispute(intent, key, note, cost, worst, gen_id)
            cost = worst
        reason = self.quarantine.route.unallowed(line.body.get("provider"))
        if reason is not None:
            # Paid, and not data: kept aside once, counted, and its prompt goes again
            # (a failed line), as the sync route quarantines such an answer.
            if not self.journal.is_done(intent.dataset, line.prompt_id):
                failed.append(line.prompt_id)
                self.result.quarantined += 1
                self.quarantine.kept.keep(intent, line, reason, cost)
                self.result.events.append(
                    f"batch {intent.batch_id}: line {line.prompt_id[:80]} quarantined: {reason}"
                )
            return cost
        if prompt is None or not _asked(intent, prompt):
            # Paid, and never thrown away: kept beside the outputs, once, and counted. An
            # answer to an earlier content of a prompt (edited while its batch ran) is
            # never written under the new text: the new text is sent as a new prompt.
            if not self.journal.is_done(intent.dataset, line.prompt_id) and self.unmatched.keep(
                intent, line, cost
            ):
                if prompt is None:
                    self.result.not_in_inputs += 1
                else:
                    self.result.earlier_content += 1
            return cost
        if not self.journal.claim(intent.dataset, line.prompt_id):
            return cost  # already written (a collect cut short)
        params = request_fields(self.body.params(intent.dataset), prompt.request_fields)
        record = result_record(
            line,
            prompt,
            self.model,
            dataset=intent.dataset,
            batch_id=intent.batch_id,
            started_at=float(intent.created_after),
            finished_at=float(self.clock()),
            cost=cost,
            tools=params.get("tools"),
            request_digest=self.body.digest(intent.dataset).of(prompt),
            max_tokens=params.get("max_tokens"),
        )
        complete_result(self.journal, intent.dataset, line, prompt, record, cost)
        self.result.lines_done += 1
        return cost


def _asked(intent: BatchIntent, prompt: Prompt) -> bool:
    """Whether ``intent``'s batch asked what ``prompt`` asks now (its content as the intent
    recorded it; an intent from before contents were recorded is taken at its word)."""
    sent = intent.digest_for(prompt.id)
    return sent is None or sent == prompt_digest(prompt)
