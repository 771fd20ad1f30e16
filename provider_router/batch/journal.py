"""The journal: what makes a batch job exactly-once across crashes and restarts.

One append-only JSONL file (``journal.jsonl``) beside the per-dataset outputs
records every claim of a prompt, every completion, every failure. Completed
output lines are appended to ``<dataset>.jsonl`` *before* the ``done`` entry
that commits them is appended to the journal, and that entry records the output
file's length after each record. So the journal's ``done`` entries are the truth:

* a prompt is done if and only if the journal has its ``done`` entry;
* on open, anything past the last committed length of an output file (records
  whose ``done`` entry never made it) is cut off, and a torn last journal line is
  dropped, so a kill -9 at any byte leaves a consistent state;
* claims without a ``done`` or ``fail`` (requests in flight at a crash) become
  ``lost`` entries, reported with their generation id when one was known, so
  the money they may have cost can be reconciled through the ledger;
* if an output file is shorter than the journal says (the disk lost it), the
  ``done`` entries past its end are revoked and those prompts run again.

No id is ever written twice: a prompt is only claimed if it is neither done
nor in flight. One process at a time may hold a journal (an advisory lock).

Writes are buffered and committed together by :meth:`FileJournal.flush`
(outputs first, then journal lines), which the runner calls once per event-loop
turn; consecutive claims or completions of a dataset share one journal line
(columns of ids, offsets, tokens, costs), which keeps a million-completion
journal small and quick to load. Process crashes lose nothing that was flushed
(the OS has it); :meth:`FileJournal.close` also fsyncs, for power loss.

The :class:`Journal` protocol (``claim`` → ``complete`` / ``release``) is all the
runner needs, so a shared work queue (several workers, one plan) can implement
it on top of a per-worker :class:`FileJournal`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator, Set
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from provider_router._exceptions import ConfigurationError, DataFileError

__all__ = [
    "JOURNAL_FILE",
    "DatasetTally",
    "FileJournal",
    "Journal",
    "LostRequest",
    "output_path",
]

JOURNAL_FILE = "journal.jsonl"
_LOCK_FILE = ".journal.lock"
_FORMAT_VERSION = 1
_LOAD_CHUNK_LINES = 20_000
_NO_LOCATION = -1
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_COLUMNS = ("ids", "end", "out", "in", "cost", "loc")


def output_path(directory: Path, dataset: str) -> Path:
    """Where a dataset's output records go."""
    return directory / f"{dataset}.jsonl"


@dataclass
class DatasetTally:
    """What the journal has recorded for one dataset, over every run.

    Attributes:
        completed: prompts completed.
        output_tokens: their completion tokens (reasoning included).
        prompt_tokens: their prompt tokens.
        cost_units: their authoritative cost, in integer picodollars.
        failed: failures recorded (a failed prompt is retried on the next run).
        lost: requests that were in flight when a run died.
    """

    completed: int = 0
    output_tokens: int = 0
    prompt_tokens: int = 0
    cost_units: int = 0
    failed: int = 0
    lost: int = 0


@dataclass(frozen=True, slots=True)
class LostRequest:
    """A request that was in flight when a previous run died (its result is gone)."""

    dataset: str
    prompt_id: str
    generation_id: str | None


class Journal(Protocol):
    """What the runner needs from a journal: claim a prompt, then complete or release it."""

    def is_done(self, dataset: str, prompt_id: str) -> bool:
        """Whether the prompt is already completed (in this or an earlier run)."""
        ...

    def claim(self, dataset: str, prompt_id: str) -> bool:
        """Take the prompt for sending; False if it is done or already in flight."""
        ...

    def attach(self, dataset: str, prompt_id: str, generation_id: str) -> None:
        """Record a claimed request's generation id as soon as it is known."""
        ...

    def complete(
        self,
        dataset: str,
        prompt_id: str,
        record: bytes,
        *,
        output_tokens: int,
        prompt_tokens: int,
        cost_units: int,
        location: int | None = None,
    ) -> None:
        """Commit a claimed prompt's output ``record`` (one JSON line); it is done."""
        ...

    def release(self, dataset: str, prompt_id: str, *, reason: str) -> None:
        """Give a claimed prompt back without a result (it runs again later)."""
        ...

    def tally(self, dataset: str) -> DatasetTally:
        """What has been completed for a dataset so far."""
        ...

    def flush(self) -> None:
        """Commit everything buffered: outputs first, then journal lines."""
        ...

    def close(self, reason: str = "closed") -> None:
        """Flush, sync to disk, and let go of the journal."""
        ...


class _Output:
    __slots__ = ("fh", "path", "pending", "size")

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size
        self.fh: IO[bytes] | None = None
        self.pending: list[bytes] = []


class _Batch:
    """Consecutive claims or completions of one dataset: one journal line."""

    __slots__ = ("columns", "ds", "op")

    def __init__(self, op: str, ds: str) -> None:
        self.op = op
        self.ds = ds
        self.columns: dict[str, list[Any]] = {"ids": []}
        if op == "done":
            for name in _COLUMNS[1:]:
                self.columns[name] = []

    def encode(self) -> bytes:
        return _dumps({"op": self.op, "ds": self.ds, **self.columns}).encode()


class _DatasetState:
    __slots__ = ("done", "inputs", "locations", "tally")

    def __init__(self) -> None:
        self.done: set[str] = set()
        self.locations: set[int] = set()
        self.tally = DatasetTally()
        self.inputs: list[Any] | None = None


class FileJournal:
    """The journal and the outputs of one job directory (see the module docstring).

    Open it with :meth:`open`; it repairs what a crash left behind before returning.

    Attributes:
        directory: the job directory (outputs, journal, lock).
        lost: requests found in flight from a previous run.
        repairs: human-readable notes on what opening had to repair.
    """

    def __init__(self, directory: Path, *, autoflush: bool = False) -> None:
        self.directory = directory
        self.path = directory / JOURNAL_FILE
        self.autoflush = autoflush
        self.lost: list[LostRequest] = []
        self.repairs: list[str] = []
        self._state: dict[str, _DatasetState] = {}
        self._inflight: dict[tuple[str, str], str | None] = {}
        self._outputs: dict[str, _Output] = {}
        # Buffered until flush, written in this order: claims, notes, completions.
        # (A claim and the completion of the same prompt may share a flush; a
        # release flushes first, so a re-claim never precedes its earlier release.)
        self._claims: dict[str, _Batch] = {}
        self._pending: list[bytes] = []
        self._dones: dict[str, _Batch] = {}
        self._locates: dict[str, _Batch] = {}
        self._fh: IO[bytes] | None = None
        self._lock_fh: IO[bytes] | None = None
        self._closed = False

    # --- opening ------------------------------------------------------------------

    @classmethod
    def open(cls, directory: str | Path, *, autoflush: bool = False) -> FileJournal:
        """Open (creating if needed) the journal in ``directory``, repairing a crash.

        Raises:
            ConfigurationError: another process holds this directory's journal.
            DataFileError: the journal is damaged before its last line (names the line).
        """
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        journal = cls(path, autoflush=autoflush)
        journal._lock()
        try:
            repairs = journal._load()
            journal._fh = journal.path.open("ab", buffering=0)
            if journal.path.stat().st_size == 0:
                journal._note({"op": "journal", "v": _FORMAT_VERSION})
            journal._note({"op": "run", "ts": round(time.time(), 3), "pid": os.getpid()})
            for entry in repairs:
                journal._note(entry)
            for request in journal.lost:
                lost: dict[str, Any] = {
                    "op": "lost",
                    "ds": request.dataset,
                    "id": request.prompt_id,
                }
                if request.generation_id:
                    lost["gen"] = request.generation_id
                journal._note(lost)
            journal.flush()
        except BaseException:
            journal._release_lock()
            raise
        return journal

    def _lock(self) -> None:
        fh = (self.directory / _LOCK_FILE).open("a+b")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            raise ConfigurationError(
                f"another provider-router process is using {self.directory} "
                "(its journal is locked); wait for it or use another --out"
            ) from None
        self._lock_fh = fh

    def _release_lock(self) -> None:
        if self._lock_fh is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_fh.fileno(), fcntl.LOCK_UN)
            self._lock_fh.close()
            self._lock_fh = None

    def _read_lines(self) -> list[bytes]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise DataFileError(self.path, f"cannot read journal: {exc.strerror or exc}") from None
        if data and not data.endswith(b"\n"):
            # A crash mid-append leaves a torn last line; it was never committed.
            keep = data.rfind(b"\n") + 1
            with self.path.open("r+b") as fh:
                fh.truncate(keep)
            self.repairs.append(
                f"dropped a torn last line ({len(data) - keep} bytes) of {self.path}"
            )
            data = data[:keep]
        return data.split(b"\n")[:-1] if data else []

    def _entries(self, lines: list[bytes]) -> Iterator[tuple[int, dict[str, Any]]]:
        for start in range(0, len(lines), _LOAD_CHUNK_LINES):
            chunk = lines[start : start + _LOAD_CHUNK_LINES]
            try:
                entries = json.loads(b"[" + b",".join(chunk) + b"]")
            except ValueError:
                entries = [self._parse_one(start + i + 1, line) for i, line in enumerate(chunk)]
            for offset, entry in enumerate(entries):
                lineno = start + offset + 1
                if not isinstance(entry, dict) or "op" not in entry:
                    raise DataFileError(self.path, "journal entry has no `op`", line=lineno)
                yield lineno, entry

    def _parse_one(self, lineno: int, line: bytes) -> Any:
        try:
            return json.loads(line)
        except ValueError as exc:
            raise DataFileError(
                self.path,
                f"journal line is damaged ({exc}); it is not the last line, so this is "
                "not a crash the journal can repair — was the file edited?",
                line=lineno,
            ) from None

    def _load(self) -> list[dict[str, Any]]:
        """Replay the journal; return the entries that record what had to be repaired."""
        lines = self._read_lines()
        # The committed length of each output: the last `done` end or `truncate` size.
        ends: dict[str, int] = {}
        open_claims = self._inflight  # reused while loading, emptied afterwards
        try:
            for lineno, entry in self._entries(lines):
                self._replay(lineno, entry, ends, open_claims)
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, DataFileError):
                raise
            raise DataFileError(self.path, f"journal entry is malformed: {exc!r}") from None
        self.lost = [LostRequest(ds, pid, gen) for (ds, pid), gen in open_claims.items()]
        for request in self.lost:
            self._ds(request.dataset).tally.lost += 1
        open_claims.clear()
        repairs: list[dict[str, Any]] = []
        for ds in sorted(ends):
            repairs += self._repair_output(ds, ends[ds], lines)
        return repairs

    def _replay(
        self,
        lineno: int,
        entry: dict[str, Any],
        ends: dict[str, int],
        open_claims: dict[tuple[str, str], str | None],
    ) -> None:
        op = entry["op"]
        if op == "done":
            ds = entry["ds"]
            ids = entry["ids"]
            state = self._ds(ds)
            for pid in ids:
                open_claims.pop((ds, pid), None)
            before = len(state.done)
            state.done.update(ids)
            if len(state.done) - before != len(ids):
                raise DataFileError(self.path, f"an id of {ds!r} is done twice", line=lineno)
            state.locations.update(entry["loc"])
            self._count(state, entry, 1)
            if entry["end"]:
                ends[ds] = entry["end"][-1]
        elif op == "claim":
            ds = entry["ds"]
            for pid in entry["ids"]:
                open_claims[(ds, pid)] = None
        elif op == "gen":
            key = (entry["ds"], entry["id"])
            if key in open_claims:
                open_claims[key] = entry["gen"]
        elif op == "fail":
            open_claims.pop((entry["ds"], entry["id"]), None)
            self._ds(entry["ds"]).tally.failed += 1
        elif op == "lost":
            open_claims.pop((entry["ds"], entry["id"]), None)
            self._ds(entry["ds"]).tally.lost += 1
        elif op == "revoke":
            state = self._ds(entry["ds"])
            state.done.difference_update(entry["ids"])
            state.locations.difference_update(entry["loc"])
            self._count(state, entry, -1)
        elif op == "truncate":
            ends[entry["ds"]] = entry["size"]
        elif op == "output":
            ends.setdefault(entry["ds"], 0)
        elif op == "inputs":
            # Other files (or changed ones): earlier locations mean nothing any more.
            state = self._ds(entry["ds"])
            state.inputs = entry["files"]
            state.locations.clear()
        elif op == "locate":
            self._ds(entry["ds"]).locations.update(entry["loc"])

    @staticmethod
    def _count(state: _DatasetState, entry: dict[str, Any], sign: int) -> None:
        tally = state.tally
        tally.completed += sign * len(entry["ids"])
        tally.output_tokens += sign * sum(entry["out"])
        tally.prompt_tokens += sign * sum(entry["in"])
        tally.cost_units += sign * sum(entry["cost"])

    def _repair_output(self, ds: str, committed: int, lines: list[bytes]) -> list[dict[str, Any]]:
        path = output_path(self.directory, ds)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = 0
        repairs: list[dict[str, Any]] = []
        if size < committed:
            committed, repairs = self._revoke_past(ds, size, lines)
        if size > committed:
            with path.open("r+b") as fh:
                fh.truncate(committed)
            self.repairs.append(f"cut {size - committed} uncommitted bytes from the end of {path}")
        self._outputs[ds] = _Output(path, committed)
        return repairs

    def _revoke_past(
        self, ds: str, size: int, lines: list[bytes]
    ) -> tuple[int, list[dict[str, Any]]]:
        """Revoke the completions whose record lies past ``size`` (rare: a lost output)."""
        current: dict[str, tuple[int, ...]] = {}
        for _, entry in self._entries(lines):
            if entry.get("ds") != ds:
                continue
            if entry["op"] == "done":
                for row in zip(*(entry[c] for c in _COLUMNS), strict=True):
                    current[row[0]] = row
            elif entry["op"] == "revoke":
                for pid in entry["ids"]:
                    current.pop(pid, None)
        gone = [row for row in current.values() if row[1] > size]
        revoke = _Batch("revoke", ds)
        revoke.columns = {name: [row[i] for row in gone] for i, name in enumerate(_COLUMNS)}
        state = self._ds(ds)
        state.done.difference_update(revoke.columns["ids"])
        state.locations.difference_update(revoke.columns["loc"])
        self._count(state, revoke.columns, -1)
        committed = max((row[1] for row in current.values() if row[1] <= size), default=0)
        self.repairs.append(
            f"{output_path(self.directory, ds)} is shorter than the journal says: "
            f"{len(gone)} completed prompts were lost from it and will run again"
        )
        return committed, [
            {"op": "revoke", "ds": ds, **revoke.columns},
            {"op": "truncate", "ds": ds, "size": committed},
        ]

    def _ds(self, ds: str) -> _DatasetState:
        state = self._state.get(ds)
        if state is None:
            state = self._state[ds] = _DatasetState()
        return state

    # --- reading ------------------------------------------------------------------------

    def is_done(self, dataset: str, prompt_id: str) -> bool:
        state = self._state.get(dataset)
        return state is not None and prompt_id in state.done

    def done_ids(self, dataset: str) -> Set[str]:
        """Every completed id of a dataset (a live, read-only view)."""
        return self._ds(dataset).done

    def done_locations(self, dataset: str) -> Set[int]:
        """The input locations (:attr:`Prompt.location`) of completed prompts (read-only)."""
        return self._ds(dataset).locations

    def tally(self, dataset: str) -> DatasetTally:
        return self._ds(dataset).tally

    def datasets(self) -> list[str]:
        """Every dataset the journal knows of."""
        return sorted(self._state)

    @property
    def in_flight(self) -> int:
        """Prompts claimed and not yet completed or released."""
        return len(self._inflight)

    def fast_resume_ok(self, dataset: str, fingerprint: list[Any]) -> bool:
        """Whether done prompts can be skipped by location (see :class:`PromptReader`).

        True when the input files are the ones last recorded (same paths, sizes and
        modification times) and every completed prompt's location is known.
        """
        state = self._ds(dataset)
        if state.inputs != fingerprint:
            return False
        return _NO_LOCATION not in state.locations and len(state.locations) == len(state.done)

    # --- writing ------------------------------------------------------------------------

    def record_inputs(self, dataset: str, fingerprint: list[Any]) -> None:
        """Record which input files (path, size, mtime) a dataset reads from now on.

        Locations recorded for other files are forgotten; a run that reads the new
        files whole re-records the location of each done prompt (:meth:`relocate`).
        """
        state = self._ds(dataset)
        state.inputs = fingerprint
        state.locations.clear()
        self._note({"op": "inputs", "ds": dataset, "files": fingerprint})

    def relocate(self, dataset: str, prompt_id: str, location: int) -> None:
        """Record where a done prompt is in the current input files."""
        state = self._ds(dataset)
        if prompt_id not in state.done:
            raise KeyError(f"{dataset}/{prompt_id} is not done")
        state.locations.add(location)
        batch = self._locates.get(dataset)
        if batch is None:
            batch = self._locates[dataset] = _Batch("locate", dataset)
            batch.columns["loc"] = []
        batch.columns["ids"].append(prompt_id)
        batch.columns["loc"].append(location)

    def prepare(self, datasets: list[str]) -> None:
        """Check that the outputs of ``datasets`` can be written, before anything is spent.

        Raises:
            ConfigurationError: an output file exists that this journal did not write.
        """
        for ds in datasets:
            if ds in self._outputs:
                continue
            path = output_path(self.directory, ds)
            if path.exists() and path.stat().st_size > 0:
                raise ConfigurationError(
                    f"{path} exists but the journal in {self.directory} never wrote to it; "
                    "move it away or choose another --out"
                )
            self._outputs[ds] = _Output(path, 0)
            # Durable before any record is written, so that a crash right after the
            # first record leaves an output file the journal knows (and can cut back).
            if self._fh is not None:
                _write_all(self._fh, _dumps({"op": "output", "ds": ds}).encode() + b"\n")

    def _batch(self, op: str, ds: str) -> _Batch:
        batches = self._claims if op == "claim" else self._dones
        batch = batches.get(ds)
        if batch is None:
            batch = batches[ds] = _Batch(op, ds)
        return batch

    def claim(self, dataset: str, prompt_id: str) -> bool:
        key = (dataset, prompt_id)
        if key in self._inflight or self.is_done(dataset, prompt_id):
            return False
        self._inflight[key] = None
        self._batch("claim", dataset).columns["ids"].append(prompt_id)
        return True

    def attach(self, dataset: str, prompt_id: str, generation_id: str) -> None:
        key = (dataset, prompt_id)
        if key not in self._inflight:
            raise KeyError(f"{dataset}/{prompt_id} is not claimed")
        self._inflight[key] = generation_id
        self._note({"op": "gen", "ds": dataset, "id": prompt_id, "gen": generation_id})

    def complete(
        self,
        dataset: str,
        prompt_id: str,
        record: bytes,
        *,
        output_tokens: int,
        prompt_tokens: int,
        cost_units: int,
        location: int | None = None,
    ) -> None:
        key = (dataset, prompt_id)
        if key not in self._inflight:
            raise KeyError(f"{dataset}/{prompt_id} is not claimed")
        if not record.endswith(b"\n") or b"\n" in record[:-1]:
            raise ValueError("an output record must be exactly one line ending in a newline")
        del self._inflight[key]
        output = self._outputs.get(dataset)
        if output is None:
            self.prepare([dataset])
            output = self._outputs[dataset]
        output.pending.append(record)
        output.size += len(record)
        loc = _NO_LOCATION if location is None else location
        columns = self._batch("done", dataset).columns
        columns["ids"].append(prompt_id)
        columns["end"].append(output.size)
        columns["out"].append(output_tokens)
        columns["in"].append(prompt_tokens)
        columns["cost"].append(cost_units)
        columns["loc"].append(loc)
        state = self._ds(dataset)
        state.done.add(prompt_id)
        state.locations.add(loc)
        tally = state.tally
        tally.completed += 1
        tally.output_tokens += output_tokens
        tally.prompt_tokens += prompt_tokens
        tally.cost_units += cost_units
        if self.autoflush:
            self.flush()

    def release(self, dataset: str, prompt_id: str, *, reason: str) -> None:
        if (dataset, prompt_id) not in self._inflight:
            raise KeyError(f"{dataset}/{prompt_id} is not claimed")
        # Its claim must reach the journal before its release does.
        self.flush()
        del self._inflight[(dataset, prompt_id)]
        self._note({"op": "fail", "ds": dataset, "id": prompt_id, "why": reason})
        self._ds(dataset).tally.failed += 1

    def _note(self, entry: dict[str, Any]) -> None:
        self._pending.append(_dumps(entry).encode())

    def note(self, op: str, **fields: Any) -> None:
        """Append an informational entry (a run's stop reason, a budget change...)."""
        self._note({"op": op, "ts": round(time.time(), 3), **fields})

    def flush(self) -> None:
        if self._fh is None:
            return
        for output in self._outputs.values():
            if output.pending:
                if output.fh is None:
                    output.fh = output.path.open("ab", buffering=0)
                _write_all(output.fh, b"".join(output.pending))
                output.pending.clear()
        if self._claims or self._pending or self._dones or self._locates:
            lines = [batch.encode() for batch in self._claims.values()]
            lines += self._pending
            lines += [batch.encode() for batch in self._locates.values()]
            lines += [batch.encode() for batch in self._dones.values()]
            self._claims.clear()
            self._pending.clear()
            self._locates.clear()
            self._dones.clear()
            lines.append(b"")
            _write_all(self._fh, b"\n".join(lines))

    def sync(self) -> None:
        """Flush and fsync the outputs and the journal (survives power loss)."""
        self.flush()
        for output in self._outputs.values():
            if output.fh is not None:
                os.fsync(output.fh.fileno())
        if self._fh is not None:
            os.fsync(self._fh.fileno())

    def close(self, reason: str = "closed") -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._fh is not None:
                for dataset, prompt_id in list(self._inflight):
                    self.release(dataset, prompt_id, reason="abandoned")
                self.note("stop", why=reason)
                self.sync()
        finally:
            for output in self._outputs.values():
                if output.fh is not None:
                    output.fh.close()
                    output.fh = None
            if self._fh is not None:
                self._fh.close()
                self._fh = None
            self._release_lock()

    def __enter__(self) -> FileJournal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _write_all(fh: IO[bytes], data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = fh.write(view)
        if not written:
            raise OSError("write made no progress")
        view = view[written:]
