"""Answers kept aside, put back: a prompt back in the inputs is written from the answer
already paid for, not sent (and paid) again.

A batch that answered a prompt no longer in the inputs left its paid answer in
``DIR/not_in_inputs.jsonl`` (:mod:`.unmatched`). When a later run (either route) finds
that prompt in the inputs again, with the same id and the same content as the batch
sent (:func:`~.unmatched.prompt_digest`), the kept answer is written to the dataset's
output through the output journal, as done, at the cost the batch booked; the ledger is
not charged again. Exactly once: a prompt the journal has done is never written again.
An id back with different content answers another prompt: it is sent as new, and a
sentence says so (docs/output.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from provider_router.jobs.batch_api.results import (
    ResultLine,
    complete_result,
    read_cost,
    result_record,
)
from provider_router.jobs.batch_api.unmatched import UnmatchedAnswers, prompt_digest
from provider_router.jobs.store._layout import NOT_IN_INPUTS_FILE
from provider_router.jobs.store.digest import RequestDigest, request_fields
from provider_router.jobs.store.journal import FileJournal
from provider_router.planning.plan import Plan
from provider_router.planning.prompts import Prompt, PromptReader

__all__ = ["Reused", "reuse_kept", "reuse_kept_for_plan"]

_IDS_NAMED = 5
"""Prompt ids a sentence names before it says how many more."""


@dataclass(slots=True)
class Reused:
    """What putting kept answers back did for one dataset."""

    dataset: str
    written: int = 0
    cost: Decimal = Decimal(0)
    differ: list[str] = field(default_factory=list)
    """Ids back in the inputs with another content: their kept answers not used."""
    unknown: list[str] = field(default_factory=list)
    """Ids whose kept answer has no recorded content to check: not used."""

    def sentences(self) -> list[str]:
        """Plain sentences of what was done (none when nothing was)."""
        lines = []
        if self.written:
            lines.append(
                f"{self.written} paid answers kept in {NOT_IN_INPUTS_FILE} were written to "
                f"the outputs of {self.dataset} (${self.cost}, booked before): their prompts "
                "are back in the inputs with the same id and content, so they were not sent "
                "or paid again"
            )
        if self.differ:
            lines.append(
                f"{len(self.differ)} answers kept in {NOT_IN_INPUTS_FILE} were not used: "
                f"their prompt ids are back in the inputs of {self.dataset} with different "
                f"content ({_named(self.differ)}), so those prompts are sent as new ones"
            )
        if self.unknown:
            lines.append(
                f"{len(self.unknown)} answers kept in {NOT_IN_INPUTS_FILE} were not used: "
                "they were kept before the content of their prompts was recorded, so it "
                f"cannot be checked against the inputs of {self.dataset} "
                f"({_named(self.unknown)}); those prompts are sent"
            )
        return lines


def _named(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:_IDS_NAMED])
    more = len(ids) - _IDS_NAMED
    return f"{shown} and {more} more" if more > 0 else shown


def reuse_kept(
    journal: FileJournal,
    kept: UnmatchedAnswers,
    dataset: str,
    prompts: Iterable[Prompt],
    *,
    model: str,
    clock: Callable[[], float],
    params: Mapping[str, Any] | None = None,
) -> Reused:
    """Write each prompt of ``dataset`` whose answer is kept (same id and content, not
    done) from that answer, through ``journal`` (flushed before it returns).

    ``params``: the dataset's generation fields (``max_tokens`` included): the record
    keeps the ``tools`` sent (a prompt line's own over them) and the request's digest.
    """
    asked = RequestDigest(model, params or {})
    reused = Reused(dataset)
    waiting = kept.kept_ids(dataset) - journal.done_ids(dataset) if kept.path.exists() else set()
    if not waiting:
        return reused
    for prompt in prompts:
        if prompt.id not in waiting:
            continue
        waiting.discard(prompt.id)  # an id is read once (a duplicate line is the reader's)
        entry = kept.entry(dataset, prompt.id)
        digest = entry.get("digest")
        if not isinstance(digest, str):
            reused.unknown.append(prompt.id)
            continue
        if digest != prompt_digest(prompt):
            reused.differ.append(prompt.id)
            continue
        cost = _cost(entry)
        if not journal.claim(dataset, prompt.id):
            continue
        line = ResultLine(prompt.id, entry["answer"], cost)
        after = entry.get("after")
        record = result_record(
            line,
            prompt,
            model,
            dataset=dataset,
            batch_id=str(entry.get("batch_id")),
            started_at=float(after) if isinstance(after, int | float) else float(clock()),
            finished_at=float(clock()),
            cost=cost,
            tools=request_fields(asked.params, prompt.request_fields).get("tools"),
            request_digest=asked.of(prompt),
        )
        complete_result(journal, dataset, line, prompt, record, cost)
        reused.written += 1
        reused.cost += cost
    journal.flush()
    return reused


def _cost(entry: Mapping[str, Any]) -> Decimal:
    """The cost the batch booked for a kept answer (what its line was settled at)."""
    cost = read_cost(entry.get("cost_usd"))
    return Decimal(0) if cost is None else cost


def reuse_kept_for_plan(
    plan: Plan, journal: FileJournal, directory: str | Path, *, clock: Callable[[], float]
) -> list[str]:
    """:func:`reuse_kept` for each dataset of ``plan`` (its inputs read only when a kept
    answer of it waits); the sentences of what was done."""
    kept = UnmatchedAnswers(directory)
    if not kept.path.exists():
        return []
    lines: list[str] = []
    for spec in plan.datasets:
        if not kept.kept_ids(spec.name) - journal.done_ids(spec.name):
            continue
        reused = reuse_kept(
            journal,
            kept,
            spec.name,
            PromptReader(list(spec.inputs)),
            model=plan.model,
            clock=clock,
            params=plan.params_for(spec).request_params(),
        )
        lines += reused.sentences()
    return lines
