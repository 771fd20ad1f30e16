"""Budget ledgers: reserve before a request, settle or release after it.

Backends: :class:`MemoryLedger` (one process), :class:`SQLiteLedger` (the
embedded default: several processes on one machine, crash-safe) and
:class:`RedisLedger` (any number of processes and hosts; needs the ``redis`` extra).
"""

from __future__ import annotations

from provider_router.ledger._base import (
    CostResolver,
    Ledger,
    LedgerState,
    RecoveryReport,
    Reservation,
)
from provider_router.ledger.memory import MemoryLedger
from provider_router.ledger.redis import RedisLedger
from provider_router.ledger.sqlite import SQLiteLedger

__all__ = [
    "CostResolver",
    "Ledger",
    "LedgerState",
    "MemoryLedger",
    "RecoveryReport",
    "RedisLedger",
    "Reservation",
    "SQLiteLedger",
]
