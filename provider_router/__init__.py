"""provider_router: LLM requests through OpenRouter, on allowed providers, within a budget.

Each request goes only to the providers whose quantization the policy allows, cheapest
for the workload first, and is paid from a ledger that no number of processes can
overspend; ``provider_router.jobs`` turns JSONL prompt files into datasets. First call::

    from decimal import Decimal
    import provider_router as pr

    async with pr.MemoryLedger(Decimal("5")) as ledger, pr.Router(
        model="moonshotai/kimi-k2.5", policy=pr.ProviderPolicy(exclude_below="int4"),
        ledger=ledger,
    ) as router:
        result = await router.chat([{"role": "user", "content": "Hi"}], max_tokens=256)

Offline first: ``provider-router demo``. Install ``provider-router-openrouter``
(``provider-router`` on the package index is another project). Importable here: the
errors, the Router and its results, the catalog's records, policy and ranking, the
ledgers, retries and ``verify``; beside them ``provider_router.planning``, ``.jobs``,
``.testing`` (the local OpenRouter) and ``.ray``.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

from provider_router import (
    _deprecated,
    _log,  # noqa: F401 - the package logger's NullHandler
)
from provider_router._exceptions import (
    AllAttemptsFailed,
    APIConnectionError,
    APIError,
    APIStatusError,
    AuthenticationError,
    BadRequestError,
    BudgetError,
    BudgetExhausted,
    ConfigurationError,
    ContextLengthExceeded,
    CreditsExhausted,
    DataFileError,
    InvalidResponseError,
    JobRefused,
    JobStopped,
    LedgerUnavailableError,
    LedgerWriteError,
    MissingDependencyError,
    NotFoundError,
    PaymentRequiredError,
    PermissionDeniedError,
    PolicyViolationError,
    PreflightFailed,
    ProviderRouterError,
    ProviderUnavailableError,
    RateLimitError,
    RequestTimeout,
    ResponseCarriedError,
    RouterStopping,
)

if _typing.TYPE_CHECKING:
    from provider_router.catalog.fetch import Catalog
    from provider_router.catalog.quantization import (
        NativePrecisionRegistry,
        QuantizationScheme,
        precision_rank,
        read_scheme,
    )
    from provider_router.catalog.records import (
        Architecture,
        Endpoint,
        EndpointHealth,
        EndpointStatus,
        Model,
        ModelEndpoints,
        PercentileStats,
        Pricing,
        PricingOverride,
        Quantization,
        ToolChoiceSupport,
        TopProvider,
    )
    from provider_router.catalog.verdicts import (
        EndpointVerdict,
        Estimate,
        VerificationReport,
        VerifyThresholds,
    )
    from provider_router.checks.verify import verify
    from provider_router.client._config import AffinityOptions, Safeguards, Timeouts
    from provider_router.client.affinity import CacheAffinity
    from provider_router.client.health import ProviderHealth, ProviderStats
    from provider_router.client.limiter import AdaptiveLimiter
    from provider_router.client.metrics import Metrics
    from provider_router.client.results import (
        ChatResult,
        StreamDelta,
        TokenLogprob,
        ToolCall,
        ToolCallDelta,
        Usage,
    )
    from provider_router.client.retry import Backoff, RetryPolicy, is_retryable
    from provider_router.client.router import ChatStream, Router
    from provider_router.client.router_metadata import RouterMetadata
    from provider_router.ledger import (
        CostResolver,
        Ledger,
        LedgerState,
        MemoryLedger,
        RecoveryReport,
        RedisLedger,
        Reservation,
        SQLiteLedger,
    )
    from provider_router.routing.policy import Decision, DecisionCode, Decisions, ProviderPolicy
    from provider_router.routing.ranking import RankedEndpoint, Workload, rank, workload_cost
    from provider_router.routing.route_plan import RoutePlan, build_route_plan

# Everything but the exceptions loads on first use (PEP 562): `import provider_router`
# stays cheap, and a plain Router never imports the batch runner, projection, rich,
# YAML or sqlite3 (docs/performance.md, import time).
_LAZY: dict[str, str] = {
    "AdaptiveLimiter": "provider_router.client.limiter",
    "AffinityOptions": "provider_router.client._config",
    "Architecture": "provider_router.catalog.records",
    "Backoff": "provider_router.client.retry",
    "CacheAffinity": "provider_router.client.affinity",
    "Catalog": "provider_router.catalog.fetch",
    "ChatResult": "provider_router.client.results",
    "ChatStream": "provider_router.client.router",
    "CostResolver": "provider_router.ledger",
    "Decision": "provider_router.routing.policy",
    "DecisionCode": "provider_router.routing.policy",
    "Decisions": "provider_router.routing.policy",
    "Endpoint": "provider_router.catalog.records",
    "EndpointHealth": "provider_router.catalog.records",
    "EndpointStatus": "provider_router.catalog.records",
    "EndpointVerdict": "provider_router.catalog.verdicts",
    "Estimate": "provider_router.catalog.verdicts",
    "Ledger": "provider_router.ledger",
    "LedgerState": "provider_router.ledger",
    "MemoryLedger": "provider_router.ledger",
    "Metrics": "provider_router.client.metrics",
    "Model": "provider_router.catalog.records",
    "ModelEndpoints": "provider_router.catalog.records",
    "NativePrecisionRegistry": "provider_router.catalog.quantization",
    "PercentileStats": "provider_router.catalog.records",
    "Pricing": "provider_router.catalog.records",
    "PricingOverride": "provider_router.catalog.records",
    "ProviderHealth": "provider_router.client.health",
    "ProviderPolicy": "provider_router.routing.policy",
    "ProviderStats": "provider_router.client.health",
    "Quantization": "provider_router.catalog.records",
    "QuantizationScheme": "provider_router.catalog.quantization",
    "RankedEndpoint": "provider_router.routing.ranking",
    "RecoveryReport": "provider_router.ledger",
    "RedisLedger": "provider_router.ledger",
    "Reservation": "provider_router.ledger",
    "RetryPolicy": "provider_router.client.retry",
    "RoutePlan": "provider_router.routing.route_plan",
    "Router": "provider_router.client.router",
    "RouterMetadata": "provider_router.client.router_metadata",
    "SQLiteLedger": "provider_router.ledger",
    "Safeguards": "provider_router.client._config",
    "StreamDelta": "provider_router.client.results",
    "Timeouts": "provider_router.client._config",
    "TokenLogprob": "provider_router.client.results",
    "ToolCall": "provider_router.client.results",
    "ToolCallDelta": "provider_router.client.results",
    "ToolChoiceSupport": "provider_router.catalog.records",
    "TopProvider": "provider_router.catalog.records",
    "Usage": "provider_router.client.results",
    "VerificationReport": "provider_router.catalog.verdicts",
    "VerifyThresholds": "provider_router.catalog.verdicts",
    "Workload": "provider_router.routing.ranking",
    "build_route_plan": "provider_router.routing.route_plan",
    "is_retryable": "provider_router.client.retry",
    "precision_rank": "provider_router.catalog.quantization",
    "rank": "provider_router.routing.ranking",
    "read_scheme": "provider_router.catalog.quantization",
    "verify": "provider_router.checks.verify",
    "workload_cost": "provider_router.routing.ranking",
}

# Names that lived here before their namespace: they resolve for one more release,
# with a DeprecationWarning, and stay out of __all__ and dir().
_MOVED: dict[str, str] = {
    "BatchRoute": "provider_router.planning.BatchRoute",
    "BatchRunner": "provider_router.jobs.JobRunner",
    "BudgetFit": "provider_router.planning.BudgetFit",
    "CostRange": "provider_router.planning.CostRange",
    "DatasetDemand": "provider_router.planning.DatasetDemand",
    "DatasetMerge": "provider_router.jobs.DatasetMerge",
    "DatasetProgress": "provider_router.jobs.DatasetProgress",
    "DatasetProjection": "provider_router.planning.DatasetProjection",
    "DatasetSpec": "provider_router.planning.DatasetSpec",
    "DatasetTally": "provider_router.jobs.DatasetTally",
    "ExportReport": "provider_router.jobs.ExportReport",
    "FileJournal": "provider_router.jobs.FileJournal",
    "GenerationParams": "provider_router.planning.GenerationParams",
    "JobRunner": "provider_router.jobs.JobRunner",
    "Journal": "provider_router.jobs.Journal",
    "LostRequest": "provider_router.jobs.LostRequest",
    "MergeReport": "provider_router.jobs.MergeReport",
    "OutputRecord": "provider_router.jobs.OutputRecord",
    "PartialDataset": "provider_router.planning.PartialDataset",
    "PilotResult": "provider_router.planning.PilotResult",
    "Plan": "provider_router.planning.Plan",
    "PrefixShare": "provider_router.planning.PrefixShare",
    "Projection": "provider_router.planning.Projection",
    "Prompt": "provider_router.planning.Prompt",
    "PromptFileStats": "provider_router.planning.PromptFileStats",
    "PromptReader": "provider_router.planning.PromptReader",
    "RouteComparison": "provider_router.planning.RouteComparison",
    "RouteShare": "provider_router.planning.RouteShare",
    "RunProgress": "provider_router.jobs.RunProgress",
    "RunSummary": "provider_router.jobs.RunSummary",
    "SampleStats": "provider_router.planning.SampleStats",
    "Scenario": "provider_router.planning.Scenario",
    "StopReason": "provider_router.jobs.StopReason",
    "TokenTotals": "provider_router.planning.TokenTotals",
    "WorkloadEstimate": "provider_router.planning.WorkloadEstimate",
    "approx_prompt_tokens": "provider_router.planning.approx_prompt_tokens",
    "batch_route": "provider_router.planning.batch_route",
    "compare_routes": "provider_router.planning.compare_routes",
    "demands_from_plan": "provider_router.planning.demands_from_plan",
    "estimate_from_samples": "provider_router.planning.estimate_from_samples",
    "estimate_prompt_tokens": "provider_router.planning.estimate_prompt_tokens",
    "export_conversations": "provider_router.jobs.export_conversations",
    "flat_pricing": "provider_router.planning.flat_pricing",
    "load_plan": "provider_router.planning.load_plan",
    "measure_prompts": "provider_router.planning.measure_prompts",
    "merge_outputs": "provider_router.jobs.merge_outputs",
    "project": "provider_router.planning.project",
    "read_outputs": "provider_router.jobs.read_outputs",
    "run_pilot": "provider_router.planning.run_pilot",
    "sample_prompts": "provider_router.planning.sample_prompts",
    "shared_prefix_share": "provider_router.planning.shared_prefix_share",
}

__version__ = "0.1.0"

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIStatusError",
    "AdaptiveLimiter",
    "AffinityOptions",
    "AllAttemptsFailed",
    "Architecture",
    "AuthenticationError",
    "Backoff",
    "BadRequestError",
    "BudgetError",
    "BudgetExhausted",
    "CacheAffinity",
    "Catalog",
    "ChatResult",
    "ChatStream",
    "ConfigurationError",
    "ContextLengthExceeded",
    "CostResolver",
    "CreditsExhausted",
    "DataFileError",
    "Decision",
    "DecisionCode",
    "Decisions",
    "Endpoint",
    "EndpointHealth",
    "EndpointStatus",
    "EndpointVerdict",
    "Estimate",
    "InvalidResponseError",
    "JobRefused",
    "JobStopped",
    "Ledger",
    "LedgerState",
    "LedgerUnavailableError",
    "LedgerWriteError",
    "MemoryLedger",
    "Metrics",
    "MissingDependencyError",
    "Model",
    "ModelEndpoints",
    "NativePrecisionRegistry",
    "NotFoundError",
    "PaymentRequiredError",
    "PercentileStats",
    "PermissionDeniedError",
    "PolicyViolationError",
    "PreflightFailed",
    "Pricing",
    "PricingOverride",
    "ProviderHealth",
    "ProviderPolicy",
    "ProviderRouterError",
    "ProviderStats",
    "ProviderUnavailableError",
    "Quantization",
    "QuantizationScheme",
    "RankedEndpoint",
    "RateLimitError",
    "RecoveryReport",
    "RedisLedger",
    "RequestTimeout",
    "Reservation",
    "ResponseCarriedError",
    "RetryPolicy",
    "RoutePlan",
    "Router",
    "RouterMetadata",
    "RouterStopping",
    "SQLiteLedger",
    "Safeguards",
    "StreamDelta",
    "Timeouts",
    "TokenLogprob",
    "ToolCall",
    "ToolCallDelta",
    "ToolChoiceSupport",
    "TopProvider",
    "Usage",
    "VerificationReport",
    "VerifyThresholds",
    "Workload",
    "__version__",
    "build_route_plan",
    "is_retryable",
    "precision_rank",
    "rank",
    "read_scheme",
    "verify",
    "workload_cost",
]


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is None:
        if name in _MOVED:
            return _deprecated.resolve_old_name(f"provider_router.{name}", _MOVED[name])
        raise AttributeError(f"module 'provider_router' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
