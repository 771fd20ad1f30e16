"""The Router keywords of the previous release, folded into their new homes.

Four timeout floats became :class:`~provider_router.Timeouts`, the pinning knobs
:class:`~provider_router.AffinityOptions`, the money-side knobs
:class:`~provider_router.Safeguards`; ``catalog`` and ``catalog_ttl`` are said by
``endpoints``, ``limiter`` by ``max_concurrency`` and ``rng`` by ``RetryPolicy(rng=)``;
``allow_fallbacks`` no longer has an effect on requests (cost-first admission sends
each attempt to one endpoint, with no fallback).
An old keyword still works for one release, with a ``DeprecationWarning`` pointing
at the caller; given together with the argument that replaces it, it is a
:class:`~provider_router.ConfigurationError`. This module goes with them.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Final, NamedTuple

from provider_router._exceptions import ConfigurationError
from provider_router.catalog.fetch import Catalog
from provider_router.catalog.records import ModelEndpoints
from provider_router.client._config import (
    AffinityOptions,
    Safeguards,
    Timeouts,
    check_count,
    check_factor,
    check_seconds,
    check_share,
)
from provider_router.client.limiter import AdaptiveLimiter
from provider_router.client.retry import RetryPolicy

__all__ = ["DEPRECATED_KEYWORDS", "Given", "fold_deprecated"]

_TIMEOUTS: Final = {
    "request_timeout": "request",
    "connect_timeout": "connect",
    "stream_idle_timeout": "stream_idle",
    "stream_deadline": "stream_deadline",
}
_SAFEGUARDS: Final = ("credits_hold_timeout", "cost_sanity_factor", "max_violations_in_a_row")
_AFFINITY: Final = {"pin_fallbacks": "pin_fallbacks", "cache_hit_rate": "hit_rate"}
_OTHERS: Final = {
    "catalog": "endpoints=<the Catalog>",
    "catalog_ttl": "endpoints=Catalog(ttl=...)",
    "limiter": "max_concurrency=<the AdaptiveLimiter>",
    "rng": "retry=RetryPolicy(rng=...)",
}
_NO_EFFECT: Final = {
    "allow_fallbacks": (
        "it no longer affects requests: each attempt goes to one endpoint admission "
        "chose, with allow_fallbacks: false (max_premium= says when a dearer one may serve)"
    ),
}

DEPRECATED_KEYWORDS: Final = frozenset(
    [*_TIMEOUTS, *_SAFEGUARDS, *_AFFINITY, *_OTHERS, *_NO_EFFECT]
)
"""Every keyword ``Router()`` still takes for one release."""

_STACKLEVEL: Final = 4
"""_warn, fold_deprecated, Router.__init__, then the caller the warning points at."""


class Given(NamedTuple):
    """The Router's arguments an old keyword may stand for, as given."""

    timeouts: Timeouts | None
    cache_affinity: bool | AffinityOptions
    safeguards: Safeguards | None
    endpoints: ModelEndpoints | Catalog | None
    max_concurrency: int | AdaptiveLimiter
    retry: RetryPolicy | None
    catalog_ttl: float | None = None
    """``catalog_ttl=`` as given: the plan's refresh and the own catalog's TTL."""
    allow_fallbacks: bool = True
    """``allow_fallbacks=`` as given: the route plan's (its ``provider_object``)."""


def _new_spelling(old: str) -> str:
    if old in _TIMEOUTS:
        return f"timeouts=Timeouts({_TIMEOUTS[old]}=...)"
    if old in _SAFEGUARDS:
        return f"safeguards=Safeguards({old}=...)"
    if old in _AFFINITY:
        return f"cache_affinity=AffinityOptions({_AFFINITY[old]}=...)"
    return _OTHERS[old]


def _warn(old: str) -> None:
    instead = _NO_EFFECT[old] if old in _NO_EFFECT else f"pass {_new_spelling(old)}"
    warnings.warn(
        f"Router({old}=...) is deprecated and will be removed in the next release: {instead}",
        DeprecationWarning,
        stacklevel=_STACKLEVEL,
    )


def _mixed(old: str, new: str) -> ConfigurationError:
    return ConfigurationError(
        f"Router: {old}= and {new}= were both given; {old}= is the deprecated spelling of "
        f"{_new_spelling(old)}: pass only {new}="
    )


def fold_deprecated(given: Given, old: dict[str, Any]) -> Given:
    """``given`` with the old keywords in ``old`` folded in (each warned about).

    Raises:
        TypeError: a keyword ``Router()`` never took.
        ConfigurationError: an old keyword together with the argument that replaces
            it, or an invalid value (named as it was given).
    """
    unknown = sorted(set(old) - DEPRECATED_KEYWORDS)
    if unknown:
        raise TypeError(f"Router.__init__() got an unexpected keyword argument {unknown[0]!r}")
    for name in old:
        _warn(name)
    folded = given
    timeouts = {new: old[name] for name, new in _TIMEOUTS.items() if name in old}
    if timeouts:
        if given.timeouts is not None:
            raise _mixed(next(name for name in _TIMEOUTS if name in old), "timeouts")
        for name, new in _TIMEOUTS.items():
            if name in old and not (new == "stream_deadline" and old[name] is None):
                check_seconds(name, old[name])
        folded = folded._replace(timeouts=Timeouts(**timeouts))
    safeguards = {name: old[name] for name in _SAFEGUARDS if name in old}
    if safeguards:
        if given.safeguards is not None:
            raise _mixed(next(iter(safeguards)), "safeguards")
        if "cost_sanity_factor" in safeguards:
            check_factor("cost_sanity_factor", safeguards["cost_sanity_factor"])
        if "max_violations_in_a_row" in safeguards:
            check_count("max_violations_in_a_row", safeguards["max_violations_in_a_row"])
        folded = folded._replace(safeguards=Safeguards(**safeguards))
    affinity = {new: old[name] for name, new in _AFFINITY.items() if name in old}
    if affinity:
        if isinstance(given.cache_affinity, AffinityOptions):
            raise _mixed(next(name for name in _AFFINITY if name in old), "cache_affinity")
        if affinity.get("hit_rate") is not None:
            check_share("cache_hit_rate", affinity["hit_rate"])
        options = AffinityOptions(**affinity)
        # Off, they never had an effect: checked, then dropped.
        if given.cache_affinity is True:
            folded = folded._replace(cache_affinity=options)
    if "catalog" in old:
        if given.endpoints is not None:
            raise _mixed("catalog", "endpoints")
        folded = folded._replace(endpoints=old["catalog"])
    if "catalog_ttl" in old:
        folded = folded._replace(catalog_ttl=check_seconds("catalog_ttl", old["catalog_ttl"]))
    if "limiter" in old and old["limiter"] is not None:
        if isinstance(given.max_concurrency, AdaptiveLimiter):
            raise _mixed("limiter", "max_concurrency")
        folded = folded._replace(max_concurrency=old["limiter"])
    if "allow_fallbacks" in old:
        folded = folded._replace(allow_fallbacks=bool(old["allow_fallbacks"]))
    if "rng" in old and old["rng"] is not None:
        retry = given.retry if given.retry is not None else RetryPolicy()
        if retry.rng is not None:
            raise _mixed("rng", "retry")
        folded = folded._replace(retry=dataclasses.replace(retry, rng=old["rng"]))
    return folded
