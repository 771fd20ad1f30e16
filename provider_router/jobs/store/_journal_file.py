"""The journal's file format: its entries, replaying them, and repairing a crash.

:class:`FileJournal` (in :mod:`provider_router.jobs.store.journal`) writes the entries;
this module reads them back. :func:`replay` rebuilds every dataset's state from
``journal.jsonl``, drops a torn last line, cuts uncommitted bytes off the outputs,
revokes completions whose records the disk lost, and reports what it repaired and
which requests were in flight when the last run died. Reading writes nothing: the
repairs are applied by :meth:`Replay.apply` once the caller has checked the rest (the
job's ledger above all). An output record past the last commit that carries a
generation id is proof of a payment: it is adopted back as a completion, not cut. The
entries are listed in docs/output.md, "The journal".
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import IO, Any, Final

from provider_router._exceptions import ConfigurationError, DataFileError
from provider_router._money import to_units
from provider_router.jobs.store._layout import SET_ASIDE_DIR, JobLayout
from provider_router.jobs.store.aside import finish_move, staged_file

__all__ = [
    "COLUMNS",
    "FORMAT_VERSION",
    "NO_LOCATION",
    "LineGroup",
    "DatasetState",
    "DatasetTally",
    "LostRequest",
    "OutputFile",
    "Replay",
    "apply_aside",
    "dumps",
    "lock_directory",
    "lock_held",
    "replay",
    "unlock",
]

FORMAT_VERSION: Final = 1
NO_LOCATION: Final = -1
COLUMNS: Final = ("ids", "end", "out", "in", "cost", "loc", "cut")
"""A ``done`` line's columns; ``cut`` (1: the answer was cut at ``max_tokens``,
``finish_reason: length``) is missing from lines an earlier release wrote."""
_CUT_MARK: Final = b'"finish_reason":"length"'
"""How a cut answer's output record says so (records are compact JSON)."""
_STAGED_MARK: Final = ".aside-"
"""In the name of a temporary file of a move of rows set aside (:mod:`.aside`)."""
dumps: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_LOAD_CHUNK_LINES: Final = 20_000


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
        truncated: completions cut at ``max_tokens`` (``finish_reason: length``):
            paid for, and in the outputs, but not whole answers.
        truncated_units: their cost, in integer picodollars (in ``cost_units``).
        set_aside: completions moved out of the outputs (``run --redo-truncated``):
            kept in their own file, no longer done; their prompts run again.
        set_aside_units: their cost, in integer picodollars (spent: in the ledger,
            no longer in ``cost_units``).
    """

    completed: int = 0
    output_tokens: int = 0
    prompt_tokens: int = 0
    cost_units: int = 0
    failed: int = 0
    lost: int = 0
    truncated: int = 0
    truncated_units: int = 0
    set_aside: int = 0
    set_aside_units: int = 0


@dataclass(frozen=True, slots=True)
class LostRequest:
    """A request that was in flight when a previous run died (its result is gone)."""

    dataset: str
    prompt_id: str
    generation_id: str | None


class OutputFile:
    """An output file the journal owns: its committed size, records not yet written."""

    __slots__ = ("fh", "path", "pending", "size")

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size
        self.fh: IO[bytes] | None = None
        self.pending: list[bytes] = []


class LineGroup:
    """Consecutive claims or completions of one dataset: one journal line."""

    __slots__ = ("columns", "ds", "op")

    def __init__(self, op: str, ds: str) -> None:
        self.op = op
        self.ds = ds
        self.columns: dict[str, list[Any]] = {"ids": []}
        if op == "done":
            for name in COLUMNS[1:]:
                self.columns[name] = []

    def encode(self) -> bytes:
        return dumps({"op": self.op, "ds": self.ds, **self.columns}).encode()


class DatasetState:
    """What the journal knows of one dataset: done ids, their input locations, totals."""

    __slots__ = ("checked", "done", "inputs", "locations", "tally")

    def __init__(self) -> None:
        self.done: set[str] = set()
        self.locations: set[int] = set()
        self.tally = DatasetTally()
        self.inputs: list[Any] | None = None
        self.checked: list[Any] | None = None
        """The input files (path, size, mtime) every done prompt's output was last checked
        against (a ``checked`` entry): its request digest against what they ask now."""


def _paid_row(ds: str, line: bytes, done: set[str]) -> tuple[str, int, int, int, int] | None:
    """``line`` as a paid completion of ``ds`` (id, tokens out and in, cost units, cut), or
    None."""
    if not line.endswith(b"\n"):
        return None  # torn by a kill mid-write: not a whole record
    try:
        record = json.loads(line)
        pid, generation_id = record["id"], record["generation_id"]
        usage = record["usage"]
        row = (pid, int(usage["completion_tokens"]), int(usage["prompt_tokens"]))
        cost = to_units(Decimal(record["cost"]))
    except (ValueError, TypeError, KeyError, ArithmeticError):
        return None
    if not (isinstance(pid, str) and isinstance(generation_id, str) and generation_id):
        return None
    if record.get("dataset") != ds or pid in done:
        return None
    return (*row, cost, int(record.get("finish_reason") == "length"))


def _has_generation_id(line: bytes) -> bool:
    try:
        record = json.loads(line)
    except ValueError:
        return False
    return isinstance(record, dict) and bool(record.get("generation_id"))


def lock_directory(directory: Path) -> int:
    """Take the job directory's lock (one process per journal); its file descriptor.

    The lock is an OS lock (``flock``) on the directory itself, which nobody can
    delete while it holds the job's files: a lock *file* could be deleted during a
    run, letting a second run write beside the first. On a file system that cannot
    lock a directory (some network ones) the journal file is locked instead. The
    OS drops the lock when the process dies, however it dies.

    Raises:
        ConfigurationError: another process holds it.
    """
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return _lock_journal_file(directory)
        raise _locked(directory) from None
    return fd


def _lock_journal_file(directory: Path) -> int:
    fd = os.open(JobLayout(directory).journal, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise _locked(directory) from None
    return fd


def _locked(directory: Path) -> ConfigurationError:
    return ConfigurationError(
        f"another provider-router process is using {directory} "
        "(its journal is locked); wait for it or use another --out"
    )


def lock_held(directory: Path) -> bool | None:
    """Whether a process holds the job directory's lock (None where that cannot be told).

    For ``provider-router status``: the OS drops the lock when its process dies, so
    a free lock means no process is running the job, whatever its files say. The
    test takes a shared lock without waiting and gives it back at once: while a run
    holds the lock the test fails without touching it; only a run starting in that
    same instant could find the directory busy.
    """
    for path in (directory, JobLayout(directory).journal):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return True
            continue  # this file system cannot lock a directory: try the journal file
        finally:
            os.close(fd)  # closing gives back a lock this test took
        return False
    return None


def unlock(fd: int) -> None:
    """Give back a lock taken by :func:`lock_directory`."""
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def replay(directory: Path) -> Replay:
    """Read ``directory``'s journal, repairing what a crash left behind.

    Raises:
        DataFileError: the journal is damaged before its last line (names the line).
    """
    result = Replay(directory)
    result.repair_entries = result._load()
    return result


class Replay:
    """The state a journal file records, rebuilt by :func:`replay`.

    Attributes:
        states: every dataset's done ids, locations and tally.
        outputs: the output files the journal owns, at their committed size.
        lost: requests that were in flight when the last run died.
        repairs: human-readable notes on what had to be repaired.
        repair_entries: journal entries recording those repairs (to append).
        ledger: the identity of the ledger the job's money is in (last recorded).
        budget: the budget this job's runs last gave its ledger (``budget`` and
            ``job_budget`` entries; None before one was recorded).
        claimed: whether any request was ever sent (money may have been spent).
        preflight_units: what every run's preflight request cost (picodollars).
        verify_units: what every run's verification checks cost (picodollars).
        unsettled: paid answers whose charge the ledger could not record, by request
            key: their cost (picodollars), until a run's recovery used them.
        disputes: answers whose ``usage.cost`` was disputed (``disputed`` entries:
            request key, generation id, the answer's figure, what was booked).
        adopted: paid output records the journal had not committed, kept as done
            (by dataset: how many).
        excluded: endpoint tags ``run --verify`` excluded in any run (``verify``
            entries): ``DIR/verify.json`` must still list them.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = JobLayout(directory).journal
        self.states: defaultdict[str, DatasetState] = defaultdict(DatasetState)
        self.outputs: dict[str, OutputFile] = {}
        self.lost: list[LostRequest] = []
        self.repairs: list[str] = []
        self.repair_entries: list[dict[str, Any]] = []
        self.ledger: str | None = None
        self.budget: Decimal | None = None
        self.claimed = False
        self.preflight_units = 0
        self.verify_units = 0
        self.unsettled: dict[str, int] = {}
        self.disputes: list[dict[str, Any]] = []
        self.adopted: dict[str, int] = {}
        self.excluded: set[str] = set()
        self._journal_keep: int | None = None
        self._cuts: list[tuple[Path, int]] = []
        self._moves: dict[str, dict[str, Any]] = {}
        """Per dataset, its last ``aside`` entry (a move of rows out of its outputs)."""
        self._staged: dict[str, Path] = {}
        """Per dataset, the new output of a committed move not yet renamed into place."""
        self._renames: list[tuple[Path, Path]] = []
        self._stale: list[Path] = []
        self._uncounted: dict[str, set[str]] = {}
        """Per dataset, done ids of ``done`` lines without a ``cut`` column (an earlier
        release's), not yet counted by a ``cut`` entry."""

    @property
    def spent_before(self) -> bool:
        """Whether an earlier run may have spent money (so its ledger must exist)."""
        return (
            self.claimed
            or self.ledger is not None
            or any(state.done for state in self.states.values())
        )

    def apply(self) -> None:
        """Write the repairs :func:`replay` found: the torn line and uncommitted bytes cut,
        a committed move of rows set aside finished, a move that never committed undone."""
        if self._journal_keep is not None:
            with self.path.open("r+b") as fh:
                fh.truncate(self._journal_keep)
            self._journal_keep = None
        finish_move(self._renames)
        self._renames.clear()
        for stale in self._stale:
            stale.unlink(missing_ok=True)
        self._stale.clear()
        for path, size in self._cuts:
            with path.open("r+b") as fh:
                fh.truncate(size)
        self._cuts.clear()

    def _read_lines(self) -> list[bytes]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise DataFileError(self.path, f"cannot read journal: {exc.strerror or exc}") from None
        if data and not data.endswith(b"\n"):
            # A crash mid-append leaves a torn last line; it was never committed.
            keep = self._journal_keep = data.rfind(b"\n") + 1
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
        open_claims: dict[tuple[str, str], str | None] = {}  # claim → generation id
        try:
            for lineno, entry in self._entries(lines):
                self._replay(lineno, entry, ends, open_claims)
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, DataFileError):
                raise
            raise DataFileError(self.path, f"journal entry is malformed: {exc!r}") from None
        repairs: list[dict[str, Any]] = []
        self._find_moves()
        for ds in sorted(ends):
            repairs += self._repair_output(ds, ends[ds], lines)
        for ds, state in self.states.items():
            for pid in state.done:
                open_claims.pop((ds, pid), None)  # an adopted record's claim
        self.lost = [LostRequest(ds, pid, gen) for (ds, pid), gen in open_claims.items()]
        for request in self.lost:
            self.states[request.dataset].tally.lost += 1
        for ds in sorted(self._uncounted):
            repairs.append(self._count_uncounted_cuts(ds))
        return repairs

    def _find_moves(self) -> None:
        """The files of moves of rows set aside: a committed move's still under their
        temporary names (finished by :meth:`apply`), and any other move's (removed)."""
        layout = JobLayout(self.directory)
        staged = set()
        for ds, entry in self._moves.items():
            output = layout.output(ds)
            new = staged_file(output, entry["nonce"])
            if new.exists():
                self._staged[ds] = new
                aside = layout.set_aside(entry["why"], ds)
                self._renames += [(staged_file(aside, entry["nonce"]), aside), (new, output)]
                staged |= {new, staged_file(aside, entry["nonce"])}
        temporary = f".*{_STAGED_MARK}*"
        found = [*self.directory.glob(temporary)]
        found += (self.directory / SET_ASIDE_DIR).glob(f"*/{temporary}")
        self._stale = sorted(p for p in found if p not in staged)

    def _count_uncounted_cuts(self, ds: str) -> dict[str, Any]:
        """Count the cut answers among rows an earlier release committed (without a
        ``cut`` column): one read of the output, once; the ``cut`` entry returned records
        them, so a later open need not read it again."""
        ids = self._uncounted.pop(ds)
        output = self.outputs.get(ds)
        found: list[tuple[str, int]] = []
        if output is not None:
            try:
                with self._staged.get(ds, output.path).open("rb") as fh:
                    data = fh.read(output.size)
            except OSError:
                data = b""
            for line in data.splitlines():
                if _CUT_MARK not in line:
                    continue
                try:
                    record = json.loads(line)
                    pid, units = record["id"], to_units(Decimal(record["cost"]))
                except (ValueError, TypeError, KeyError, ArithmeticError):
                    continue
                if pid in ids and record.get("finish_reason") == "length":
                    found.append((pid, units))
        entry: dict[str, Any] = {
            "op": "cut",
            "ds": ds,
            "ids": [pid for pid, _ in found],
            "cost": [units for _, units in found],
        }
        self._count_cut(self.states[ds], entry)
        return entry

    @staticmethod
    def _count_cut(state: DatasetState, entry: dict[str, Any]) -> None:
        tally = state.tally
        tally.truncated += len(entry["ids"])
        tally.truncated_units += sum(entry["cost"])

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
            state = self.states[ds]
            for pid in ids:
                open_claims.pop((ds, pid), None)
            before = len(state.done)
            state.done.update(ids)
            if len(state.done) - before != len(ids):
                raise DataFileError(self.path, f"an id of {ds!r} is done twice", line=lineno)
            state.locations.update(entry["loc"])
            self._count(state, entry, 1)
            if "cut" not in entry:
                self._uncounted.setdefault(ds, set()).update(ids)
            if entry["end"]:
                ends[ds] = entry["end"][-1]
        elif op == "claim":
            self.claimed = True
            ds = entry["ds"]
            for pid in entry["ids"]:
                open_claims[(ds, pid)] = None
        elif op == "gen":
            key = (entry["ds"], entry["id"])
            if key in open_claims:
                open_claims[key] = entry["gen"]
        elif op == "fail":
            open_claims.pop((entry["ds"], entry["id"]), None)
            self.states[entry["ds"]].tally.failed += 1
        elif op == "lost":
            open_claims.pop((entry["ds"], entry["id"]), None)
            self.states[entry["ds"]].tally.lost += 1
        elif op == "revoke":
            state = self.states[entry["ds"]]
            state.done.difference_update(entry["ids"])
            state.locations.difference_update(entry["loc"])
            self._count(state, entry, -1)
            self._uncounted.get(entry["ds"], set()).difference_update(entry["ids"])
        elif op == "cut":
            # The cut answers among an earlier release's rows, counted once.
            self._uncounted.pop(entry["ds"], None)
            self._count_cut(self.states[entry["ds"]], entry)
        elif op == "aside":
            ds = entry["ds"]
            apply_aside(self.states[ds], entry)
            self._uncounted.get(ds, set()).difference_update(entry["ids"])
            self._moves[ds] = entry
            ends[ds] = entry["size"]
        elif op == "truncate":
            ends[entry["ds"]] = entry["size"]
        elif op == "output":
            ends.setdefault(entry["ds"], 0)
        elif op == "inputs":
            # Other files (or changed ones): earlier locations mean nothing any more.
            state = self.states[entry["ds"]]
            state.inputs = entry["files"]
            state.locations.clear()
        elif op == "locate":
            self.states[entry["ds"]].locations.update(entry["loc"])
        elif op == "ledger":
            self.ledger = entry["id"]
        elif op == "budget":
            self.budget = Decimal(entry["new"])
        elif op == "job_budget":
            self.budget = Decimal(entry["budget"])
        elif op == "preflight":
            self.preflight_units += entry["cost"]
        elif op == "unsettled":
            self.unsettled[entry["key"]] = entry["cost"]
        elif op == "unsettled_used":
            self.unsettled.clear()
        elif op == "disputed":
            self.disputes.append(entry)
        elif op == "verify_cost":
            self.verify_units += entry["cost"]
        elif op == "verify":
            self.excluded.update(str(tag) for tag in entry.get("failed", ()))
        elif op == "checked":
            self.states[entry["ds"]].checked = entry["files"]

    @staticmethod
    def _count(state: DatasetState, entry: dict[str, Any], sign: int) -> None:
        tally = state.tally
        tally.completed += sign * len(entry["ids"])
        tally.output_tokens += sign * sum(entry["out"])
        tally.prompt_tokens += sign * sum(entry["in"])
        tally.cost_units += sign * sum(entry["cost"])
        cut = entry.get("cut")
        if cut and any(cut):
            tally.truncated += sign * sum(cut)
            tally.truncated_units += sign * sum(
                units for units, was in zip(entry["cost"], cut, strict=True) if was
            )

    def _repair_output(self, ds: str, committed: int, lines: list[bytes]) -> list[dict[str, Any]]:
        path = JobLayout(self.directory).output(ds)
        readable = self._staged.get(ds, path)  # a committed move's new output, staged
        try:
            size = readable.stat().st_size
        except FileNotFoundError:
            size = 0
        repairs: list[dict[str, Any]] = []
        if size < committed:
            committed, repairs = self._revoke_past(ds, size, lines)
        if size > committed:
            adopted, committed, cut_paid = self._adopt_paid(ds, readable, committed)
            if adopted.columns["ids"]:
                repairs.append({"op": "done", "ds": ds, **adopted.columns})
                self.adopted[ds] = len(adopted.columns["ids"])
                self.repairs.append(
                    f"kept {self.adopted[ds]} paid output(s) of {path} that the journal had "
                    "not committed (each carries its generation id); they are done"
                )
        if size > committed:
            self._cuts.append((path, committed))
            paid = (
                f", among them {cut_paid} record(s) with a generation id that could not be "
                "kept (after a torn or foreign line, or a prompt done already; the ledger "
                "holds their charges)"
                if cut_paid
                else ""
            )
            self.repairs.append(
                f"cut {size - committed} uncommitted bytes from the end of {path}{paid}"
            )
        self.outputs[ds] = OutputFile(path, committed)
        return repairs

    def _adopt_paid(self, ds: str, path: Path, committed: int) -> tuple[LineGroup, int, int]:
        """The whole records past ``committed`` that prove a payment, made done again.

        Records are taken in order while each is a whole line, parses, belongs to
        ``ds``, carries a generation id and is not done already; the first that is
        not ends the adoption (what follows is cut). Returns the ``done`` group, the
        new committed length, and how many records with a generation id are cut.
        """
        group = LineGroup("done", ds)
        state = self.states[ds]
        end = committed
        cut_paid = 0
        with path.open("rb") as fh:
            fh.seek(committed)
            stopped = False
            for line in fh:
                row = None if stopped else _paid_row(ds, line, state.done)
                if row is None:
                    stopped = True
                    cut_paid += _has_generation_id(line)
                    continue
                end += len(line)
                pid, out, prompt, cost, cut = row
                state.done.add(pid)
                for name, value in zip(
                    COLUMNS, (pid, end, out, prompt, cost, NO_LOCATION, cut), strict=True
                ):
                    group.columns[name].append(value)
        if group.columns["ids"]:
            state.locations.add(NO_LOCATION)
            self._count(state, group.columns, 1)
        return group, end, cut_paid

    def _revoke_past(
        self, ds: str, size: int, lines: list[bytes]
    ) -> tuple[int, list[dict[str, Any]]]:
        """Revoke the completions whose record lies past ``size`` (rare: a lost output)."""
        current: dict[str, tuple[int, ...]] = {}
        for _, entry in self._entries(lines):
            if entry.get("ds") != ds:
                continue
            if entry["op"] == "done":
                for row in zip(*_columns(entry), strict=True):
                    current[row[0]] = row
            elif entry["op"] == "revoke":
                for pid in entry["ids"]:
                    current.pop(pid, None)
            elif entry["op"] == "aside":
                current = _after_move(current, set(entry["ids"]))
        gone = [row for row in current.values() if row[1] > size]
        revoke = LineGroup("revoke", ds)
        revoke.columns = {name: [row[i] for row in gone] for i, name in enumerate(COLUMNS)}
        state = self.states[ds]
        state.done.difference_update(revoke.columns["ids"])
        state.locations.difference_update(revoke.columns["loc"])
        self._count(state, revoke.columns, -1)
        committed = max((row[1] for row in current.values() if row[1] <= size), default=0)
        self.repairs.append(
            f"{JobLayout(self.directory).output(ds)} is shorter than the journal says: "
            f"{len(gone)} completed prompts were lost from it and will run again"
        )
        return committed, [
            {"op": "revoke", "ds": ds, **revoke.columns},
            {"op": "truncate", "ds": ds, "size": committed},
        ]


def _columns(entry: dict[str, Any]) -> list[list[Any]]:
    """A ``done`` line's :data:`COLUMNS` (``cut`` as zeros where an earlier release
    wrote none)."""
    columns = [entry[c] for c in COLUMNS[:-1]]
    columns.append(entry.get("cut") or [0] * len(entry["ids"]))
    return columns


def apply_aside(state: DatasetState, entry: dict[str, Any]) -> None:
    """What an ``aside`` entry does to a dataset: its moved rows are no longer done, their
    tally is taken off (and counted as set aside), and input locations are forgotten (the
    next run reads the inputs whole and records each done prompt's again)."""
    ids = entry["ids"]
    state.done.difference_update(ids)
    state.locations.clear()
    if state.done:
        state.locations.add(NO_LOCATION)
    tally = state.tally
    tally.completed -= len(ids)
    tally.output_tokens -= sum(entry["out"])
    tally.prompt_tokens -= sum(entry["in"])
    moved_units = sum(entry["cost"])
    tally.cost_units -= moved_units
    tally.truncated -= sum(entry["cut"])
    tally.truncated_units -= sum(
        units for units, cut in zip(entry["cost"], entry["cut"], strict=True) if cut
    )
    tally.set_aside += len(ids)
    tally.set_aside_units += moved_units


def _after_move(current: dict[str, tuple[Any, ...]], moved: set[str]) -> dict[str, tuple[Any, ...]]:
    """The committed rows once ``moved`` left the output: the others keep their order, each
    end offset less the moved rows before it (the output is its rows end to end)."""
    rows: dict[str, tuple[Any, ...]] = {}
    start = shift = 0
    for row in sorted(current.values(), key=lambda r: r[1]):
        length = row[1] - start
        start = row[1]
        if row[0] in moved:
            shift += length
        else:
            rows[row[0]] = (row[0], row[1] - shift, *row[2:])
    return rows
