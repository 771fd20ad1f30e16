"""What a failed ledger write means for money, said with its cause.

A batch the store could not apply fails every call in it; each caller handles its own
error (a reservation refused is a request not sent; a settle that failed keeps its
answer and its reservation open). What the operator needs besides is one sentence per
failure saying what was not recorded and what that means for the money, and, at the
end of a run, whether its money is certain. :func:`describe` builds that sentence;
:class:`WriteFailures` keeps the tally a run reads. Reads (snapshot, listing) change
nothing: their failure is the caller's error alone, never a "write failed".
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Final

from provider_router.ledger import _group_commit as k

__all__ = ["WriteFailures", "describe", "money_meaning"]

_MEANINGS: Final = {
    k.SETTLE: "a paid answer's charge was not recorded (its reservation stays open at "
    "its worst case until a run reconciles it by generation id)",
    k.RECONCILE: "a crashed request's real cost was not recorded (it stays open at its "
    "worst case until a run reconciles it)",
    k.CHARGE_WORST: "a crashed request was not counted at its worst case (it stays open, "
    "held at that worst case)",
    k.ATTACH: "a generation id was not recorded (after a crash that request is counted "
    "at its worst case)",
    k.RELEASE: "money held for a request that cost nothing is still held (a run recovers "
    "it once its lease runs out)",
    k.SET_LIMIT: "the budget was not changed",
    k.RESERVE: "a request was not admitted (nothing was sent for it)",
    k.RENEW: "a lease was not renewed (another process may recover those reservations)",
    k.CLAIM: "crashed reservations were not claimed (nothing changed)",
}
_UNCERTAIN: Final = frozenset({k.SETTLE, k.RECONCILE, k.CHARGE_WORST, k.ATTACH, k.RELEASE})
"""Kinds whose failure leaves the recorded money differing from what happened."""


def money_meaning(kinds: set[int]) -> str | None:
    """What failing ops of ``kinds`` means for money; None when only reads failed."""
    meanings = [_MEANINGS[kind] for kind in sorted(kinds) if kind in _MEANINGS]
    return "; ".join(meanings) if meanings else None


def describe(exc: BaseException) -> str:
    """``RuntimeError: the store broke``: the cause in one line."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass
class WriteFailures:
    """The ledger writes that failed in this process, for a run's ending.

    Attributes:
        count: failed batches that wrote money (settles, releases, attaches...).
        kinds: how many ops of each meaning failed.
        first: the first such failure's cause and meaning, said whole.
    """

    count: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    first: str | None = None

    def add(self, kinds: set[int], exc: BaseException) -> str | None:
        """Count a failed batch; its sentence, or None when it only read."""
        meaning = money_meaning(kinds)
        if meaning is None:
            return None
        sentence = f"{describe(exc)}: {meaning}"
        if kinds & _UNCERTAIN:
            self.count += 1
            for kind in kinds & _UNCERTAIN:
                self.kinds[_MEANINGS[kind].split(" (")[0]] += 1
            if self.first is None:
                self.first = sentence
        return sentence

    @property
    def uncertain(self) -> bool:
        """Whether the ledger's money may differ from what really happened."""
        return self.count > 0
