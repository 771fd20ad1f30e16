"""The batch route's journal: every batch's intent before its submit, its id after the 202.

One append-only JSONL file (``batches.jsonl``) beside the outputs, each entry written
and fsynced before the step it records is taken, so a kill -9 anywhere leaves a batch
at one of: ``intent`` (its prompts, their ``custom_id``s and digests, the reservation
holding its worst case: the submit may or may not have reached OpenRouter, so its
prompts are never sent again until the batch is found or shown never created),
``submitted`` (its id: poll it, collect it), ``collected``, ``ended`` (its prompts may
run again), or ``disputed`` (no batch is sent until ``dispute_checked``). A torn last
line is dropped; any other unreadable line is an error naming the file and line, never
a silent reset (docs/batch.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from provider_router._exceptions import DataFileError
from provider_router.jobs.store._layout import JobLayout

__all__ = ["BatchIntent", "BatchJournal"]

_MAX_NOTE = 1000


@dataclass(slots=True)
class BatchIntent:
    """One batch, from intent to its end."""

    intent: str
    dataset: str
    prompt_ids: tuple[str, ...]
    """Line ``n``'s prompt; its ``custom_id`` is ``<intent>-<n>``."""
    created_after: int
    """Unix seconds, taken before the submit (a lost 202's batch was created after it)."""
    reservation: dict[str, Any]
    """The ledger reservation (id, units, key, owner) holding the worst case."""
    worst_units: int
    batch_id: str | None = None
    collected: bool = False
    cost_units: int = 0
    failed_ids: tuple[str, ...] = ()
    ended: str | None = None
    """Why it ended without results (failed, expired, refused, not_created)."""
    settled: bool = False
    disputed: str | None = None
    """Why a bill of this batch was disputed (the last one), if one was."""
    extra: dict[str, Any] = field(default_factory=dict)
    digests: tuple[str, ...] = ()
    """Line ``n``'s prompt content as sent (:func:`~.unmatched.prompt_digest`);
    empty in intents journaled before it was recorded."""

    def digest_for(self, prompt_id: str) -> str | None:
        """The content digest of ``prompt_id`` as this intent sent it (None: unknown)."""
        if len(self.digests) != len(self.prompt_ids) or prompt_id not in self.prompt_ids:
            return None
        return self.digests[self.prompt_ids.index(prompt_id)]

    def custom_id(self, line: int) -> str:
        return f"{self.intent}-{line}"

    def prompt_for(self, custom_id: str) -> str | None:
        """The prompt id of one of this intent's ``custom_id``s (None: not this intent's)."""
        prefix, _, line = custom_id.rpartition("-")
        if prefix != self.intent or not line.isdigit() or int(line) >= len(self.prompt_ids):
            return None
        return self.prompt_ids[int(line)]

    @property
    def live(self) -> bool:
        """Its prompts may be in a batch OpenRouter runs (never send them again)."""
        return not self.collected and self.ended is None

    @property
    def retryable_ids(self) -> tuple[str, ...]:
        """What may run again: an ended batch's prompts, a collected one's failed lines."""
        if self.ended is not None:
            return self.prompt_ids
        return self.failed_ids if self.collected else ()


class BatchJournal:
    """Append-only, fsynced per entry; replayed into :class:`BatchIntent`s on open."""

    def __init__(
        self, path: Path, intents: dict[str, BatchIntent], fh: IO[bytes], *, existed: bool = True
    ) -> None:
        self.path = path
        self.intents = intents
        self._fh = fh
        self.existed = existed
        """Whether the file was there before this open (it is created before any batch's
        money is reserved, so a ledger holding batches without it means it was lost)."""

    @classmethod
    def open(cls, directory: str | Path) -> BatchJournal:
        path = JobLayout(Path(directory)).batch_journal
        intents: dict[str, BatchIntent] = {}
        good = 0
        existed = path.exists()
        if existed:
            data = path.read_bytes()
            lines = data.split(b"\n")
            for number, line in enumerate(lines, start=1):
                if not line:
                    good += 1
                    continue
                last = number == len(lines)
                try:
                    entry = json.loads(line)
                    _apply(intents, entry)
                except (ValueError, KeyError, TypeError) as exc:
                    if last:  # torn by a kill mid-write: the step it records was not taken
                        break
                    raise DataFileError(
                        path, f"unreadable batch journal entry ({exc})", line=number
                    ) from None
                good += len(line) + 1
            if good < len(data):
                with path.open("r+b") as cut:
                    cut.truncate(min(good, len(data)))
        fh = path.open("ab", buffering=0)
        return cls(path, intents, fh, existed=existed)

    def __iter__(self) -> Iterator[BatchIntent]:
        return iter(self.intents.values())

    def live_ids(self, dataset: str) -> set[str]:
        """Prompts of ``dataset`` in batches that may still run or are being collected."""
        return {p for i in self if i.dataset == dataset and i.live for p in i.prompt_ids}

    def _write(self, entry: dict[str, Any]) -> None:
        _apply(self.intents, entry)
        data = json.dumps(entry, separators=(",", ":")).encode() + b"\n"
        self._fh.write(data)
        os.fsync(self._fh.fileno())

    def record_intent(
        self,
        intent: str,
        dataset: str,
        prompt_ids: Sequence[str],
        created_after: int,
        reservation: dict[str, Any],
        worst_units: int,
        digests: Sequence[str] = (),
    ) -> BatchIntent:
        entry: dict[str, Any] = {
            "op": "intent",
            "intent": intent,
            "ds": dataset,
            "ids": list(prompt_ids),
            "after": created_after,
            "res": reservation,
            "worst": worst_units,
        }
        if digests:
            entry["digests"] = list(digests)
        self._write(entry)
        return self.intents[intent]

    def record_submitted(self, intent: str, batch_id: str) -> None:
        self._write({"op": "submitted", "intent": intent, "batch": batch_id})

    def record_collected(self, intent: str, cost_units: int, failed_ids: Sequence[str]) -> None:
        self._write(
            {"op": "collected", "intent": intent, "cost": cost_units, "failed": list(failed_ids)}
        )

    def record_ended(self, intent: str, why: str) -> None:
        self._write({"op": "ended", "intent": intent, "why": why})

    def record_settled(self, intent: str) -> None:
        self._write({"op": "settled", "intent": intent})

    def record_disputed(self, intent: str, note: str) -> None:
        self._write({"op": "disputed", "intent": intent, "note": note[:_MAX_NOTE]})

    def record_dispute_checked(self, intent: str) -> None:
        """The operator checked the intent's disputed bill: batches may be sent again."""
        self._write({"op": "dispute_checked", "intent": intent})

    @property
    def disputed(self) -> str | None:
        """A dispute on record (the first), if any."""
        return next((i.disputed for i in self if i.disputed is not None), None)

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> BatchJournal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _apply(intents: dict[str, BatchIntent], entry: dict[str, Any]) -> None:
    op = entry["op"]
    if op == "intent":
        intents[entry["intent"]] = BatchIntent(
            intent=str(entry["intent"]),
            dataset=str(entry["ds"]),
            prompt_ids=tuple(str(p) for p in entry["ids"]),
            created_after=int(entry["after"]),
            reservation=dict(entry["res"]),
            worst_units=int(entry["worst"]),
            digests=tuple(str(d) for d in entry.get("digests", ())),
        )
        return
    intent = intents[entry["intent"]]
    if op == "submitted":
        intent.batch_id = str(entry["batch"])
    elif op == "collected":
        intent.collected = True
        intent.cost_units = int(entry["cost"])
        intent.failed_ids = tuple(str(p) for p in entry["failed"])
    elif op == "ended":
        intent.ended = str(entry["why"])
    elif op == "settled":
        intent.settled = True
    elif op == "disputed":
        intent.disputed = str(entry["note"])[:_MAX_NOTE]
    elif op == "dispute_checked":
        intent.disputed = None
    else:
        raise ValueError(f"unknown op {op!r}")
