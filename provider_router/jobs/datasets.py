"""Opening a plan's datasets for a run: where each one's prompts come from.

A run builds one :class:`DatasetRun` per dataset of the plan, with the request
parameters of its model and its ``max_tokens`` apart (the target's in-flight pricer is
capped by it), its prompts read from its input files (:func:`open_file_datasets`). On
a resume whose input files are unchanged, done prompts are skipped unparsed by their
location; otherwise every line is read again, and a done prompt found at a new place is
relocated in the journal. Lines are counted in the background: a dataset's total
(what "to finish" prices) is its files' good prompts, known once they are counted or
read to their end, whatever this run sent of them. :func:`validate_inputs` is the
``strict`` check: every line read before anything is spent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provider_router.jobs.counter import Counter
from provider_router.jobs.store.digest import RequestDigest
from provider_router.jobs.store.journal import DatasetTally, FileJournal
from provider_router.jobs.targets import InFlightPricer
from provider_router.planning.plan import DatasetSpec, Plan, reached
from provider_router.planning.prompts import Prompt, PromptReader, count_lines, first_problem_error

__all__ = ["DatasetRun", "input_fingerprint", "open_file_datasets", "validate_inputs"]


@dataclass(slots=True)
class DatasetRun:
    """One dataset's state during a run (see the module docstring)."""

    spec: DatasetSpec
    params: dict[str, Any]
    max_tokens: int
    reader: PromptReader
    prompts: Iterator[Prompt]
    tally: DatasetTally
    counter: Counter
    relocate: bool
    pricer: InFlightPricer
    digest: RequestDigest
    """Each prompt's request digest, as its output row carries it."""
    lines: int | None = None
    inflight: int = 0
    exhausted: bool = False
    counting: asyncio.Future[None] | None = None
    """The background count of its files' lines (:meth:`counted` awaits it)."""

    def can_send(self) -> bool:
        """Another prompt may go out: no cap reached, and the target not yet covered."""
        if self.exhausted:
            return False
        spec = self.spec
        tally = self.tally
        if spec.max_requests is not None and tally.completed + self.inflight >= spec.max_requests:
            return False
        target = spec.target_output_tokens
        # What is in flight is priced high (the cap until lengths are known): an
        # under-estimate here is overshoot nothing can take back (see targets.py).
        return target is None or tally.output_tokens + self.pricer.price(self.inflight) < target

    def short_of_target(self) -> bool:
        """Every prompt was done and the output-token target is still not reached."""
        target = self.spec.target_output_tokens
        if target is None or self.tally.output_tokens >= target or not self.exhausted:
            return False
        cap = self.spec.max_requests
        return cap is None or self.tally.completed < cap

    def total(self) -> int | None:
        """Prompts it will complete at most (its files' good prompts, capped by
        ``max_requests``), if known: every prompt counts, sent in this run or not."""
        total: int | None
        if self.exhausted:
            # Every line read: the good prompts, done ones passed over unparsed included.
            total = self.reader.skipped + self.reader.read
        elif self.lines is not None:
            total = self.lines - self.reader.bad_lines
        else:
            total = None
        if total is not None and self.spec.max_requests is not None:
            total = min(total, self.spec.max_requests)
        return total

    def done(self) -> bool:
        """Nothing is left to do for it: its target or cap reached, or every prompt
        completed (a prompt the budget or a stop kept back is left to do)."""
        if reached(self.spec, self.tally.completed, self.tally.output_tokens):
            return True
        if not self.exhausted or self.counter.failures or self.inflight:
            return False
        total = self.total()
        return total is not None and self.tally.completed >= total

    async def counted(self) -> None:
        """Wait for the count of its files' lines (started by :func:`open_file_datasets`)."""
        if self.counting is not None:
            await asyncio.gather(self.counting, return_exceptions=True)


def validate_inputs(plan: Plan) -> None:
    """Read every input line of ``plan``; raise the first problem (``DataFileError``)."""
    for spec in plan.datasets:
        reader = PromptReader(list(spec.inputs))
        for _ in reader:
            pass
        if reader.problems:
            raise first_problem_error(reader.problems)


def open_file_datasets(
    plan: Plan, journal: FileJournal, *, only: Mapping[str, Collection[str]] | None = None
) -> list[DatasetRun]:
    """The datasets of ``plan`` read from their input files (call it in the event loop).

    Starts counting each dataset's lines in the background (see the module docstring).
    ``only``: send just these prompt ids of each dataset (a pilot); every line is
    still read, so the journal locates what is done for the next run.
    """
    datasets = []
    for spec in plan.datasets:
        fingerprint = input_fingerprint(spec.inputs)
        fast = journal.fast_resume_ok(spec.name, fingerprint)
        if fast:
            reader = PromptReader(
                list(spec.inputs),
                skip=journal.done_locations(spec.name),
                taken=journal.done_ids(spec.name),
            )
        else:
            reader = PromptReader(list(spec.inputs))
            journal.record_inputs(spec.name, fingerprint)
        prompts: Iterator[Prompt] = iter(reader)
        if only is not None:
            prompts = _only(prompts, frozenset(only.get(spec.name, ())))
        datasets.append(
            _dataset(
                plan,
                spec,
                reader=reader,
                prompts=prompts,
                tally=journal.tally(spec.name),
                relocate=not fast,
            )
        )
    for dataset in datasets:
        dataset.counting = _background(asyncio.ensure_future(_count_lines(dataset)))
    return datasets


def _only(prompts: Iterator[Prompt], wanted: frozenset[str]) -> Iterator[Prompt]:
    # A function, not a generator expression in the loop: each dataset keeps its own set.
    return (prompt for prompt in prompts if prompt.id in wanted)


def _dataset(
    plan: Plan,
    spec: DatasetSpec,
    *,
    reader: PromptReader,
    prompts: Iterator[Prompt],
    tally: DatasetTally,
    relocate: bool,
) -> DatasetRun:
    params = plan.params_for(spec).request_params()
    max_tokens = int(params.pop("max_tokens"))
    return DatasetRun(
        spec=spec,
        params=params,
        max_tokens=max_tokens,
        reader=reader,
        prompts=prompts,
        tally=tally,
        counter=Counter(),
        relocate=relocate,
        pricer=InFlightPricer(max_tokens),
        digest=RequestDigest(plan.model, {"max_tokens": max_tokens, **params}),
    )


def input_fingerprint(paths: Sequence[Path]) -> list[Any]:
    """The input files as the journal records them: each one's path, size and mtime."""
    fingerprint: list[Any] = []
    for path in paths:
        try:
            stat = path.stat()
        except OSError:
            fingerprint.append([str(path), None, None])
            continue
        fingerprint.append([str(path.resolve()), stat.st_size, stat.st_mtime_ns])
    return fingerprint


async def _count_lines(dataset: DatasetRun) -> None:
    try:
        counts = [await asyncio.to_thread(count_lines, p) for p in dataset.spec.inputs]
    except OSError:
        return
    dataset.lines = sum(counts)


def _background(task: asyncio.Future[None]) -> asyncio.Future[None]:
    # Counting never fails the run: an unreadable file leaves the total unknown.
    task.add_done_callback(lambda t: t.cancelled() or t.exception())
    return task
