"""Rows one stage actor runs at once: Ray's constant, raised for our stage alone.

Ray Data runs an async row UDF's rows ``DEFAULT_ASYNC_ROW_UDF_MAX_CONCURRENCY`` (16)
at a time, read when it plans the stage; there is no public option (the environment
variable of the same name is read once, at import, and would apply to every stage).
"""

from __future__ import annotations

import threading
from typing import Any

from provider_router._constants import DISTRIBUTION
from provider_router._exceptions import ConfigurationError
from provider_router.ray._stage import PromptStage, StageConfig

__all__ = ["scope_row_concurrency", "stage_concurrency"]


_PLANNING = threading.Lock()
"""Held while the constant is ours (a stage planned from another thread waits)."""


def stage_concurrency(fn: Any) -> int | None:
    """The per-actor concurrency of our stage's UDF ``fn`` (None: not ours)."""
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            spec = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        cls, args = getattr(spec, "cls", None), getattr(spec, "args", ())
        if isinstance(cls, type) and issubclass(cls, PromptStage) and args:
            config = args[0]
            if isinstance(config, StageConfig):
                return config.concurrency
    return None


def scope_row_concurrency() -> None:
    """Rows one of *our* actors runs at once, leaving every other async stage as Ray sets it.

    Ray reads ``DEFAULT_ASYNC_ROW_UDF_MAX_CONCURRENCY`` (16) when it plans a stage; there is
    no public option. Raising the constant would raise it for the user's other async
    stages too, so the planner's flat-map step is wrapped instead: for our stage's UDF
    the constant is our concurrency while that one stage is planned, and is put back at
    once. The ``ray`` extra pins the Ray range this was tested on.
    """
    from ray.data._internal.planner import plan_udf_map_op as planner

    original = getattr(planner, "_generate_transform_fn_for_flat_map", None)
    if original is None or not hasattr(planner, "DEFAULT_ASYNC_ROW_UDF_MAX_CONCURRENCY"):
        raise ConfigurationError(
            "this Ray has no DEFAULT_ASYNC_ROW_UDF_MAX_CONCURRENCY: install the tested range "
            f"with pip install '{DISTRIBUTION}[ray]'"
        )
    if getattr(original, "_provider_router", False):
        return

    def generate(fn: Any) -> Any:
        concurrency = stage_concurrency(fn)
        if concurrency is None:
            return original(fn)
        with _PLANNING:
            default = planner.DEFAULT_ASYNC_ROW_UDF_MAX_CONCURRENCY
            planner.DEFAULT_ASYNC_ROW_UDF_MAX_CONCURRENCY = concurrency
            try:
                return original(fn)
            finally:
                planner.DEFAULT_ASYNC_ROW_UDF_MAX_CONCURRENCY = default

    generate._provider_router = True  # type: ignore[attr-defined]
    planner._generate_transform_fn_for_flat_map = generate
