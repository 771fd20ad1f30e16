"""The garbage collector of a process that is ours: the command line's, a server's.

With thousands of requests in flight a process keeps tens of thousands of young
objects alive, and Python's default thresholds make the collector walk them, and the
whole start-up heap, again and again (docs/performance.md). :func:`tune_for_process`
freezes what start-up built and collects the young generation ten times less often.

Only a process that is ours calls it (``provider-router run``, ``demo`` and
``simulate`` run as commands, the benchmarks' servers). The library never does: a
``Router`` runs in its host's process, whose collector is the host's to set.
"""

from __future__ import annotations

import gc
from typing import Final

__all__ = ["GEN0_THRESHOLD", "tune_for_process"]

GEN0_THRESHOLD: Final = 7000
"""Allocations between two young-generation collections (Python's default: 700)."""


def tune_for_process() -> None:
    """Freeze the start-up heap and collect the young generation less often.

    Call once, after start-up, in a process that is ours. Frozen objects are still
    freed when their last reference goes; only cycles among them wait for
    :func:`gc.unfreeze`. The older generations keep their thresholds; a higher young
    threshold is kept, and a collector the process disabled (``gc.disable()`` or a
    threshold of 0) stays disabled.
    """
    gc.collect()
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    if gen0:
        gc.set_threshold(max(gen0, GEN0_THRESHOLD), gen1, gen2)
