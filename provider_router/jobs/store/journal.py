"""The journal: what makes a job exactly-once across crashes and restarts.

One append-only JSONL file beside the outputs records every claim, completion and
failure. Output lines are appended *before* the ``done`` entry that commits them, and
that entry records each output file's length, so the journal is the truth: a prompt is
done if and only if it has a ``done`` entry. On open, anything past a committed length
is cut, claims left open become ``lost`` (reconciled through their generation id), and
``done`` entries past a file the disk cut are revoked. One process at a time holds it
(an OS lock on the job directory); writes are committed by :meth:`FileJournal.flush`
once per event-loop turn. Reading and repairing the file: :mod:`._journal_file`.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Callable, Set
from decimal import Decimal
from pathlib import Path
from typing import IO, Any, Protocol

from provider_router._exceptions import ConfigurationError, DataFileError
from provider_router._money import from_units, to_units
from provider_router.jobs.store._journal_file import (
    FORMAT_VERSION,
    NO_LOCATION,
    DatasetState,
    DatasetTally,
    LineGroup,
    LostRequest,
    OutputFile,
    Replay,
    apply_aside,
    dumps,
    lock_directory,
    replay,
    unlock,
)
from provider_router.jobs.store._layout import JobLayout
from provider_router.jobs.store.aside import Move, finish_move, stage_move

__all__ = ["DatasetTally", "FileJournal", "Journal", "LostRequest"]


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
        truncated: bool = False,
    ) -> None:
        """Commit a claimed prompt's output ``record`` (one JSON line); it is done.
        ``truncated``: the answer was cut at ``max_tokens`` (counted apart)."""
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


class FileJournal:
    """The journal and the outputs of one job directory (see the module docstring).

    Open it with :meth:`open`; it repairs what a crash left behind before returning.

    Attributes:
        directory: the job directory (outputs, journal, lock).
        lost: requests found in flight from a previous run.
        repairs: human-readable notes on what opening had to repair.
        ledger: the identity of the ledger this job's money is in, once recorded.
        budget: the budget this job's runs last gave its ledger (:meth:`note_budget`;
            None before one was recorded): a limit that differs was set outside them.
        spent_before: whether an earlier run sent requests (so a ledger must exist).
    """

    def __init__(self, directory: Path, *, autoflush: bool = False) -> None:
        self.directory = directory
        self.path = JobLayout(directory).journal
        self.autoflush = autoflush
        self.lost: list[LostRequest] = []
        self.repairs: list[str] = []
        self.ledger: str | None = None
        self.budget: Decimal | None = None
        self.spent_before = False
        self.preflight_units = 0
        """What every run's preflight request cost (picodollars, in the ledger's spent)."""
        self.verify_units = 0
        """What every run's verification checks cost (picodollars, in the ledger's spent:
        :meth:`note_verify`)."""
        self.excluded: set[str] = set()
        """Endpoint tags ``run --verify`` excluded in any run (:meth:`note_excluded`)."""
        self.unsettled: dict[str, int] = {}
        """Paid answers whose charge the ledger could not record (a full disk): request
        key → cost (picodollars), for the next recovery (:meth:`note_unsettled`)."""
        self.disputes: list[dict[str, Any]] = []
        """Answers whose ``usage.cost`` was disputed, every run's (:meth:`note_disputed`)."""
        self._state: defaultdict[str, DatasetState] = defaultdict(DatasetState)
        self._inflight: dict[tuple[str, str], str | None] = {}
        self._outputs: dict[str, OutputFile] = {}
        # Buffered until flush, written in this order: claims, notes, completions.
        # (A claim and the completion of the same prompt may share a flush; a
        # release flushes first, so a re-claim never precedes its earlier release.)
        self._claims: dict[str, LineGroup] = {}
        self._pending: list[bytes] = []
        self._dones: dict[str, LineGroup] = {}
        self._locates: dict[str, LineGroup] = {}
        self._fh: IO[bytes] | None = None
        self._lock_fd: int | None = None
        self._closed = False
        self._replay: Replay | None = None
        self.adopted: dict[str, int] = {}
        """Paid output records the journal had not committed, kept as done (by dataset)."""

    # --- opening ------------------------------------------------------------------

    @classmethod
    def open(cls, directory: str | Path, *, autoflush: bool = False) -> FileJournal:
        """Open (creating if needed) the journal in ``directory``, repairing a crash.

        :meth:`read`, then :meth:`begin`.

        Raises:
            ConfigurationError: another process holds this directory's journal.
            DataFileError: the journal is damaged before its last line (names the line).
        """
        journal = cls.read(directory, autoflush=autoflush)
        try:
            journal.begin()
        except BaseException:
            journal._release_lock()
            raise
        return journal

    @classmethod
    def read(cls, directory: str | Path, *, autoflush: bool = False) -> FileJournal:
        """Lock ``directory`` and read its journal, writing nothing yet.

        What a crash left to repair is found but not written, and notes (such as
        :meth:`record_ledger`) are held, until :meth:`begin`: a run checks its ledger
        in between, so a refused start leaves the job's files as they were.
        :meth:`close` before :meth:`begin` only lets go of the lock.

        Raises:
            ConfigurationError: another process holds this directory's journal.
            DataFileError: the journal is damaged before its last line (names the line).
        """
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        journal = cls(path, autoflush=autoflush)
        journal._lock_fd = lock_directory(path)
        try:
            found = journal._replay = replay(path)
            journal._state = found.states
            journal._outputs = found.outputs
            journal.lost = found.lost
            journal.repairs = found.repairs
            journal.ledger = found.ledger
            journal.budget = found.budget
            journal.preflight_units = found.preflight_units
            journal.verify_units = found.verify_units
            journal.excluded = found.excluded
            journal.unsettled = found.unsettled
            journal.disputes = found.disputes
            journal.adopted = found.adopted
            journal.spent_before = found.spent_before
        except BaseException:
            journal._release_lock()
            raise
        return journal

    def begin(self) -> None:
        """Write what :meth:`read` found to repair, and the run's first lines."""
        found = self._replay
        if found is None or self._closed:
            raise RuntimeError("begin() follows read(), once")
        self._replay = None
        found.apply()
        held, self._pending = self._pending, []
        self._fh = self.path.open("ab", buffering=0)
        if self.path.stat().st_size == 0:
            self._note({"op": "journal", "v": FORMAT_VERSION})
        self._note({"op": "run", "ts": round(time.time(), 3), "pid": os.getpid()})
        for entry in found.repair_entries:
            self._note(entry)
        for request in self.lost:
            lost: dict[str, Any] = {"op": "lost", "ds": request.dataset, "id": request.prompt_id}
            if request.generation_id:
                lost["gen"] = request.generation_id
            self._note(lost)
        self._pending += held
        self.flush()

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            unlock(self._lock_fd)
            self._lock_fd = None

    # --- reading ------------------------------------------------------------------------

    def is_done(self, dataset: str, prompt_id: str) -> bool:
        state = self._state.get(dataset)
        return state is not None and prompt_id in state.done

    def done_ids(self, dataset: str) -> Set[str]:
        """Every completed id of a dataset (a live, read-only view)."""
        return self._state[dataset].done

    def done_locations(self, dataset: str) -> Set[int]:
        """The input locations (:attr:`Prompt.location`) of completed prompts (read-only)."""
        return self._state[dataset].locations

    def tally(self, dataset: str) -> DatasetTally:
        return self._state[dataset].tally

    def output_size(self, dataset: str) -> int | None:
        """The committed length of ``dataset``'s output (None: the journal has none)."""
        output = self._outputs.get(dataset)
        return None if output is None else output.size - sum(map(len, output.pending))

    @property
    def committed_cost(self) -> Decimal:
        """What the journal's completions (those set aside too), preflights and
        verification checks cost, over every run: what the job's ledger holds at least."""
        units = sum(
            state.tally.cost_units + state.tally.set_aside_units for state in self._state.values()
        )
        return from_units(units + self.preflight_units + self.verify_units)

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
        state = self._state[dataset]
        if state.inputs != fingerprint:
            return False
        return NO_LOCATION not in state.locations and len(state.locations) == len(state.done)

    # --- writing ------------------------------------------------------------------------

    def record_inputs(self, dataset: str, fingerprint: list[Any]) -> None:
        """Record which input files (path, size, mtime) a dataset reads from now on.

        Locations recorded for other files are forgotten; a run that reads the new
        files whole re-records the location of each done prompt (:meth:`relocate`).
        """
        state = self._state[dataset]
        state.inputs = fingerprint
        state.locations.clear()
        self._note({"op": "inputs", "ds": dataset, "files": fingerprint})

    def relocate(self, dataset: str, prompt_id: str, location: int) -> None:
        """Record where a done prompt is in the current input files."""
        state = self._state[dataset]
        if prompt_id not in state.done:
            raise KeyError(f"{dataset}/{prompt_id} is not done")
        state.locations.add(location)
        group = self._locates.get(dataset)
        if group is None:
            group = self._locates[dataset] = LineGroup("locate", dataset)
            group.columns["loc"] = []
        group.columns["ids"].append(prompt_id)
        group.columns["loc"].append(location)

    def check_outputs(self, datasets: list[str]) -> None:
        """Refuse output files of ``datasets`` that this journal did not write.

        Such a file holding paid records (each with its generation id) is most likely
        this job's own, whose journal was lost or cut: the advice is to restore the
        journal, since moving the file away pays for those prompts again.

        Raises:
            ConfigurationError: an output file exists that this journal did not write.
        """
        for ds in datasets:
            if ds in self._outputs:
                continue
            path = JobLayout(self.directory).output(ds)
            if not (path.exists() and path.stat().st_size > 0):
                continue
            if _starts_with_paid_record(path):
                raise ConfigurationError(
                    f"{path} holds paid outputs (records with a generation id) that "
                    f"{self.path} does not record: if this job's journal was lost or cut, "
                    "restore it (and keep ledger.sqlite); moving the outputs away pays for "
                    "those prompts again. Otherwise choose another --out"
                )
            raise ConfigurationError(
                f"{path} exists but the journal in {self.directory} never wrote to it; "
                "move it away or choose another --out"
            )

    def prepare(self, datasets: list[str]) -> None:
        """Check that the outputs of ``datasets`` can be written, before anything is spent.

        Raises:
            ConfigurationError: an output file exists that this journal did not write.
        """
        self.check_outputs(datasets)
        for ds in datasets:
            if ds in self._outputs:
                continue
            self._outputs[ds] = OutputFile(JobLayout(self.directory).output(ds), 0)
            # Durable before any record is written, so that a crash right after the
            # first record leaves an output file the journal knows (and can cut back).
            if self._fh is not None:
                _write_all(self._fh, dumps({"op": "output", "ds": ds}).encode() + b"\n")

    def _group(self, op: str, ds: str) -> LineGroup:
        groups = self._claims if op == "claim" else self._dones
        group = groups.get(ds)
        if group is None:
            group = groups[ds] = LineGroup(op, ds)
        return group

    def claim(self, dataset: str, prompt_id: str) -> bool:
        key = (dataset, prompt_id)
        if key in self._inflight or self.is_done(dataset, prompt_id):
            return False
        self._inflight[key] = None
        self._group("claim", dataset).columns["ids"].append(prompt_id)
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
        truncated: bool = False,
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
        loc = NO_LOCATION if location is None else location
        columns = self._group("done", dataset).columns
        columns["ids"].append(prompt_id)
        columns["end"].append(output.size)
        columns["out"].append(output_tokens)
        columns["in"].append(prompt_tokens)
        columns["cost"].append(cost_units)
        columns["loc"].append(loc)
        columns["cut"].append(1 if truncated else 0)
        state = self._state[dataset]
        state.done.add(prompt_id)
        state.locations.add(loc)
        tally = state.tally
        tally.completed += 1
        tally.output_tokens += output_tokens
        tally.prompt_tokens += prompt_tokens
        tally.cost_units += cost_units
        if truncated:
            tally.truncated += 1
            tally.truncated_units += cost_units
        if self.autoflush:
            self.flush()

    def release(self, dataset: str, prompt_id: str, *, reason: str) -> None:
        if (dataset, prompt_id) not in self._inflight:
            raise KeyError(f"{dataset}/{prompt_id} is not claimed")
        # Its claim must reach the journal before its release does.
        self.flush()
        del self._inflight[(dataset, prompt_id)]
        self._note({"op": "fail", "ds": dataset, "id": prompt_id, "why": reason})
        self._state[dataset].tally.failed += 1

    def _note(self, entry: dict[str, Any]) -> None:
        self._pending.append(dumps(entry).encode())

    def checked(self, dataset: str) -> list[Any] | None:
        """The input files (path, size, mtime) every done prompt's output of ``dataset`` was
        last checked against (:meth:`record_checked`), or None."""
        return self._state[dataset].checked

    def record_checked(self, dataset: str, fingerprint: list[Any]) -> None:
        """Record (durably, at once) that every done prompt's output of ``dataset`` answers
        what the input files ``fingerprint`` ask (their request digests were checked)."""
        self._state[dataset].checked = fingerprint
        self._note({"op": "checked", "ds": dataset, "files": fingerprint})
        self.flush()

    def set_aside(self, dataset: str, pick: Callable[[dict[str, Any]], bool], *, why: str) -> Move:
        """Move the committed output rows of ``dataset`` that ``pick`` selects out of its
        outputs, into ``set_aside/<why>/<dataset>.jsonl`` (appended, never deleted).

        They are no longer done (their prompts run again), and the dataset's tally no
        longer counts them but their cost is kept as set aside: the ledger spent it
        (:attr:`committed_cost`). Durable when it returns, and whole across a crash at any
        point (:mod:`provider_router.jobs.store.aside`). Call it with none of the
        dataset's prompts in flight.

        Raises:
            DataFileError: a committed row is not an output record (the file was edited).
        """
        if self._fh is None:
            raise RuntimeError("set_aside() follows begin()")
        if any(ds == dataset for ds, _ in self._inflight):
            raise RuntimeError(f"{dataset} has prompts in flight")
        self.flush()
        output = self._outputs.get(dataset)
        if output is None or output.size == 0:
            return Move()
        nonce = os.urandom(6).hex()
        aside = JobLayout(self.directory).set_aside(why, dataset)
        try:
            move, renames = stage_move(output.path, output.size, pick, aside, nonce)
        except ValueError as exc:
            raise DataFileError(output.path, str(exc)) from None
        if not move.ids:
            return move
        entry = move.entry(dataset, why, nonce, aside.relative_to(self.directory))
        _write_all(self._fh, dumps(entry).encode() + b"\n")
        os.fsync(self._fh.fileno())  # committed: a crash from here on finishes the move
        if output.fh is not None:
            output.fh.close()  # the file it writes is about to be replaced
            output.fh = None
        finish_move(renames)
        output.size = move.size
        apply_aside(self._state[dataset], entry)
        return move

    def record_ledger(self, identity: str) -> None:
        """Record (durably, at once) which ledger holds this job's money."""
        self.ledger = identity
        self.note("ledger", id=identity)
        self.flush()

    def note_budget(self, budget: Decimal, old: Decimal | None = None) -> None:
        """Record (durably, once the journal has begun) the budget a run gave the job's
        ledger: a change of its limit from ``old`` (a ``budget`` entry), or, without
        ``old``, the limit it found and kept (``job_budget``)."""
        self.budget = budget
        if old is None:
            self.note("job_budget", budget=str(budget))
        else:
            self.note("budget", old=str(old), new=str(budget))
        self.flush()

    def note_preflight(self, cost: Decimal) -> None:
        """Record (durably, at once) what a run's preflight request cost."""
        units = to_units(cost)
        self.preflight_units += units
        self.note("preflight", cost=units)
        self.flush()

    def note_verify(self, cost: Decimal, check: int) -> None:
        """Record (durably, at once) what verification check ``check`` cost: its canaries
        are booked on the job's ledger, so an older copy of it that forgot them is
        refused as one that forgot a completion is."""
        units = to_units(cost)
        self.verify_units += units
        self.note("verify_cost", cost=units, check=check)
        self.flush()

    def note_excluded(self, tags: set[str] | frozenset[str], check: int) -> None:
        """Record (durably, at once) endpoints a verification check excluded: a later run
        refuses to start without the ``verify.json`` that keeps them excluded."""
        self.excluded |= tags
        self.note("verify", failed=sorted(tags), check=check)
        self.flush()

    def note_disputed(
        self, key: str, generation_id: str | None, reported: Decimal, booked: Decimal
    ) -> None:
        """Record (durably, at once) an answer's ``usage.cost`` that was not booked.

        ``booked`` (the worst case, in the ledger's spent) is what the job counts;
        ``reported`` is kept beside it for the operator to check on the dashboard
        (docs/ledger.md, "Disputed").
        """
        entry = {
            "op": "disputed",
            "key": key,
            "gen": generation_id,
            "reported": str(reported),
            "booked": to_units(booked),
        }
        self.disputes.append(entry)
        self.note(
            "disputed",
            key=key,
            gen=generation_id,
            reported=str(reported),
            booked=to_units(booked),
        )
        self.flush()

    def note_unsettled(self, key: str, cost: Decimal) -> None:
        """Record a paid answer's cost that the ledger could not (its settle failed).

        Its reservation stays open without, maybe, its generation id (the attach
        failed too): the next run's recovery settles it at this cost rather than at
        its worst case (:func:`~provider_router.jobs.store.recovery.reconcile_crashed`).
        Written with the answer's own record, at the next flush.
        """
        units = to_units(cost)
        self.unsettled[key] = units
        self.note("unsettled", key=key, cost=units)

    def used_unsettled(self) -> None:
        """Forget the :attr:`unsettled` costs: a recovery has settled what it could with them."""
        if self.unsettled:
            self.unsettled = {}
            self.note("unsettled_used")

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
            lines = [group.encode() for group in self._claims.values()]
            lines += self._pending
            lines += [group.encode() for group in self._locates.values()]
            lines += [group.encode() for group in self._dones.values()]
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


def _starts_with_paid_record(path: Path) -> bool:
    """Whether the first line of ``path`` is a record carrying a generation id."""
    try:
        with path.open("rb") as fh:
            first = fh.readline(1 << 20)
        record = json.loads(first)
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and bool(record.get("generation_id"))


def _write_all(fh: IO[bytes], data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = fh.write(view)
        if not written:
            raise OSError("write made no progress")
        view = view[written:]
