"""The garbage collector of a process that runs nothing but the local OpenRouter.

A server with 2,000 requests in flight keeps tens of thousands of young objects
alive at any moment; Python's default young-generation threshold (700 allocations)
makes the collector walk them again and again, and every full collection walks
the whole start-up heap (models, markets, imported modules) as well. In a process
of the simulator's own (``provider_router simulate``, the benchmarks' servers) both
are its to set: :func:`tune_for_server` freezes what start-up built and collects the
young generation ten times less often (4–15 % of the simulator's CPU per JSON answer,
docs/performance.md, "#13 wave 4: the simulator's process"). The function is
:func:`provider_router._collector.tune_for_process`, which the command line's own
runs use too.

The embedded :class:`~provider_router.testing.SimulatorServer` never calls it: it runs
in its host's process (a test session, a notebook), whose collector is the host's.
"""

from __future__ import annotations

from provider_router._collector import GEN0_THRESHOLD as SERVER_GEN0_THRESHOLD
from provider_router._collector import tune_for_process as tune_for_server

__all__ = ["SERVER_GEN0_THRESHOLD", "tune_for_server"]
