"""Per-request random streams that cost a hash, not a Mersenne Twister seeding.

Every chat request gets its own stream (same seed + same request => same draws,
whatever order concurrent requests arrive in). Seeding a :class:`random.Random` per
request initialises its whole state, a large share of the simulator's own CPU
(docs/performance.md). :class:`Draws` is a :class:`random.Random` whose bits come from
BLAKE2b of the request's key (the next block hashed with a counter when they run out),
so every method built on ``random()`` and ``getrandbits()`` works unchanged. The draws
are uniform to 53 bits, enough for a simulator; nothing here is secret.
"""

from __future__ import annotations

import math
import random
import string
from hashlib import blake2b
from typing import Any

__all__ = ["Draws"]

_BLOCK = 64
_RECIP_BPF = 2.0**-53
_MASK56 = (1 << 56) - 1
_TWOPI = 2.0 * math.pi
_ALNUM = (string.ascii_letters + string.digits).encode()
# byte -> one of the 62 letters and digits (bytes.translate: one C call per id).
_ALNUM_TABLE = bytes(_ALNUM[b % len(_ALNUM)] for b in range(256))


class Draws(random.Random):
    """A reproducible random stream keyed by bytes (see the module docstring)."""

    def __init__(self, key: bytes) -> None:
        # Not Random.__init__: seeding the Mersenne Twister is the cost avoided here.
        self._key = key
        self._block = 0
        self._buf = blake2b(key, digest_size=_BLOCK).digest()
        self._pos = 0
        self.gauss_next: float | None = None

    def seed(self, a: Any = None, version: int = 2) -> None:
        """Restart the stream from a new key (``str(a)``)."""
        self.__init__(str(a).encode())  # type: ignore[misc]

    def _take(self, n: int) -> bytes:
        pos = self._pos
        end = pos + n
        buf = self._buf
        while end > len(buf):
            self._block += 1
            more = blake2b(self._key + self._block.to_bytes(8, "little"), digest_size=_BLOCK)
            buf = buf[pos:] + more.digest()
            end -= pos
            pos = 0
        self._buf = buf
        self._pos = end
        return buf[pos:end]

    def random(self) -> float:
        """A float in [0, 1) from 53 bits of the stream."""
        pos = self._pos
        if pos <= _BLOCK - 7:
            self._pos = pos + 7
            return (int.from_bytes(self._buf[pos : pos + 7], "little") >> 3) * _RECIP_BPF
        return (int.from_bytes(self._take(7), "little") >> 3) * _RECIP_BPF

    def gauss(self, mu: float = 0.0, sigma: float = 1.0) -> float:
        """:meth:`random.Random.gauss` (Box–Muller, the second value kept for the next
        call) with both uniforms taken in one step."""
        z = self.gauss_next
        self.gauss_next = None
        if z is None:
            pos = self._pos
            if pos <= _BLOCK - 14:
                self._pos = pos + 14
                pair = int.from_bytes(self._buf[pos : pos + 14], "little")
            else:
                pair = int.from_bytes(self._take(14), "little")
            x2pi = ((pair & _MASK56) >> 3) * _RECIP_BPF * _TWOPI
            g2rad = math.sqrt(-2.0 * math.log(1.0 - (pair >> 59) * _RECIP_BPF))
            z = math.cos(x2pi) * g2rad
            self.gauss_next = math.sin(x2pi) * g2rad
        return mu + z * sigma

    def getrandbits(self, k: int) -> int:
        if k < 0:
            raise ValueError("number of bits must be non-negative")
        if k == 0:
            return 0
        return int.from_bytes(self._take((k + 7) // 8), "little") >> (-k % 8)

    def alnum(self, k: int) -> str:
        """``k`` letters and digits (ids such as ``gen-…``), in one call."""
        return self._take(k).translate(_ALNUM_TABLE).decode("ascii")

    def getstate(self) -> Any:
        return (self._key, self._block, self._buf, self._pos, self.gauss_next)

    def setstate(self, state: Any) -> None:
        self._key, self._block, self._buf, self._pos, self.gauss_next = state
