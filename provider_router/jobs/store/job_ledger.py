"""A job's ledger belongs to its journal: a lost or swapped ledger never resets the budget.

The journal records the identity of the ledger holding the job's money (a random id
fixed when the ledger was created). When a job directory is opened again, a ledger
that is missing, empty or damaged while the journal shows earlier runs sent requests,
one whose identity is not the recorded one (another job's file, a flushed and
recreated Redis ledger), and a file holding no ledger (its ``-wal`` removed after a
kill) are refused: a new ledger would restart the budget at $0 although the money was
spent. Each refusal is a :class:`~provider_router.DataFileError` that names the file
and says what to do: restore the job's own ledger, or start over in a new directory.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

from provider_router._exceptions import ConfigurationError, DataFileError
from provider_router._format import format_usd
from provider_router.jobs.store.journal import FileJournal
from provider_router.ledger import Ledger, LedgerState
from provider_router.ledger.sqlite import SQLiteLedger

__all__ = ["check_not_behind", "open_job_ledger"]

_ADVICE = (
    "starting a new ledger would reset the budget to $0 although the journal "
    "shows money was spent. Restore the job's own ledger (for SQLite, "
    "ledger.sqlite with its -wal file), or start the job over in a new --out directory"
)


async def open_job_ledger(
    path: Path, budget: Decimal, journal: FileJournal | None, given: Ledger | None
) -> Ledger:
    """The ledger of the job whose journal is ``journal``: ``given``, else the file ``path``.

    A new SQLite ledger is created with ``budget`` as its limit; an existing one
    keeps its own (the runner changes it, and notes the change in the journal).

    Raises:
        DataFileError: the ledger is missing, damaged or foreign while the
            journal shows that money was spent (see the module docstring).
    """
    if given is None:
        spent_before = journal is not None and journal.spent_before
        if spent_before and not _has_content(path):
            raise _refuse(path, "is missing or empty", journal)
        try:
            # NORMAL survives a killed process, as the journal does (it is flushed, not
            # fsynced, per batch); FULL would put an fsync in front of every send.
            # After spending, the ledger must exist: it is opened, never created.
            ledger: Ledger = SQLiteLedger(
                path, None if spent_before else budget, keep_limit=True, synchronous="NORMAL"
            )
        except DataFileError as exc:
            if not spent_before:
                raise
            raise _refuse(path, f"is damaged ({exc.detail})", journal) from exc
        except ConfigurationError as exc:
            if not spent_before:
                raise
            raise _refuse(path, "holds no ledger (was its -wal file removed?)", journal) from exc
    else:
        ledger = given
    if journal is None:
        return ledger
    try:
        state = await ledger.snapshot()  # a Redis ledger learns its identity on first use
        _check_identity(ledger, journal)
        check_not_behind(ledger, journal, state)
    except BaseException:
        if given is None:
            await ledger.close()
        raise
    return ledger


def _check_identity(ledger: Ledger, journal: FileJournal) -> None:
    identity: str | None = getattr(ledger, "identity", None)
    if identity is None:  # a MemoryLedger: nothing outlives the process anyway
        return
    where = getattr(ledger, "path", None) or repr(ledger)
    if journal.ledger is None:
        if journal.spent_before and getattr(ledger, "created", False):
            raise _refuse(where, "was just created", journal)
        journal.record_ledger(identity)
    elif journal.ledger != identity:
        raise _refuse(
            where,
            f"is not this job's ledger (it is {identity}, the journal has {journal.ledger})",
            journal,
        )


def check_not_behind(ledger: Ledger, journal: FileJournal, state: LedgerState) -> None:
    """Refuse a ledger that holds less than the journal's paid outputs cost.

    Every completion the journal committed was settled in the ledger (or, its settle
    failed, is still held there at its worst case), and so was every preflight and
    verification check it noted, so ``spent + reserved`` is never below their costs:
    a ledger that is (an older copy, a WAL lost after a kill)
    forgot payments, and would let them be spent again. Checked when the ledger is
    opened, and again once the crashed reservations are settled (open worst cases
    may hide a deficit until then).

    Raises:
        DataFileError: the ledger holds less than the outputs cost.
    """
    held = state.spent + state.reserved
    paid = journal.committed_cost
    if held >= paid or getattr(ledger, "identity", None) is None:
        return  # a MemoryLedger starts at $0 by design: nothing outlives its process
    where = getattr(ledger, "path", None) or repr(ledger)
    raise _refuse(
        where,
        f"holds {format_usd(held)} spent and reserved, less than the {format_usd(paid)} "
        "the job's outputs cost, with its preflights and verification checks (an older "
        "copy of it, or its -wal file removed?)",
        journal,
    )


def _refuse(where: object, what: str, journal: FileJournal | None) -> DataFileError:
    source = f"{journal.path if journal is not None else 'the journal'} records earlier runs"
    if journal is not None and journal.adopted:
        paid = sum(journal.adopted.values())
        source = f"the job's outputs hold {paid} paid record(s) the journal lost"
    return DataFileError(str(where), f"{what}, but {source}: {_ADVICE}")


def _has_content(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except FileNotFoundError:
        return False
