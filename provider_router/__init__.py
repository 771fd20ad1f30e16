"""provider_router: cost-aware, policy-routed, budget-capped inference through OpenRouter.

Everything public is importable from here: ``import provider_router as pr``.
"""

from __future__ import annotations

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
    CreditsExhausted,
    DataFileError,
    InvalidResponseError,
    MissingDependencyError,
    NotFoundError,
    PaymentRequiredError,
    PermissionDeniedError,
    PolicyViolationError,
    ProviderRouterError,
    ProviderUnavailableError,
    RateLimitError,
    RequestTimeout,
    ResponseCarriedError,
)
from provider_router.batch.export import ExportReport, export_conversations
from provider_router.batch.fleet import FleetProgress, FleetQueue, FleetTally, WorkItem
from provider_router.batch.fleet_source import FleetJournal, FleetSource
from provider_router.batch.inputs import Prompt, PromptReader
from provider_router.batch.journal import DatasetTally, FileJournal, Journal, LostRequest
from provider_router.batch.merge import DatasetMerge, MergeReport, merge_outputs
from provider_router.batch.output import OutputRecord, read_outputs
from provider_router.batch.plan import DatasetSpec, GenerationParams, Plan, load_plan
from provider_router.batch.runner import BatchRunner, DatasetProgress, RunProgress
from provider_router.batch.summary import RunSummary, StopReason
from provider_router.catalog import Catalog
from provider_router.client import ChatStream, Router
from provider_router.health import ProviderHealth, ProviderStats
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
from provider_router.limiter import AdaptiveLimiter
from provider_router.policy import Decision, DecisionCode, Decisions, ProviderPolicy
from provider_router.projection import (
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
from provider_router.quantization import NativePrecisionRegistry, precision_rank
from provider_router.ranking import RankedEndpoint, Workload, rank, workload_cost
from provider_router.records import (
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
from provider_router.results import ChatResult, StreamDelta, Usage
from provider_router.retry import Backoff, RetryPolicy, is_retryable
from provider_router.routing import RoutePlan, build_route_plan, estimate_prompt_tokens
from provider_router.workload import (
    DatasetDemand,
    SampleStats,
    WorkloadEstimate,
    demands_from_plan,
    estimate_from_samples,
)
from provider_router.workload_stats import (
    PilotResult,
    PromptFileStats,
    approx_prompt_tokens,
    measure_prompts,
    run_pilot,
    sample_prompts,
)

__version__ = "0.1.0"

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIStatusError",
    "AdaptiveLimiter",
    "AllAttemptsFailed",
    "Architecture",
    "AuthenticationError",
    "Backoff",
    "BadRequestError",
    "BatchRunner",
    "BudgetError",
    "BudgetExhausted",
    "BudgetFit",
    "Catalog",
    "ChatResult",
    "ChatStream",
    "ConfigurationError",
    "CostRange",
    "CostResolver",
    "CreditsExhausted",
    "DataFileError",
    "DatasetDemand",
    "DatasetMerge",
    "DatasetProgress",
    "DatasetProjection",
    "DatasetSpec",
    "DatasetTally",
    "Decision",
    "DecisionCode",
    "Decisions",
    "Endpoint",
    "EndpointHealth",
    "EndpointStatus",
    "ExportReport",
    "FileJournal",
    "FleetJournal",
    "FleetProgress",
    "FleetQueue",
    "FleetSource",
    "FleetTally",
    "GenerationParams",
    "InvalidResponseError",
    "Journal",
    "Ledger",
    "LedgerState",
    "LostRequest",
    "MemoryLedger",
    "MergeReport",
    "MissingDependencyError",
    "Model",
    "ModelEndpoints",
    "NativePrecisionRegistry",
    "NotFoundError",
    "OutputRecord",
    "PartialDataset",
    "PaymentRequiredError",
    "PercentileStats",
    "PermissionDeniedError",
    "PilotResult",
    "Plan",
    "PolicyViolationError",
    "Pricing",
    "PricingOverride",
    "Projection",
    "Prompt",
    "PromptFileStats",
    "PromptReader",
    "ProviderHealth",
    "ProviderPolicy",
    "ProviderRouterError",
    "ProviderStats",
    "ProviderUnavailableError",
    "Quantization",
    "RankedEndpoint",
    "RateLimitError",
    "RecoveryReport",
    "RedisLedger",
    "RequestTimeout",
    "Reservation",
    "ResponseCarriedError",
    "RetryPolicy",
    "RoutePlan",
    "RouteShare",
    "Router",
    "RunProgress",
    "RunSummary",
    "SQLiteLedger",
    "SampleStats",
    "Scenario",
    "StopReason",
    "StreamDelta",
    "TokenTotals",
    "ToolChoiceSupport",
    "TopProvider",
    "Usage",
    "WorkItem",
    "Workload",
    "WorkloadEstimate",
    "__version__",
    "approx_prompt_tokens",
    "build_route_plan",
    "demands_from_plan",
    "estimate_from_samples",
    "estimate_prompt_tokens",
    "export_conversations",
    "flat_pricing",
    "is_retryable",
    "load_plan",
    "measure_prompts",
    "merge_outputs",
    "precision_rank",
    "project",
    "rank",
    "read_outputs",
    "run_pilot",
    "sample_prompts",
    "workload_cost",
]
