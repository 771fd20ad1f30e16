"""Another process holding an SQLite ledger's lock: waited out, then named, never "damaged".

While another process holds the write lock (a ``sqlite3`` shell's ``BEGIN
EXCLUSIVE``, a ``ledger topup``, a backup tool), SQLite answers ``database is
locked``. That is a wait, not damage, and advising to start the job over would pay for
every prompt again. :func:`is_locked` tells the lock from other errors;
:class:`LedgerLocked` marks a batch that found it taken past the busy timeout, so the
:class:`~provider_router.ledger._outage.OutageWindow` waits it out (safe: such a batch
applied nothing); :func:`locked_error` says who holds it where the system tells (the
pid and program name, never its command line, which may hold secrets) and what to do.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Final

from provider_router._exceptions import LedgerUnavailableError

__all__ = ["LedgerLocked", "is_locked", "lock_holders", "locked_error"]

_MAX_HOLDERS: Final = 5


class LedgerLocked(Exception):
    """A batch found the ledger locked by another process for its whole busy timeout."""


def is_locked(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's "database is locked" (busy), not a damaged file."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "database is locked" in str(exc)


def lock_holders(path: Path) -> list[str]:
    """Other processes that have ``path`` open (``pid N (program)``), where /proc tells."""
    try:
        target = str(path.resolve())
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []
    own = str(os.getpid())
    holders: list[str] = []
    for pid in pids:
        if pid == own:
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # gone, or not ours to look at
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") != target:
                    continue
                with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as fh:
                    program = fh.read().strip()
            except OSError:
                continue
            holders.append(f"pid {pid} ({program})")
            break
        if len(holders) == _MAX_HOLDERS:
            break
    return holders


def locked_error(path: Path, waited: float | None = None) -> LedgerUnavailableError:
    """The error for a ledger locked by another process: who holds it, and what to do."""
    holders = lock_holders(path)
    who = f" ({', '.join(holders)} has it open)" if holders else ""
    spell = "" if waited is None or waited < 1 else f" for {waited:.0f} s"
    return LedgerUnavailableError(
        f"{path} is locked by another process{who}{spell}; the ledger is not damaged "
        "and nothing is lost. Wait for that process to finish (or stop it), then run "
        "the same command again"
    )
