"""The garbage collector of a process that runs nothing but the local OpenRouter.

A server with 2,000 requests in flight keeps tens of thousands of young objects
alive at any moment; Python's default young-generation threshold (700 allocations)
makes the collector walk them again and again, and every full collection walks
the whole start-up heap (models, markets, imported modules) as well. In a process
of the simulator's own (``provider_router simulate``, the benchmarks' servers) both
are its to set: :func:`tune_for_server` freezes what start-up built and collects the
young generation ten times less often (4–15 % of the simulator's CPU per JSON answer,
docs/performance.md, "#13 wave 4: the simulator's process").

The embedded :class:`~provider_router.testing.SimulatorServer` never calls it: it runs
in its host's process (a test session, a notebook), whose collector is the host's.
"""

from __future__ import annotations

import gc
from typing import Final

__all__ = ["SERVER_GEN0_THRESHOLD", "tune_for_server"]

SERVER_GEN0_THRESHOLD: Final = 7000
"""Allocations between two young-generation collections (Python's default: 700)."""


def tune_for_server() -> None:
    """Freeze the start-up heap and collect the young generation less often.

    Call once, after the server started, in a process that serves and does nothing
    else. Frozen objects are still freed when their last reference goes; only
    cycles among them wait for :func:`gc.unfreeze`. The older generations keep their
    thresholds; a higher young threshold is kept, and a collector the process
    disabled (``gc.disable()`` or a threshold of 0) stays disabled.
    """
    gc.collect()
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    if gen0:
        gc.set_threshold(max(gen0, SERVER_GEN0_THRESHOLD), gen1, gen2)
