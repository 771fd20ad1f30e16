"""The cache share a workload's shared prefixes allow: what the simulator's caches read
when every request of a conversation goes to one endpoint."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from provider_router import ConfigurationError
from provider_router.planning.workload_stats import shared_prefix_share
from provider_router.testing.chat.synth import count_prompt_tokens

SYSTEM = {"role": "system", "content": "You are a careful writer. " * 40}


def tokens(messages: list[dict[str, Any]]) -> int:
    return count_prompt_tokens(messages) - count_prompt_tokens([])


def turns(conversation: int, n: int) -> list[list[dict[str, Any]]]:
    messages: list[dict[str, Any]] = [SYSTEM]
    out = []
    for t in range(n):
        messages = [*messages, {"role": "user", "content": f"c{conversation} q{t} " * 5}]
        out.append(messages)
        messages = [*messages, {"role": "assistant", "content": f"answer {t} " * 20}]
    return out


def test_each_turn_reads_the_turn_before_and_the_system_prompt_is_shared() -> None:
    first, second = turns(0, 2), turns(1, 1)
    result = shared_prefix_share([*first, *second])
    assert result.prompts == 3
    assert result.prompt_tokens == sum(count_prompt_tokens(m) for m in [*first, *second])
    # Turn 2 reads turn 1's prompt; conversation 1 reads the shared system prompt.
    assert result.cached_tokens == tokens(first[0]) + tokens([SYSTEM])
    assert result.share == Decimal(result.cached_tokens) / Decimal(result.prompt_tokens)


def test_the_minimum_length_and_the_order_of_sending_count() -> None:
    first = turns(0, 2)
    # A longer prompt sent first leaves every boundary of it cached, the shorter one's too.
    assert shared_prefix_share(first[::-1]).cached_tokens == tokens(first[0])
    other = [{"role": "system", "content": "Another system prompt. " * 40}, *first[1][1:]]
    assert shared_prefix_share([first[1], other]).cached_tokens == 0, "another opener"
    high = tokens(first[0]) + 1
    assert shared_prefix_share(first, min_tokens=high).cached_tokens == 0
    assert shared_prefix_share([]).share == 0
    with pytest.raises(ConfigurationError, match="min_tokens"):
        shared_prefix_share(first, min_tokens=-1)


def test_it_counts_what_the_simulator_bills_as_cached() -> None:
    """The estimator's per-message tokens are the simulator's: a tokenizer can replace them."""
    result = shared_prefix_share(turns(0, 3), count_tokens=lambda text: len(text.split()))
    assert result.cached_tokens > 0
    assert result.cached_tokens < result.prompt_tokens
