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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

from provider_router._money import to_units

__all__ = ["Move", "finish_move", "plan_move", "stage_move", "stale_files", "staged_file"]

_TMP: Final = ".aside-"
"""What a temporary file of a move has in its name (``.<name>.aside-<nonce>``)."""


def staged_file(path: Path, nonce: str) -> Path:
    """The temporary name of ``path``'s new content in the move ``nonce``."""
    return path.with_name(f".{path.name}{_TMP}{nonce}")


def stale_files(path: Path) -> list[Path]:
    """Every temporary file of a move of ``path``, whatever its nonce."""
    if not path.parent.is_dir():
        return []
    return sorted(path.parent.glob(f".{path.name}{_TMP}*"))


@dataclass
class Move:
    """One dataset's rows split into those kept and those set aside.

    Attributes:
        kept: the kept rows' bytes, in order (the new output).
        moved: the rows set aside, in order.
        kept_ids, kept_ends: each kept row's id and its end offset in the new output.
        ids, out, prompt, cost, cut: the moved rows' ids, tokens out and in, cost
            (picodollars) and whether each was cut at ``max_tokens``: what the journal
            takes off the dataset's tally.
    """

    kept: list[bytes] = field(default_factory=list)
    moved: list[bytes] = field(default_factory=list)
    kept_ids: list[str] = field(default_factory=list)
    kept_ends: list[int] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    out: list[int] = field(default_factory=list)
    prompt: list[int] = field(default_factory=list)
    cost: list[int] = field(default_factory=list)
    cut: list[int] = field(default_factory=list)

    @property
    def size(self) -> int:
        """The new output's length."""
        return self.kept_ends[-1] if self.kept_ends else 0

    def entry(self, dataset: str, why: str, nonce: str, aside: Path) -> dict[str, Any]:
        """The journal's ``aside`` entry that commits this move."""
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
            "kept": self.kept_ids,
            "end": self.kept_ends,
        }


def plan_move(data: bytes, pick: Callable[[dict[str, Any]], bool]) -> Move:
    """Split the committed output ``data`` into the rows ``pick`` sets aside and the rest.

    Raises:
        ValueError: a committed row is not an output record (the file was edited).
    """
    move = Move()
    end = 0
    for number, line in enumerate(data.splitlines(keepends=True), start=1):
        try:
            record = json.loads(line)
            pid = record["id"]
            usage = record["usage"]
            row = (int(usage["completion_tokens"]), int(usage["prompt_tokens"]))
            cost = to_units(Decimal(str(record["cost"])))
        except (ValueError, TypeError, KeyError, ArithmeticError) as exc:
            raise ValueError(f"line {number} is not an output record ({exc!r})") from None
        if pick(record):
            move.moved.append(line)
            move.ids.append(str(pid))
            move.out.append(row[0])
            move.prompt.append(row[1])
            move.cost.append(cost)
            move.cut.append(int(record.get("finish_reason") == "length"))
        else:
            end += len(line)
            move.kept.append(line)
            move.kept_ids.append(str(pid))
            move.kept_ends.append(end)
    return move


def stage_move(move: Move, output: Path, aside: Path, nonce: str) -> list[tuple[Path, Path]]:
    """Write the new output and the grown aside file under their temporary names, synced;
    the renames that finish the move, ``(temporary, target)``."""
    aside.parent.mkdir(parents=True, exist_ok=True)
    grown = staged_file(aside, nonce)
    with grown.open("wb") as fh:
        if aside.exists():
            with aside.open("rb") as before:
                while chunk := before.read(1 << 20):
                    fh.write(chunk)
        _write(fh, move.moved)
    kept = staged_file(output, nonce)
    with kept.open("wb") as fh:
        _write(fh, move.kept)
    return [(grown, aside), (kept, output)]


def finish_move(renames: Iterable[tuple[Path, Path]]) -> None:
    """Put a committed move's files in place (each directory synced after)."""
    for staged, target in renames:
        if staged.exists():
            os.replace(staged, target)
            _sync_directory(target.parent)


def _write(fh: Any, lines: list[bytes]) -> None:
    fh.write(b"".join(lines))
    fh.flush()
    os.fsync(fh.fileno())


def _sync_directory(directory: Path) -> None:
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
