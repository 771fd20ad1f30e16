"""Moving output records aside: out of a dataset's output, into ``moved_aside.jsonl``.

A record answers the request it was made for (its ``request_digest``). When its prompt's
content changed under the same id, the record no longer answers the dataset's inputs:
it leaves the dataset's output so that every row there answers the text it stands
beside, and it is kept, whole, in ``DIR/moved_aside.jsonl`` (paid for: never deleted).
:func:`rewrite_without` writes the output without those records to a temporary file
beside it (fsynced); :class:`AsideFile` appends them to the side file (fsynced, each
once however often a crash makes it try). The journal commits the swap
(:meth:`~provider_router.jobs.store.journal.FileJournal.move_aside`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

from provider_router._money import to_units
from provider_router.jobs.store._layout import JobLayout

__all__ = ["ASIDE_SUFFIX", "AsideFile", "Rewrite", "fsync_directory", "rewrite_without"]

ASIDE_SUFFIX: Final = ".aside"
"""The temporary output a move aside writes: ``.<dataset>.jsonl.<token>.aside``."""


@dataclass(slots=True)
class Rewrite:
    """An output written again without some records (see :func:`rewrite_without`).

    Attributes:
        tmp: the new output, fsynced, not yet in place.
        size: its length.
        moved: the records left out (each a whole line), in file order.
        ids, out, prompt, cost: each moved record's prompt id, completion and prompt
            tokens, and cost (picodollars): the journal's columns of it.
    """

    tmp: Path
    size: int = 0
    moved: list[bytes] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    out: list[int] = field(default_factory=list)
    prompt: list[int] = field(default_factory=list)
    cost: list[int] = field(default_factory=list)


def rewrite_without(path: Path, size: int, ids: Collection[str], tmp: Path) -> Rewrite:
    """Copy the first ``size`` bytes of the output ``path`` to ``tmp``, leaving out the
    records of ``ids`` (each whole line is a record, as committed); ``tmp`` is fsynced."""
    rewrite = Rewrite(tmp)
    with path.open("rb") as source, tmp.open("wb") as target:
        left = size
        for line in source:
            if left <= 0:
                break
            line = line[:left]
            left -= len(line)
            record = _record(line) if line.endswith(b"\n") else None
            if record is not None and str(record.get("id")) in ids:
                usage = record.get("usage") or {}
                rewrite.moved.append(line)
                rewrite.ids.append(str(record["id"]))
                rewrite.out.append(int(usage.get("completion_tokens") or 0))
                rewrite.prompt.append(int(usage.get("prompt_tokens") or 0))
                rewrite.cost.append(to_units(Decimal(str(record.get("cost") or 0))))
                continue
            target.write(line)
            rewrite.size += len(line)
        target.flush()
        os.fsync(target.fileno())
    return rewrite


def _record(line: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot sync a directory: the rename stands
        pass
    finally:
        os.close(fd)


class AsideFile:
    """``DIR/moved_aside.jsonl``: records moved out of their dataset's output.

    Each line is the record as it was, with ``moved_aside`` added last (when and why).
    A record is written once: one of the same dataset, id, generation id and digest
    already there (a crash between this write and the swap, then a second try) is not
    written again.
    """

    def __init__(self, directory: Path) -> None:
        self.path = JobLayout(directory).moved_aside

    def _written(self) -> set[tuple[Any, ...]]:
        keys: set[tuple[Any, ...]] = set()
        if not self.path.exists():
            return keys
        with self.path.open("rb") as fh:
            for line in fh:
                record = _record(line)
                if record is not None:
                    keys.add(_key(record))
        return keys

    def keep(self, lines: Iterable[bytes], why: str, *, now: float | None = None) -> int:
        """Append the records ``lines`` (whole output lines), fsynced; how many were new."""
        lines = list(lines)
        if not lines:
            return 0
        _cut_torn_tail(self.path)  # a kill mid-write: that record comes again below
        written = self._written()
        when = datetime.fromtimestamp(time.time() if now is None else now, UTC)
        note = json.dumps(
            {"at": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"), "why": why},
            ensure_ascii=False,
            separators=(",", ":"),
        ).encode()
        new = 0
        with self.path.open("ab") as fh:
            for line in lines:
                record = _record(line)
                if record is None or _key(record) in written:
                    continue
                written.add(_key(record))
                fh.write(line.rstrip(b"\n")[:-1] + b',"moved_aside":' + note + b"}\n")
                new += 1
            fh.flush()
            os.fsync(fh.fileno())
        return new


def _key(record: dict[str, Any]) -> tuple[Any, ...]:
    return (
        record.get("dataset"),
        record.get("id"),
        record.get("generation_id"),
        record.get("request_digest"),
    )


def _cut_torn_tail(path: Path) -> None:
    """Cut a last line without its newline (a write a kill cut short)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as fh:
            fh.truncate(data.rfind(b"\n") + 1)
