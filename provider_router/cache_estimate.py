"""The share of a workload's prompt tokens a provider's prefix cache can serve.

Providers with implicit caching keep the prompts they served and read the longest
cached prefix of a new prompt at the ``input_cache_read`` price (OpenRouter's
prompt-caching guide). Whole messages are the unit that can be shared: a later
turn of a conversation repeats every earlier message, and rows of a dataset that
share a system prompt repeat it. :func:`shared_prefix_share` walks the prompts in
the order they are sent and counts, for each, the tokens of its longest run of
leading messages that an earlier prompt began with: what a cache that kept
everything it saw would read. That is the hit rate under cache-aware pinning
(:mod:`provider_router.affinity`: every session on one endpoint, so its earlier
prefixes are there), and an upper bound otherwise; put it in
``WorkloadEstimate(cached_prompt_share=...)`` and the projection prices those
tokens at ``input_cache_read``.

What it does not know: a cache's time to live (a session idle longer than the
provider keeps its prompts reads nothing) and provider minimums (a prefix below
``min_tokens`` is neither stored nor read; pass the serving endpoints' minimum).
Token counts follow :func:`~provider_router.workload_stats.approx_prompt_tokens`
(or its ``count_tokens``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Final

from provider_router._exceptions import ConfigurationError
from provider_router._types import Message
from provider_router.workload_stats import TokenCounter, approx_prompt_tokens

__all__ = ["PrefixShare", "shared_prefix_share"]

_ENCODE: Final = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str).encode
_MAX_REMEMBERED: Final = 5_000_000
"""Distinct prefixes remembered (8 bytes of hash each in a set) before the walk refuses."""


class PrefixShare:
    """What :func:`shared_prefix_share` found.

    Attributes:
        prompts: prompts walked.
        prompt_tokens: their prompt tokens (estimated).
        cached_tokens: tokens of the prefixes an earlier prompt had already sent.
    """

    __slots__ = ("cached_tokens", "prompt_tokens", "prompts")

    def __init__(self, prompts: int, prompt_tokens: int, cached_tokens: int) -> None:
        self.prompts = prompts
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = cached_tokens

    @property
    def share(self) -> Decimal:
        """Cached over prompt tokens (0 when there are none): a ``cached_prompt_share``."""
        if not self.prompt_tokens:
            return Decimal(0)
        return Decimal(self.cached_tokens) / Decimal(self.prompt_tokens)

    def __repr__(self) -> str:
        return (
            f"PrefixShare(prompts={self.prompts}, prompt_tokens={self.prompt_tokens}, "
            f"cached_tokens={self.cached_tokens}, share={float(self.share):.4f})"
        )


def shared_prefix_share(
    prompts: Iterable[Sequence[Message]],
    *,
    min_tokens: int = 0,
    count_tokens: TokenCounter | None = None,
) -> PrefixShare:
    """Walk ``prompts`` in send order and count the tokens earlier prompts already sent.

    Args:
        prompts: each request's messages, in the order they are sent.
        min_tokens: prefixes shorter than this are neither cached nor read.
        count_tokens: a real tokenizer (default: the four-characters approximation).

    Raises:
        ConfigurationError: more distinct prefixes than can be remembered.
    """
    if min_tokens < 0:
        raise ConfigurationError(f"min_tokens must be ≥ 0, got {min_tokens}")
    empty = approx_prompt_tokens([], count_tokens=count_tokens)
    seen: set[int] = set()
    count = total = cached = 0
    for messages in prompts:
        count += 1
        key = 0
        tokens = 0
        read = 0
        boundaries: list[int] = []
        for message in messages:
            key = hash((key, _ENCODE(message)))
            tokens += approx_prompt_tokens([message], count_tokens=count_tokens) - empty
            if tokens >= min_tokens:
                if key in seen:
                    read = tokens
                boundaries.append(key)
        seen.update(boundaries)
        if len(seen) > _MAX_REMEMBERED:
            raise ConfigurationError(
                f"more than {_MAX_REMEMBERED:,} distinct prompt prefixes: estimate the cache "
                "share on a sample of the prompts"
            )
        total += tokens + empty
        cached += read
    return PrefixShare(count, total, cached)
