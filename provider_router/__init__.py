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

__version__ = "0.1.0"

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIStatusError",
    "AllAttemptsFailed",
    "AuthenticationError",
    "BadRequestError",
    "BudgetError",
    "BudgetExhausted",
    "ConfigurationError",
    "CreditsExhausted",
    "DataFileError",
    "InvalidResponseError",
    "MissingDependencyError",
    "NotFoundError",
    "PaymentRequiredError",
    "PermissionDeniedError",
    "PolicyViolationError",
    "ProviderRouterError",
    "ProviderUnavailableError",
    "RateLimitError",
    "RequestTimeout",
    "ResponseCarriedError",
    "__version__",
]
