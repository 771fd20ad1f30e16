"""Rows moved out of a dataset's outputs, kept beside them: ``set_aside/<why>/<dataset>.jsonl``.

A row set aside (an answer cut at ``max_tokens``, for ``run --redo-truncated``) stops
being done: its prompt runs again, and the new answer takes its place in the outputs,
where each id stays once. The old row is paid for, so it is never deleted: it is
appended to its own file, and counted. The move survives a crash at any point: the new
output and the grown aside file are written whole under temporary names beside their
targets and synced; the journal's ``aside`` entry
(:meth:`~provider_router.jobs.store.journal.FileJournal.set_aside`) then commits the
move, and only then are both renamed into place. A journal replay finishes the renames
an entry committed and removes the files of a move that never did.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

from provider_router._money import to_units

__all__ = ["Move", "finish_move", "rows_of", "stage_move", "staged_file", "sync_directory"]

_TMP: Final = ".aside-"
"""What a temporary file of a move has in its name (``.<name>.aside-<nonce>``)."""


def rows_of(ids: Collection[str]) -> Callable[[Mapping[str, Any]], bool]:
    """Picks the rows of the prompt ids ``ids``."""
    wanted = set(ids)
    return lambda record: record.get("id") in wanted


def staged_file(path: Path, nonce: str) -> Path:
    """The temporary name of ``path``'s new content in the move ``nonce``."""
    return path.with_name(f".{path.name}{_TMP}{nonce}")


@dataclass
class Move:
    """The rows of one dataset set aside by a move, and the new output's length.

    Attributes:
        size: the new output's length (the rows kept, in their order).
        ids, out, prompt, cost, cut: the moved rows' ids, tokens out and in, cost
            (picodollars) and whether each was cut at ``max_tokens``: what the journal
            takes off the dataset's tally.
    """

    size: int = 0
    ids: list[str] = field(default_factory=list)
    out: list[int] = field(default_factory=list)
    prompt: list[int] = field(default_factory=list)
    cost: list[int] = field(default_factory=list)
    cut: list[int] = field(default_factory=list)

    def entry(self, dataset: str, why: str, nonce: str, aside: Path) -> dict[str, Any]:
        """The journal's ``aside`` entry that commits this move (the rows kept keep their
        order, so their new offsets follow from the moved rows' old ones)."""
        return {
            "op": "aside",
            "ds": dataset,
            "why": why,
            "file": str(aside),
            "nonce": nonce,
            "size": self.size,
            "ids": self.ids,
            "out": self.out,
            "in": self.prompt,
            "cost": self.cost,
            "cut": self.cut,
        }


def stage_move(
    source: Path,
    committed: int,
    pick: Callable[[dict[str, Any]], bool],
    aside: Path,
    nonce: str,
) -> tuple[Move, list[tuple[Path, Path]]]:
    """Split the first ``committed`` bytes of the output ``source`` into the rows ``pick``
    sets aside and the rest, written (one pass, synced) as the grown aside file and the
    new output under their temporary names. Returns the move and the renames that finish
    it, ``(temporary, target)``; nothing is staged when no row is picked.

    Raises:
        ValueError: a committed row is not an output record (the file was edited).
    """
    move = Move()
    aside.parent.mkdir(parents=True, exist_ok=True)
    grown, kept = staged_file(aside, nonce), staged_file(source, nonce)
    try:
        with source.open("rb") as rows, grown.open("wb") as moved, kept.open("wb") as out:
            if aside.exists():
                with aside.open("rb") as before:
                    while chunk := before.read(1 << 20):
                        moved.write(chunk)
            read = 0
            number = 0
            while read < committed:
                line = rows.readline(committed - read)
                if not line:
                    break
                read += len(line)
                number += 1
                if _pick_row(line, number, pick, move):
                    moved.write(line)
                else:
                    out.write(line)
                    move.size += len(line)
            for fh in (moved, out):
                fh.flush()
                os.fsync(fh.fileno())
    except BaseException:
        grown.unlink(missing_ok=True)
        kept.unlink(missing_ok=True)
        raise
    if not move.ids:
        grown.unlink(missing_ok=True)
        kept.unlink(missing_ok=True)
        return move, []
    return move, [(grown, aside), (kept, source)]


def _pick_row(line: bytes, number: int, pick: Callable[[dict[str, Any]], bool], move: Move) -> bool:
    try:
        record = json.loads(line)
        pid = record["id"]
        usage = record["usage"]
        row = (int(usage["completion_tokens"]), int(usage["prompt_tokens"]))
        cost = to_units(Decimal(str(record["cost"])))
    except (ValueError, TypeError, KeyError, ArithmeticError) as exc:
        raise ValueError(f"line {number} is not an output record ({exc!r})") from None
    if not pick(record):
        return False
    move.ids.append(str(pid))
    move.out.append(row[0])
    move.prompt.append(row[1])
    move.cost.append(cost)
    move.cut.append(int(record.get("finish_reason") == "length"))
    return True


def finish_move(renames: Iterable[tuple[Path, Path]]) -> None:
    """Put a committed move's files in place (each directory synced after)."""
    for staged, target in renames:
        if staged.exists():
            os.replace(staged, target)
            sync_directory(target.parent)


def sync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (a file system that cannot sync one: as is)."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return  # a file system that cannot open a directory: the rename stands as it is
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
