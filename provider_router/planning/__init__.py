"""Before money is spent: the plan of datasets, prompt files, workloads, projections.

``from provider_router.planning import Plan, load_plan, project``. A :class:`Plan`
names the datasets of a job and their targets; :func:`project` prices it on the
ranked endpoints for a workload measured from the prompt files or by a pilot
(:func:`run_pilot`); :func:`compare_routes` sets the sync route beside the Batch
API's (:func:`batch_route`). Nothing here runs a job (that is
:mod:`provider_router.jobs`). See docs/projection.md and docs/batch.md.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from provider_router.planning.compare import (
        RouteChoice,
        RouteComparison,
        RouteOption,
        compare_routes,
    )
    from provider_router.planning.plan import DatasetSpec, GenerationParams, Plan, load_plan
    from provider_router.planning.projection import (
        BudgetFit,
        CostRange,
        DatasetProjection,
        PartialDataset,
        Projection,
        RouteShare,
        Scenario,
        TokenTotals,
        flat_pricing,
        project,
    )
    from provider_router.planning.prompts import Prompt, PromptReader
    from provider_router.planning.workload import (
        DatasetDemand,
        SampleStats,
        WorkloadEstimate,
        demands_from_plan,
        estimate_from_samples,
    )
    from provider_router.planning.workload_stats import (
        PilotResult,
        PrefixShare,
        PromptFileStats,
        approx_prompt_tokens,
        measure_prompts,
        run_pilot,
        sample_prompts,
        shared_prefix_share,
    )
    from provider_router.routing.batch_endpoints import BatchRoute, batch_route
    from provider_router.routing.route_plan import estimate_prompt_tokens

# Loaded on first use (PEP 562): `import provider_router.planning` loads none of
# projection, YAML or the Router a pilot drives.
_LAZY: dict[str, str] = {
    "BatchRoute": "provider_router.routing.batch_endpoints",
    "BudgetFit": "provider_router.planning.projection",
    "CostRange": "provider_router.planning.projection",
    "DatasetDemand": "provider_router.planning.workload",
    "DatasetProjection": "provider_router.planning.projection",
    "DatasetSpec": "provider_router.planning.plan",
    "GenerationParams": "provider_router.planning.plan",
    "PartialDataset": "provider_router.planning.projection",
    "PilotResult": "provider_router.planning.workload_stats",
    "Plan": "provider_router.planning.plan",
    "PrefixShare": "provider_router.planning.workload_stats",
    "Projection": "provider_router.planning.projection",
    "Prompt": "provider_router.planning.prompts",
    "PromptFileStats": "provider_router.planning.workload_stats",
    "PromptReader": "provider_router.planning.prompts",
    "RouteChoice": "provider_router.planning.compare",
    "RouteComparison": "provider_router.planning.compare",
    "RouteOption": "provider_router.planning.compare",
    "RouteShare": "provider_router.planning.projection",
    "SampleStats": "provider_router.planning.workload",
    "Scenario": "provider_router.planning.projection",
    "TokenTotals": "provider_router.planning.projection",
    "WorkloadEstimate": "provider_router.planning.workload",
    "approx_prompt_tokens": "provider_router.planning.workload_stats",
    "batch_route": "provider_router.routing.batch_endpoints",
    "compare_routes": "provider_router.planning.compare",
    "demands_from_plan": "provider_router.planning.workload",
    "estimate_from_samples": "provider_router.planning.workload",
    "estimate_prompt_tokens": "provider_router.routing.route_plan",
    "flat_pricing": "provider_router.planning.projection",
    "load_plan": "provider_router.planning.plan",
    "measure_prompts": "provider_router.planning.workload_stats",
    "project": "provider_router.planning.projection",
    "run_pilot": "provider_router.planning.workload_stats",
    "sample_prompts": "provider_router.planning.workload_stats",
    "shared_prefix_share": "provider_router.planning.workload_stats",
}

__all__ = [
    "BatchRoute",
    "BudgetFit",
    "CostRange",
    "DatasetDemand",
    "DatasetProjection",
    "DatasetSpec",
    "GenerationParams",
    "PartialDataset",
    "PilotResult",
    "Plan",
    "PrefixShare",
    "Projection",
    "Prompt",
    "PromptFileStats",
    "PromptReader",
    "RouteChoice",
    "RouteComparison",
    "RouteOption",
    "RouteShare",
    "SampleStats",
    "Scenario",
    "TokenTotals",
    "WorkloadEstimate",
    "approx_prompt_tokens",
    "batch_route",
    "compare_routes",
    "demands_from_plan",
    "estimate_from_samples",
    "estimate_prompt_tokens",
    "flat_pricing",
    "load_plan",
    "measure_prompts",
    "project",
    "run_pilot",
    "sample_prompts",
    "shared_prefix_share",
]


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
