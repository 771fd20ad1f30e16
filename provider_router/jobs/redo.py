"""``run --redo-truncated``: the answers cut at ``max_tokens`` sent again with a larger cap.

Before anything is sent, each dataset's answers cut at ``max_tokens``
(``finish_reason: length``) at a cap below the one the run sends now are moved out of
its outputs into ``set_aside/truncated/<dataset>.jsonl`` (kept, never deleted, counted:
:meth:`~provider_router.jobs.store.journal.FileJournal.set_aside`); the run then sends
those prompts again, with its own ``max_tokens``, and nothing else twice. An answer
that ended on its own is kept: a larger cap changes only an answer that reached the
old one. Each output row carries the ``max_tokens`` it was sent with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from provider_router._exceptions import JobRefused
from provider_router._format import format_usd
from provider_router._money import from_units
from provider_router.jobs.batch_api.journal import BatchJournal
from provider_router.jobs.store._layout import JobLayout
from provider_router.jobs.store.journal import FileJournal
from provider_router.jobs.store.outputs import TRUNCATED_FINISH, read_outputs
from provider_router.planning.plan import Plan

__all__ = ["TRUNCATED", "cut_at", "redo_truncated"]

TRUNCATED: Final = "truncated"
"""Why the rows were set aside: ``DIR/set_aside/truncated/<dataset>.jsonl``."""


def cut_at(record: Mapping[str, Any]) -> int:
    """The ``max_tokens`` an answer cut at it was sent with: its own record's, or (a row
    written before records carried it) the completion tokens it was cut at."""
    cap = record.get("max_tokens")
    if isinstance(cap, int) and not isinstance(cap, bool):
        return cap
    usage = record.get("usage") or {}
    return int(usage.get("completion_tokens") or 0)


def redo_truncated(journal: FileJournal, plan: Plan, directory: Path) -> list[str]:
    """Set aside the answers ``plan``'s larger ``max_tokens`` would not cut (see the
    module docstring); the sentences saying what moved (none: nothing was cut).

    Call it with the journal begun and nothing in flight. A second call finds nothing
    more to move: the runs of one command may each call it.

    Raises:
        JobRefused: answers were cut, but none below the cap the run sends now (they
            would be cut again), or batches of the job are still running (collect them
            first): nothing was moved.
    """
    caps = {d.name: plan.params_for(d).max_tokens or 0 for d in plan.datasets}
    below: dict[str, set[str]] = {}
    cut = 0
    cut_caps: set[int] = set()
    journal.flush()
    for name, cap in caps.items():
        for record in _cut_records(directory, name):
            cut += 1
            at = cut_at(record)
            cut_caps.add(at)
            if at < cap:
                below.setdefault(name, set()).add(str(record["id"]))
    if not cut:
        return []
    if not below:
        raise JobRefused(
            f"--redo-truncated: the job's {cut:,} answers cut at max_tokens were cut at "
            f"{_caps(cut_caps)}, not below the {_caps(set(caps.values()))} this run sends: "
            "they would be cut again. Give a larger --max-tokens (or generation.max_tokens "
            f"in the plan), e.g. --max-tokens {2 * max(cut_caps)}; nothing was moved"
        )
    _no_live_batches(directory)
    notes = []
    for name, ids in below.items():
        move = journal.set_aside(name, _picker(ids), why=TRUNCATED)
        if not move.ids:
            continue
        cost = from_units(sum(move.cost))
        kept = JobLayout(directory).set_aside(TRUNCATED, name)
        notes.append(
            f"{name}: {len(move.ids):,} answer(s) cut at max_tokens moved to {kept} "
            f"({format_usd(cost)}, paid, kept) and sent again with max_tokens {caps[name]:,}"
        )
    return notes


def _cut_records(directory: Path, dataset: str) -> Iterator[Mapping[str, Any]]:
    """The records of ``dataset``'s outputs cut at ``max_tokens`` (the journal flushed)."""
    path = JobLayout(directory).output(dataset)
    if not path.exists():
        return
    for _, record in read_outputs(path):
        if record.get("finish_reason") == TRUNCATED_FINISH:
            yield record


def _picker(ids: set[str]) -> Callable[[Mapping[str, Any]], bool]:
    """Picks the cut rows of ``ids`` (a row of another id, or one that ended on its own,
    stays)."""

    def pick(record: Mapping[str, Any]) -> bool:
        return record.get("finish_reason") == TRUNCATED_FINISH and record.get("id") in ids

    return pick


def _no_live_batches(directory: Path) -> None:
    """Refuse while a batch of the job runs: its lines went out with the old cap."""
    path = JobLayout(directory).batch_journal
    if not path.exists():
        return
    batches = BatchJournal.open(directory)
    try:
        live = sum(1 for intent in batches if intent.live)
    finally:
        batches.close()
    if live:
        raise JobRefused(
            f"--redo-truncated: {live} batch(es) of the job still run, sent with the cap "
            "they were sent with; run the same command without --redo-truncated to "
            "collect them first; nothing was moved"
        )


def _caps(caps: set[int]) -> str:
    return "/".join(f"{c:,}" for c in sorted(caps)) or "?"
