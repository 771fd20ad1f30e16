"""Ray Data: the routed, budgeted client as a stage, for jobs beyond one machine.

Needs the extras: ``pip install 'provider-router-openrouter[ray,redis]'``. Importing this
package does not import Ray; :meth:`RayJob.generate` does. When to use Ray, and what
it costs: docs/workers.md.

* :class:`RayJob`: model, policy, generation parameters, the Redis URL and the
  budget; ``job.generate(ds)`` returns a Ray Dataset of answered rows, and
  ``job.finish(out)`` recovers dead actors' reservations, tallies, writes
  ``summary.json`` and raises :class:`JobStopped` on a budget stop.
* :class:`PromptStage`: the per-row async stage itself, for pipelines that build
  their own ``flat_map``.
"""

from __future__ import annotations

from provider_router._exceptions import JobStopped
from provider_router.ray._stage import (
    ANSWERED,
    FAILED,
    NOT_SENT,
    QUARANTINED,
    PromptStage,
    StageConfig,
)
from provider_router.ray._store import AnswerStore
from provider_router.ray.job import RayJob

__all__ = [
    "ANSWERED",
    "AnswerStore",
    "FAILED",
    "JobStopped",
    "NOT_SENT",
    "PromptStage",
    "QUARANTINED",
    "RayJob",
    "StageConfig",
]
