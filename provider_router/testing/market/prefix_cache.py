"""Prompt prefix caching, per provider endpoint, as implicit caches behave.

A provider that caches reuses the longest cached prefix of a new prompt. The simulator
models that at message granularity: a prompt is the chain of its messages after the
fields a provider renders before them (tools, ``tool_choice``, ``response_format``),
each boundary keyed by a hash of everything up to it and worth the prompt tokens up to
it, counted as the request is billed. Serving a prompt stores every boundary; the next
prompt on the same endpoint reads the longest one it shares. A prefix shorter than
``min_tokens`` is not cached, an entry lives ``ttl`` simulated seconds after its last
use, and at most ``capacity`` entries are kept (least recently used evicted first).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from provider_router.testing.chat.synth import _PROMPT_FIELDS, count_request_prompt

__all__ = ["DEFAULT_CACHE_CAPACITY", "CacheResult", "PrefixCache", "prefix_chain"]

DEFAULT_CACHE_CAPACITY = 10_000
"""Boundaries kept per endpoint before the least recently used is evicted (about
1.6 MB per endpoint when full)."""
_ENCODE = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode
_PLAIN_KEYS = frozenset({"role", "content"})


@dataclass(frozen=True, slots=True)
class CacheResult:
    """What serving one prompt did to the cache: tokens read, and tokens newly written."""

    cached_tokens: int = 0
    written_tokens: int = 0


def _tokens(body: Mapping[str, Any]) -> int:
    return count_request_prompt(body)[0]


def prefix_chain(body: Mapping[str, Any]) -> list[tuple[int, int]]:
    """``(key, tokens)`` at each boundary of a chat request's prompt, shortest first.

    The first boundary is the rendered fields (tools, ``tool_choice``,
    ``response_format``) when there are any, then one per message. The key chains
    everything up to the boundary exactly as sent (any difference ends the shared
    prefix, as a token would); the tokens are its prompt tokens as billed (the
    reply-priming tokens at the end of a prompt are never part of a prefix). Keys
    are the process's own string hashes (cached on each string, so a long system
    prompt is hashed once): 64 bits, never stored outside this process.
    """
    fields = {name: body[name] for name in _PROMPT_FIELDS if body.get(name) is not None}
    empty = _tokens({"messages": []})
    key = 0
    tokens = 0
    chain: list[tuple[int, int]] = []
    if fields:
        key = hash(_ENCODE(fields))
        tokens = _tokens({**fields, "messages": []}) - empty
        chain.append((key, tokens))
    for message in body["messages"]:
        if isinstance(message, Mapping):
            content = message.get("content")
            if isinstance(content, str) and message.keys() <= _PLAIN_KEYS:
                key = hash((key, message.get("role"), content))
            else:  # parts, tool calls, names: the whole message, canonically
                key = hash((key, _ENCODE(message)))
        else:
            key = hash((key, repr(message)))
        tokens += _tokens({"messages": [message]}) - empty
        chain.append((key, tokens))
    return chain


class PrefixCache:
    """The prefix caches of every endpoint of one simulator.

    Args:
        capacity: boundaries kept per endpoint (least recently used evicted first).
    """

    __slots__ = ("_capacity", "_entries")

    def __init__(self, capacity: int = DEFAULT_CACHE_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self._capacity = capacity
        # endpoint tag -> boundary key -> when it expires (simulated seconds)
        self._entries: dict[str, OrderedDict[int, float]] = {}

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._entries.values())

    def serve(
        self,
        tag: str,
        chain: Sequence[tuple[int, int]],
        now: float,
        *,
        min_tokens: int,
        ttl: float,
    ) -> CacheResult:
        """Read the longest live cached prefix of ``chain`` on ``tag``, then store the chain.

        Returns the tokens read (0 on a miss) and the tokens written beyond them.
        """
        entries = self._entries.setdefault(tag, OrderedDict())
        cached = 0
        for key, tokens in reversed(chain):
            if tokens < min_tokens:
                break
            expires = entries.get(key)
            if expires is None:
                continue
            if expires <= now:
                del entries[key]
                continue
            cached = tokens
            break
        written = 0
        for key, tokens in chain:
            if tokens < min_tokens:
                continue
            entries[key] = now + ttl
            entries.move_to_end(key)
            written = max(written, tokens - cached)
        while len(entries) > self._capacity:
            entries.popitem(last=False)
        return CacheResult(cached, written)

    def clear(self) -> None:
        """Forget every cached prefix."""
        self._entries.clear()
