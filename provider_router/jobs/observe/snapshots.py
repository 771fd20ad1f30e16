"""The run's progress records where the package's lazy table finds them.

They are the run's own (:mod:`provider_router.jobs.snapshots`); this module goes
once ``provider_router.RunProgress`` and ``DatasetProgress`` point there.
"""

from __future__ import annotations

from provider_router.jobs.snapshots import DatasetProgress, RunProgress

__all__ = ["DatasetProgress", "RunProgress"]
