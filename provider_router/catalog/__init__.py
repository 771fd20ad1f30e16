"""What OpenRouter lists, and what we measured of it.

Typed records of models and endpoints, exact prices, the quantization order,
verification verdicts, and :class:`Catalog` (fetch, cache, snapshot). Nothing
here routes, spends or decides.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from provider_router.catalog.fetch import SNAPSHOT_FORMAT, Catalog

__all__ = ["SNAPSHOT_FORMAT", "Catalog"]


def __getattr__(name: str) -> _typing.Any:
    # Lazy: a record import never loads the HTTP client behind Catalog.
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(_importlib.import_module("provider_router.catalog.fetch"), name)
