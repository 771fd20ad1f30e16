"""The routed, budgeted client and one request's life.

:class:`Router` (its options and one attempt), billing against the ledger,
retries, the adaptive limiter, provider health, cache affinity and metrics.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from provider_router.client._config import AffinityOptions, Safeguards, Timeouts
    from provider_router.client.router import ChatStream, Router

__all__ = ["AffinityOptions", "ChatStream", "Router", "Safeguards", "Timeouts"]

_HOMES: _typing.Final = {
    "AffinityOptions": "provider_router.client._config",
    "ChatStream": "provider_router.client.router",
    "Router": "provider_router.client.router",
    "Safeguards": "provider_router.client._config",
    "Timeouts": "provider_router.client._config",
}


def __getattr__(name: str) -> _typing.Any:
    # Lazy: importing a result type never loads the Router and its transport.
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(_importlib.import_module(home), name)
