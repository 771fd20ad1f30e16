"""Paid answers Redis could not take, on the actor's local disk until it can.

When the answer store is out past its window, a paid answer would otherwise live only
in the actor's memory: an actor killed before Redis came back would lose it, and the
next run would buy the prompt again. So the stage appends it to its own fsynced spill
file, ``<spill dir>/<job>/<actor token>.jsonl``, locked (``flock``) for as long as the
actor lives: a lock the kernel drops however the process dies. Whoever finds an
unlocked file (a new actor on the node, a live one's background task, the driver's
:meth:`~provider_router.ray.RayJob.finish`) stores its answers in Redis, never over an
answer already there, then deletes it. A spill is only as durable as the node's disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

from provider_router._log import get_logger

if TYPE_CHECKING:
    from provider_router.ray._store import AnswerStore

__all__ = [
    "DEFAULT_SPILL_DIR",
    "MAX_SPILL_LINE",
    "SpillFile",
    "forget",
    "spill_dir",
    "spilled",
    "store_spilled",
]

log = get_logger(__name__)

DEFAULT_SPILL_DIR: Final = os.path.join(tempfile.gettempdir(), "provider-router-spill")
MAX_SPILL_LINE: Final = 16 * 1024 * 1024
"""Bytes one spilled answer may take at most (a longer line is not read)."""
SUFFIX: Final = ".jsonl"


def spill_dir(root: str | None, name: str) -> Path:
    """The job's spill directory under ``root`` (a job name may hold any character)."""
    digest = hashlib.blake2b(name.encode(), digest_size=8).hexdigest()
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:64]
    return Path(root or DEFAULT_SPILL_DIR) / f"{safe}-{digest}"


class SpillFile:
    """One actor's spill file: opened (and locked) at the first spill."""

    def __init__(self, directory: Path, token: str) -> None:
        self.path = directory / f"{token}{SUFFIX}"
        self._file: IO[bytes] | None = None
        self._lock = threading.Lock()  # rows spill from threads of their own
        self.appended = 0
        """Answers written so far (:meth:`empty` deletes none written after a look)."""

    def __repr__(self) -> str:
        return f"SpillFile({str(self.path)!r})"

    def append(self, key: str, fields: dict[str, Any]) -> None:
        """Write one paid answer, durably (blocking: call it in a thread)."""
        line = json.dumps({"key": key, "fields": fields}, separators=(",", ":")) + "\n"
        with self._lock:
            self._append(line.encode())

    def _append(self, line: bytes) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Locked before it has its name: nobody ever finds it unlocked while we live.
            fresh = self.path.with_suffix(".new")
            handle = open(fresh, "ab")  # noqa: SIM115 (held open, locked, for the actor's life)
            fcntl.flock(handle, fcntl.LOCK_EX)
            os.replace(fresh, self.path)
            self._file = handle
        self._file.write(line)
        self._file.flush()
        os.fsync(self._file.fileno())
        self.appended += 1

    def empty(self, stored: int) -> None:
        """The first ``stored`` answers written are stored now: unless more were
        written since, the file goes (blocking)."""
        with self._lock:
            if self._file is None or self.appended != stored:
                return
            forget(self.path)
            self._file.close()
            self._file = None
        with contextlib.suppress(OSError):
            self.path.parent.rmdir()  # unless another actor's file is there

    def close(self) -> None:
        """Let the file go (what an actor's death does): whoever finds it stores it."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def spilled(directory: Path) -> list[tuple[Path, list[tuple[str, dict[str, Any]]]]]:
    """The spill files of dead actors in ``directory`` and their answers (blocking).

    A file still locked belongs to a live actor and is skipped (a file is locked
    before it has its name). The caller stores the answers, then :func:`forget` s it.
    """
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        if not name.endswith(SUFFIX):
            continue
        path = directory / name
        answers = _read_unlocked(path)
        if answers == []:
            forget(path)  # a dead actor's, emptied: nothing to store
        elif answers is not None:
            found.append((path, answers))
    return found


def _read_unlocked(path: Path) -> list[tuple[str, dict[str, Any]]] | None:
    try:
        handle = open(path, "rb")  # noqa: SIM115 (the lock is the file's, released on close)
    except FileNotFoundError:
        return None  # taken meanwhile
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # its actor lives: it stores them itself
        answers = []
        for number, raw in enumerate(iter(lambda: handle.readline(MAX_SPILL_LINE + 1), b""), 1):
            if not raw.endswith(b"\n"):  # torn (a kill mid-write: it was not kept) or too long
                log.warning("ray.spill_unreadable", path=str(path), line=number)
                continue
            try:
                entry = json.loads(raw)
                key, fields = str(entry["key"]), dict(entry["fields"])
            except (ValueError, KeyError, TypeError):
                log.warning("ray.spill_unreadable", path=str(path), line=number)
                continue
            answers.append((key, fields))
        return answers


def forget(path: Path) -> None:
    """Delete a dead actor's spill file once its answers are stored (blocking)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


async def store_spilled(store: AnswerStore, directory: Path) -> int:
    """Store the answers dead actors spilled in ``directory``, never over a stored one,
    and delete their files: the answers stored. Raises what the store raises (the
    files stay for the next try)."""
    stored = 0
    for path, answers in await asyncio.to_thread(spilled, directory):
        for key, fields in answers:
            stored += await store.put_if_absent(key, fields)
        await asyncio.to_thread(forget, path)
    return stored
