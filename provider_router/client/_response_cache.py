"""OpenRouter's response cache, as a router uses it (docs/client.md, "Response caching").

Opting in sends ``X-OpenRouter-Cache: true`` and a TTL with every request: an answer
OpenRouter already gave to the same key, model, stream mode and body bytes comes back
free, marked ``X-OpenRouter-Cache-Status: HIT``. Two samples of one prompt would send
the same bytes and get the same answer back, so each request's body carries a sample
id derived from its label (the prompt's key): a re-sent prompt sends the same bytes
(and hits), two prompts never do. An unlabelled call gets a label of its own, so it
never hits. A hit is booked at $0 only when the answer says ``HIT``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

from provider_router._exceptions import ConfigurationError

__all__ = [
    "CACHE_HEADER",
    "DEFAULT_TTL",
    "HIT",
    "MAX_TTL",
    "SAMPLE_FIELD",
    "STATUS_HEADER",
    "TTL_HEADER",
    "asks_for_cache",
    "cache_headers",
    "cache_ttl",
    "with_sample_id",
]

CACHE_HEADER: Final = "X-OpenRouter-Cache"
TTL_HEADER: Final = "X-OpenRouter-Cache-TTL"
STATUS_HEADER: Final = "x-openrouter-cache-status"
"""The answer's verdict, ``HIT`` or ``MISS`` (lower case: how responses are read)."""
HIT: Final = "HIT"
DEFAULT_TTL: Final = 300
"""OpenRouter's default TTL in seconds, taken for ``response_cache=True``."""
MAX_TTL: Final = 86_400
SAMPLE_FIELD: Final = "provider_router_sample"
"""The ``metadata`` key that keeps two samples' bodies apart (OpenRouter's ``metadata``:
string pairs with no effect on the answer)."""
_METADATA_PAIRS: Final = 16


def cache_ttl(value: object) -> int | None:
    """The TTL ``Router(response_cache=...)`` asks for: seconds, or None (off).

    Raises:
        ConfigurationError: not True/False/None or a whole number of seconds in 1–86,400.
    """
    if value is None or value is False:
        return None
    if value is True:
        return DEFAULT_TTL
    if isinstance(value, int) and 1 <= value <= MAX_TTL:
        return value
    raise ConfigurationError(
        f"response_cache must be True, False, None or a TTL in seconds from 1 to {MAX_TTL:,}, "
        f"got {value!r}"
    )


def cache_headers(ttl: int) -> dict[str, str]:
    """The request headers that opt in for ``ttl`` seconds."""
    return {CACHE_HEADER: "true", TTL_HEADER: str(ttl)}


def asks_for_cache(headers: Mapping[str, str]) -> bool:
    """Whether headers given by the caller already opt in (``X-OpenRouter-Cache: true``)."""
    return any(
        name.lower() == CACHE_HEADER.lower() and value.strip().lower() == "true"
        for name, value in headers.items()
    )


def with_sample_id(
    params: Mapping[str, Any], key: str, defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """``params`` with ``metadata`` carrying the sample id of ``key`` (a digest: the
    label itself never leaves the process), over the router's own ``metadata`` in
    ``defaults`` when the call gives none.

    Raises:
        ConfigurationError: the ``metadata`` is not an object or is already full.
    """
    metadata = params["metadata"] if "metadata" in params else defaults.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, Mapping):
        raise ConfigurationError(f"metadata must be an object of strings, got {metadata!r}")
    if SAMPLE_FIELD not in metadata and len(metadata) >= _METADATA_PAIRS:
        raise ConfigurationError(
            f"metadata has {len(metadata)} pairs, OpenRouter's most: with response_cache "
            f"on, the router adds {SAMPLE_FIELD!r} (keep at most {_METADATA_PAIRS - 1})"
        )
    sample = hashlib.sha256(key.encode()).hexdigest()[:32]
    return {**params, "metadata": {**metadata, SAMPLE_FIELD: sample}}
