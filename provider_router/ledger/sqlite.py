"""The embedded default ledger: one SQLite file, safe for several processes on one machine.

Every batch of operations is one ``BEGIN IMMEDIATE`` transaction (the write lock is
taken before the totals are read, so two processes can never both admit the last
dollar), committed in WAL mode with ``synchronous=FULL``: a reservation is on disk
before :meth:`SQLiteLedger.reserve` returns. By default (``executor="thread"``) a
batch's statements run on the event loop and its ``COMMIT`` in one writer thread, so
the fsync never stalls the loop, and the loop never waits for another process's lock
(such a batch runs whole in the thread); ``executor="loop"`` runs everything on the
loop, blocking. A lock held past the busy timeout is waited out as an unreachable Redis
is (:mod:`~provider_router.ledger._sqlite_lock`), and the error then names who holds
it: never that the ledger is damaged.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any, Final, Literal

from provider_router._exceptions import ConfigurationError, DataFileError, LedgerUnavailableError
from provider_router._format import decimal_str
from provider_router._types import Clock, Sleep
from provider_router.ledger import _group_commit as b
from provider_router.ledger._base import Reservation, limit_units, owner_is_dead
from provider_router.ledger._durable import DurableLedger
from provider_router.ledger._outage import DEFAULT_OUTAGE_WINDOW, OutageWindow
from provider_router.ledger._sqlite_lock import LedgerLocked, is_locked, locked_error
from provider_router.ledger._totals import FIELDS, Totals
from provider_router.ledger._writer import WriterThread

__all__ = ["SQLiteLedger"]

SCHEMA_VERSION: Final = 1
DEFAULT_LEASE: Final = 60.0
DEFAULT_POLL_INTERVAL: Final = 0.05
_BUSY_TIMEOUT_MS: Final = 30_000

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS totals (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    {", ".join(f"{name} INTEGER NOT NULL" for name in FIELDS)}
);
CREATE TABLE IF NOT EXISTS reservations (
    id TEXT PRIMARY KEY,
    key TEXT NOT NULL,
    units INTEGER NOT NULL,
    -- open | settled | released | recovered (worst case charged) | reconciled
    state TEXT NOT NULL,
    owner TEXT NOT NULL,
    lease_until REAL NOT NULL,
    created REAL NOT NULL,
    generation_id TEXT,
    cost INTEGER,
    estimate INTEGER,
    provider TEXT,
    closed REAL
) WITHOUT ROWID;
PRAGMA user_version = {SCHEMA_VERSION}
"""
_SCHEMA_STATEMENTS: Final = tuple(part for part in _SCHEMA.split(";") if part.strip())
# Older ledgers had a partial index of the open rows. Each request paid for it
# twice (an entry inserted by the reserve, deleted by the settle) and each commit
# wrote more WAL pages for it; it only served recovery and listing, which scan the
# table once per run, and the lease renewal, which updates its own rows by id.
# Dropping it changes no result: every version reads the file with or without it.
_DROP_OPEN_INDEX = "DROP INDEX IF EXISTS reservations_open"
# The ledger's identity: a random id fixed at creation, which a batch journal
# records so that a lost or swapped ledger file is noticed (docs/ledger.md).
_CREATE_META = (
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID"
)
_SELECT_IDENTITY = "SELECT value FROM meta WHERE name = 'identity'"
_INSERT_IDENTITY = "INSERT INTO meta (name, value) VALUES ('identity', ?)"

# Column names come from our own FIELDS constant, never from input.
_SELECT_TOTALS = f"SELECT {', '.join(FIELDS)} FROM totals WHERE id = 1"  # noqa: S608
_INSERT_TOTALS = f"INSERT INTO totals (id, {', '.join(FIELDS)}) VALUES (1{', ?' * len(FIELDS)})"  # noqa: S608
_UPDATE_TOTALS = f"UPDATE totals SET {', '.join(f'{n} = ?' for n in FIELDS)} WHERE id = 1"  # noqa: S608
_INSERT = (
    "INSERT INTO reservations (id, key, units, state, owner, lease_until, created)"
    " VALUES (?, ?, ?, 'open', ?, ?, ?)"
)
_STATE = "SELECT state, units, generation_id FROM reservations WHERE id = ?"
_CLOSE = (
    "UPDATE reservations SET state = ?, cost = ?, estimate = ?, provider = ?,"
    " generation_id = coalesce(?, generation_id), closed = ? WHERE id = ?"
)
# Settle or release an open reservation in one statement (the common case): the row
# must be open and hold what the caller's Reservation says it holds, so the changed
# row count alone tells that the caller's units are the row's (cheaper than
# ``RETURNING units``). Anything else (already closed, recovered by another process,
# unknown, a Reservation whose units differ from the row) takes the slow path.
_CLOSE_HELD = (
    "UPDATE reservations SET state = ?, cost = ?, estimate = ?, provider = ?,"
    " generation_id = coalesce(?, generation_id), closed = ?"
    " WHERE id = ? AND state = 'open' AND units = ?"
)
_OPEN_ROWS = "SELECT id, units, key, generation_id, owner, lease_until FROM reservations"


class _Store:
    """Applies batches of ops to the database; runs in one thread at a time."""

    def __init__(
        self, con: sqlite3.Connection, owner: str, lease: float, clock: Clock, busy_ms: int
    ) -> None:
        self.con = con
        self.busy_ms = busy_ms
        # One cursor for every statement: ``con.execute`` builds a cursor per call
        # and registers a weak reference to it with the connection (two objects the
        # cyclic GC tracks) only to drop both once the statement is done.
        # Every result is read (fetchone steps to the end) before the next statement.
        self.cur = con.cursor()
        self.owner = owner
        self.lease = lease
        self.clock = clock
        self._rows: list[tuple[str, str, int, str, float, float]] = []
        """Reservations admitted by the batch being staged, not yet inserted."""
        self._handlers: dict[int, Callable[[b.Op, Totals, float], None]] = {
            b.ATTACH: self._attach,
            b.SETTLE: self._settle,
            b.RELEASE: self._release,
            b.SET_LIMIT: self._set_limit,
            b.SNAPSHOT: self._snapshot,
            b.LIST_OPEN: self._list_open,
            b.CLAIM: self._claim,
            b.RECONCILE: self._reconcile,
            b.CHARGE_WORST: self._charge_worst,
            b.RENEW: self._renew,
        }

    def apply(self, batch: list[b.Op]) -> tuple[int, int, int]:
        """Write ``batch`` in one transaction and commit it; the totals after it."""
        self.begin()
        totals = self.stage(batch)
        self.commit()
        return totals

    def apply_waiting(self, batch: list[b.Op]) -> tuple[int, int, int]:
        """:meth:`apply`, waiting up to the busy timeout for another process's lock.

        Raises:
            LedgerLocked: the lock stayed taken (nothing was applied: retry it).
        """
        self.cur.execute(f"PRAGMA busy_timeout = {self.busy_ms}")
        try:
            return self.apply_unless_locked(batch)
        finally:
            self.cur.execute("PRAGMA busy_timeout = 0")

    def apply_unless_locked(self, batch: list[b.Op]) -> tuple[int, int, int]:
        """:meth:`apply`; a lock still taken after the connection's busy timeout is
        :class:`LedgerLocked` (nothing was applied: retry it)."""
        try:
            return self.apply(batch)
        except sqlite3.OperationalError as exc:
            if is_locked(exc):
                raise LedgerLocked(str(exc)) from exc
            raise

    def begin(self) -> None:
        """Take the write lock (``BEGIN IMMEDIATE``) before the totals are read."""
        self.cur.execute("BEGIN IMMEDIATE")

    def stage(self, batch: list[b.Op]) -> tuple[int, int, int]:
        """Apply ``batch`` inside the transaction :meth:`begin` opened, and leave it open.

        The caller commits it (:meth:`commit`) before anyone hears an outcome: an
        outcome set here is only true once the transaction is durable.
        """
        cur = self.cur
        now = self.clock()
        handlers = self._handlers
        try:
            t = Totals(*cur.execute(_SELECT_TOTALS).fetchone())
            before = t.row()
            rows = self._rows
            for op in batch:
                if op.kind == b.RESERVE:
                    self._reserve(op, t, now)
                else:
                    if rows:  # keep statement order: a later op may read these rows
                        self._insert_rows()
                    handlers[op.kind](op, t, now)
            if rows:
                self._insert_rows()
            if t.row() != before:
                cur.execute(_UPDATE_TOTALS, t.row())
        except BaseException:
            self.rollback()
            raise
        return t.limit_units, t.spent, t.reserved

    def commit(self) -> None:
        """Commit what :meth:`stage` wrote (the WAL write and its fsync)."""
        try:
            self.cur.execute("COMMIT")
        except BaseException:
            self.rollback()
            raise

    def rollback(self) -> None:
        self._rows.clear()
        if self.con.in_transaction:  # SQLite already rolled back on a full disk (SQLITE_FULL)
            self.cur.execute("ROLLBACK")

    def _insert_rows(self) -> None:
        """Insert the admitted reservations with one ``executemany`` (cheaper than one each)."""
        self.cur.executemany(_INSERT, self._rows)
        self._rows.clear()

    def _reserve(self, op: b.Op, t: Totals, now: float) -> None:
        if t.fits(op.units):
            self._rows.append((op.id, op.key, op.units, self.owner, now + self.lease, now))
            t.admit(op.units)
            op.outcome = b.OK
        else:
            op.outcome = b.REFUSED if t.can_ever_fit(op.units) else b.NEVER

    def _attach(self, op: b.Op, t: Totals, now: float) -> None:
        cur = self.cur.execute(
            "UPDATE reservations SET generation_id = ? WHERE id = ? AND state = 'open'",
            (op.generation_id, op.id),
        )
        op.outcome = b.OK if cur.rowcount else b.NOT_OPEN

    def _lookup(self, op: b.Op) -> tuple[str, int] | None:
        row = self.cur.execute(_STATE, (op.id,)).fetchone()
        return None if row is None else (row[0], row[1])

    def _close(self, op: b.Op, state: str, now: float, cost: int | None) -> None:
        self.cur.execute(
            _CLOSE, (state, cost, op.estimate, op.provider, op.generation_id, now, op.id)
        )

    def _close_held(self, op: b.Op, state: str, now: float, cost: int) -> bool:
        """Close ``op``'s reservation if it is open and holds ``op.units``; whether it did."""
        cur = self.cur.execute(
            _CLOSE_HELD,
            (state, cost, op.estimate, op.provider, op.generation_id, now, op.id, op.units),
        )
        return cur.rowcount == 1

    def _settle(self, op: b.Op, t: Totals, now: float) -> None:
        if self._close_held(op, "settled", now, op.cost):
            t.settle(op.units, op.cost, op.estimate)
            return
        found = self._lookup(op)
        if found is None:
            op.outcome = b.NOT_OPEN
            return
        state, held = found
        if state == "open":
            t.settle(held, op.cost, op.estimate)
        elif state == "recovered":
            # Counted at worst case by a recoverer while we were slow: correct it.
            t.spent -= held
            t.charge(held, op.cost, op.estimate)
            op.outcome = b.LATE
        else:
            op.outcome = b.LATE if state == "reconciled" else b.NOT_OPEN
            return
        self._close(op, "settled", now, op.cost)

    def _release(self, op: b.Op, t: Totals, now: float) -> None:
        if self._close_held(op, "released", now, 0):
            t.release(op.units)
            return
        found = self._lookup(op)
        if found is None:
            op.outcome = b.NOT_OPEN
            return
        state, held = found
        if state == "open":
            t.release(held)
        elif state == "recovered":
            t.spent -= held
            t.n_released += 1
            op.outcome = b.LATE
        else:
            op.outcome = b.LATE if state == "reconciled" else b.NOT_OPEN
            return
        self._close(op, "released", now, 0)

    def _reconcile(self, op: b.Op, t: Totals, now: float) -> None:
        found = self._lookup(op)
        if found is None or found[0] != "open":
            op.outcome = b.NOT_OPEN
            return
        t.settle(found[1], op.cost, None)
        t.n_recovered += 1
        self._close(op, "reconciled", now, op.cost)

    def _charge_worst(self, op: b.Op, t: Totals, now: float) -> None:
        found = self._lookup(op)
        if found is None or found[0] != "open":
            op.outcome = b.NOT_OPEN
            return
        t.charge_worst_case(found[1])
        self._close(op, "recovered", now, found[1])

    def _set_limit(self, op: b.Op, t: Totals, now: float) -> None:
        t.limit_units = op.units

    def _snapshot(self, op: b.Op, t: Totals, now: float) -> None:
        op.value = t.state()

    def _list_open(self, op: b.Op, t: Totals, now: float) -> None:
        rows = self.cur.execute(_OPEN_ROWS + " WHERE state = 'open' ORDER BY created, id")
        op.value = [Reservation(r[0], r[1], r[2], r[3], r[4]) for r in rows]

    def _claim(self, op: b.Op, t: Totals, now: float) -> None:
        rows = self.cur.execute(_OPEN_ROWS + " WHERE state = 'open' AND owner != ?", (self.owner,))
        orphans = [
            Reservation(r[0], r[1], r[2], r[3], self.owner)
            for r in rows.fetchall()
            if r[5] < op.value or owner_is_dead(r[4])
        ]
        self.cur.executemany(
            "UPDATE reservations SET owner = ?, lease_until = ? WHERE id = ?",
            [(self.owner, now + self.lease, res.id) for res in orphans],
        )
        op.value = orphans

    def _renew(self, op: b.Op, t: Totals, now: float) -> None:
        """Extend the lease of the open rows this owner holds (``op.value[1]``: their ids)."""
        until, ids = op.value
        self.cur.executemany(
            "UPDATE reservations SET lease_until = ? WHERE id = ? AND owner = ? AND state = 'open'",
            [(until, res_id, self.owner) for res_id in ids],
        )


def _connect(path: Path, synchronous: str, busy_ms: int) -> sqlite3.Connection:
    con = sqlite3.connect(
        path, isolation_level=None, check_same_thread=False, timeout=busy_ms / 1000
    )
    try:
        con.execute(f"PRAGMA busy_timeout = {busy_ms}")
        con.execute("PRAGMA journal_mode = WAL")
        con.execute(f"PRAGMA synchronous = {synchronous}")
    except sqlite3.DatabaseError as exc:
        con.close()
        if is_locked(exc):
            raise locked_error(path, busy_ms / 1000) from exc
        raise DataFileError(path, f"not a ledger database: {exc}") from exc
    return con


def _open_totals(
    con: sqlite3.Connection, path: Path, limit: Decimal | None, *, keep_limit: bool
) -> tuple[str, bool]:
    """Create the ledger, or check an existing one; its identity, and whether it is new.

    Creation (schema, totals row with the limit, identity) is one transaction, so
    a crash or a refused limit leaves either no ledger or a whole one. A changed
    limit is refused (unless ``keep_limit``): it is changed with ``set_limit``,
    never by reopening.
    """
    units = None if limit is None else limit_units(limit)
    con.execute("BEGIN IMMEDIATE")
    try:
        version = con.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, SCHEMA_VERSION):
            raise DataFileError(path, f"ledger schema version {version} is not {SCHEMA_VERSION}")
        # A version-1 file without a totals row was left by an older release that
        # created the schema and the row in separate transactions: it is still new.
        row = con.execute(_SELECT_TOTALS).fetchone() if version else None
        if row is None:
            if units is None:
                raise ConfigurationError(f"{path} is a new ledger: give it a limit")
            for statement in _SCHEMA_STATEMENTS:
                con.execute(statement)
            con.execute(_INSERT_TOTALS, Totals(units).row())
        elif units is not None and units != row[0] and not keep_limit:
            stored, wanted = Totals(*row).state().limit, Totals(units).state().limit
            raise ConfigurationError(
                f"{path} has a limit of ${decimal_str(stored)}, not ${decimal_str(wanted)}: "
                "change it with set_limit() or `provider-router ledger topup`, never by "
                "reopening (keep_limit=True opens it with its own limit)"
            )
        con.execute(_CREATE_META)  # ledgers from before identities get one now
        con.execute(_DROP_OPEN_INDEX)
        found = con.execute(_SELECT_IDENTITY).fetchone()
        identity: str = found[0] if found else uuid.uuid4().hex
        if not found:
            con.execute(_INSERT_IDENTITY, (identity,))
        con.execute("COMMIT")
    except BaseException:
        if con.in_transaction:
            con.execute("ROLLBACK")
        raise
    return identity, row is None


class SQLiteLedger(DurableLedger):
    """A :class:`~provider_router.Ledger` in one SQLite file.

    Args:
        path: the database file (created with its parent directory if missing).
        limit: the budget in USD; required for a new file. Reopening an existing
            ledger with a different limit is refused (use :meth:`set_limit`).
        lease: seconds an open reservation stays owned without renewal.
        poll_interval: seconds between retries of waiting reservations.
        commit_interval: seconds between the starts of two batches under load
            (default 10 ms: group commit sized by time, stretched up to 2.5×
            when reservations are held for seconds; ``0`` commits at once).
        synchronous: SQLite's ``synchronous`` pragma; ``FULL`` (the default)
            survives power loss, ``NORMAL`` only a process crash.
        executor: ``"thread"`` (default) or ``"loop"``; see the module docstring.
        keep_limit: an existing ledger keeps its own limit (``limit`` only
            creates a new one) instead of refusing a different one.
        busy_timeout: seconds one attempt waits for another process's lock.
        lock_window: seconds a lock held past that is waited out (retrying), as an
            unreachable Redis is, before a call fails with
            :class:`~provider_router.LedgerUnavailableError`.
        clock: wall-clock seconds for leases; injected in tests.
        sleep, monotonic: for waiting out a lock; injected in tests.

    Attributes:
        identity: a random id fixed when the ledger was created (a batch journal
            records it, so a lost or swapped ledger file is refused).
        created: whether opening it created it.

    Raises:
        ConfigurationError: a new file without a limit, a changed limit, or a limit
            above $4,000,000.
        DataFileError: the file is not a ledger database.
        LedgerUnavailableError: another process holds the file's lock (it says
            which, where the system tells): the ledger is intact.
    """

    def __init__(
        self,
        path: str | Path,
        limit: Decimal | None = None,
        *,
        lease: float = DEFAULT_LEASE,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        commit_interval: float = b.DEFAULT_COMMIT_INTERVAL,
        synchronous: Literal["FULL", "NORMAL", "OFF"] = "FULL",
        executor: Literal["thread", "loop"] = "thread",
        keep_limit: bool = False,
        busy_timeout: float = _BUSY_TIMEOUT_MS / 1000,
        lock_window: float = DEFAULT_OUTAGE_WINDOW,
        clock: Clock = time.time,
        sleep: Sleep = asyncio.sleep,
        monotonic: Clock = time.monotonic,
    ) -> None:
        super().__init__(
            lease=lease, poll_interval=poll_interval, clock=clock, commit_interval=commit_interval
        )
        if synchronous not in ("FULL", "NORMAL", "OFF"):
            raise ConfigurationError(f"synchronous must be FULL, NORMAL or OFF: {synchronous!r}")
        if executor not in ("thread", "loop"):
            raise ConfigurationError(f"executor must be 'thread' or 'loop', got {executor!r}")
        if not (busy_timeout >= 0 and lock_window > 0):
            raise ConfigurationError(
                f"busy_timeout must be ≥ 0 and lock_window > 0 seconds, got "
                f"{busy_timeout!r} and {lock_window!r}"
            )
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        busy_ms = round(busy_timeout * 1000)
        con = _connect(self.path, synchronous, busy_ms)
        try:
            self.identity, self.created = _open_totals(con, self.path, limit, keep_limit=keep_limit)
        except sqlite3.DatabaseError as exc:
            con.close()
            if is_locked(exc):
                raise locked_error(self.path, busy_timeout) from exc
            raise DataFileError(self.path, f"not a ledger database: {exc}") from exc
        except BaseException:
            con.close()
            raise
        self._monotonic = monotonic
        self._lock_wait = OutageWindow(
            f"SQLite file {self.path} (locked by another process)",
            lock_window,
            (LedgerLocked,),
            sleep=sleep,
            clock=monotonic,
        )
        self._store = _Store(con, self.owner, self.lease, clock, busy_ms)
        self._writer: WriterThread | None = None
        if executor == "thread":
            # Statements run on the loop (no lock waits there: see _execute), the
            # commit with its fsync in the thread.
            con.execute("PRAGMA busy_timeout = 0")
            self._writer = WriterThread("ledger-sqlite")

    def __repr__(self) -> str:
        return f"SQLiteLedger({str(self.path)!r})"

    async def _execute(self, batch: list[b.Op]) -> tuple[int, int, int]:
        try:
            return await self._lock_wait.call(lambda: self._execute_once(batch))
        except LedgerUnavailableError as exc:
            since = self._lock_wait.since
            waited = None if since is None else self._monotonic() - since
            raise locked_error(self.path, waited) from exc

    async def _execute_once(self, batch: list[b.Op]) -> tuple[int, int, int]:
        store, writer = self._store, self._writer
        if writer is None:  # the connection keeps its busy timeout: apply waits
            return store.apply_unless_locked(batch)
        if writer.busy:
            # The batch task was cancelled while the thread still had the connection
            # (a commit, a whole batch): it stays the thread's until that job ends.
            await writer.idle()
        if any(op.kind >= b.LIST_OPEN for op in batch):
            # Scans (listing, claiming, renewing every open row) stay off the loop.
            return await writer.run(store.apply_waiting, batch)
        try:
            store.begin()  # busy_timeout 0: never waits on the loop
        except sqlite3.OperationalError as exc:
            # The primary code: SQLITE_BUSY_RECOVERY, _SNAPSHOT, ... are busy too.
            if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY:
                raise
            # Another process holds the write lock: wait for it in the thread.
            return await writer.run(store.apply_waiting, batch)
        totals = store.stage(batch)
        await writer.run(store.commit)
        return totals

    async def _close_store(self) -> None:
        writer = self._writer
        if writer is None:
            self._store.con.close()
            return
        await writer.idle()
        try:
            await writer.run(self._store.con.close)
        finally:
            writer.stop()

    def audit(self) -> dict[str, Any]:
        """Recompute the totals from the rows (synchronous; for tests and the CLI)."""
        con = sqlite3.connect(self.path)
        try:
            q = con.execute(
                "SELECT coalesce(sum(CASE WHEN state IN ('settled', 'reconciled', 'recovered')"
                " THEN cost END), 0), coalesce(sum(CASE WHEN state = 'open' THEN units END), 0),"
                " sum(state = 'open') FROM reservations"
            ).fetchone()
        finally:
            con.close()
        return {"spent_units": q[0], "reserved_units": q[1], "open": q[2] or 0}
