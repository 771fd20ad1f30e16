"""What the simulator saw: one record per request, and counters.

Tests read these to check what the client really sent (the routing object), which
provider served, what it cost and how it ended, without parsing logs.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from provider_router._money import from_units

__all__ = ["RequestLog", "RequestRecord"]


@dataclass(slots=True)
class RequestRecord:
    """One request to a simulator route.

    Attributes:
        seq: arrival number, from 1.
        route: ``chat``, ``generation``, ``key``, ``credits``, ``models``,
            ``models_count``, ``model``, ``endpoints`` or ``providers``.
        key_label: a non-secret name of the API key (``key-<hash>``), or None.
        model: the requested model id (chat only).
        stream: whether a stream was requested.
        routing: the request's ``provider`` object as sent (None when absent).
        max_tokens: the request's max_tokens / max_completion_tokens, if any.
        logprobs: the ``top_logprobs`` asked for with ``logprobs: true`` (0 when not
            given), None when logprobs were not asked for.
        attempts: ``(tag, status)`` per provider tried, in order (200 for the server).
        tag: routing tag of the endpoint that served, or None.
        provider: display name of the provider that served, or None.
        status: HTTP status sent.
        outcome: ``ok``, ``error`` or the fault kind that shaped the answer.
        cost_units: what was charged, in picodollars (``cost`` gives USD).
        generation_id: the ``gen-...`` id, when a generation was served.
        limit_source: for 402s, which limit refused the request.
        tools: names of the function tools the request offered, in order.
        tool_choice: the request's ``tool_choice`` as sent (None when absent).
        degraded: served by an endpoint with ``serves:`` past its ``after_requests``
            (docs/simulator.md): its answer departs from the model's.
        compressed: context compression dropped messages from the middle of its
            prompt before it was served (:mod:`~provider_router.testing.market.compression`).
    """

    seq: int
    route: str
    key_label: str | None = None
    model: str | None = None
    stream: bool = False
    routing: Any = None
    max_tokens: int | None = None
    logprobs: int | None = None
    attempts: list[tuple[str, int]] = field(default_factory=list)
    tag: str | None = None
    provider: str | None = None
    status: int = 200
    outcome: str = "ok"
    cost_units: int = 0
    generation_id: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    tools: tuple[str, ...] = ()
    tool_choice: Any = None
    finish_reason: str | None = None
    limit_source: str | None = None
    degraded: bool = False
    compressed: bool = False

    @property
    def cost(self) -> Decimal:
        """USD charged for this request, exact."""
        return from_units(self.cost_units)


class _Names(dict[tuple[str, int, str, str | None, str | None], tuple[str, ...]]):
    """The counters one finished request adds to, per (route, status, outcome, tag,
    the tag of its only attempt): a few dozen combinations, built once instead of
    five strings per request."""

    def __missing__(self, key: tuple[str, int, str, str | None, str | None]) -> tuple[str, ...]:
        route, status, outcome, tag, only_attempt = key
        names = ["requests", f"route.{route}", f"status.{status}"]
        if route == "chat":
            names.append(f"outcome.{outcome}")
            if tag is not None:
                names.append(f"served.{tag}")
            if only_attempt is not None:
                names.append(f"attempt.{only_attempt}")
        self[key] = result = tuple(names)
        return result


class RequestLog:
    """The most recent ``limit`` records plus counters over the whole run.

    Counter keys: ``requests``, ``route.<route>``, ``status.<code>``,
    ``served.<tag>``, ``attempt.<tag>``, ``fault.<kind>``, ``outcome.<outcome>``,
    ``context_compression``, ``refused_parameter``.
    """

    def __init__(self, limit: int = 100_000) -> None:
        self.records: deque[RequestRecord] = deque(maxlen=limit)
        self.counters: Counter[str] = Counter()
        self._seq = 0
        self._names = _Names()

    def start(self, route: str) -> RequestRecord:
        self._seq += 1
        record = RequestRecord(self._seq, route)
        self.records.append(record)
        return record

    def finish(self, record: RequestRecord) -> None:
        counters = self.counters
        route = record.route
        attempts = record.attempts
        # The usual chat request made one attempt: its counter is among the names.
        only = attempts[0][0] if route == "chat" and len(attempts) == 1 else None
        for name in self._names[(route, record.status, record.outcome, record.tag, only)]:
            counters[name] += 1
        if route == "chat" and only is None:
            for tag, _status in attempts:
                counters["attempt." + tag] += 1

    def chat(self) -> list[RequestRecord]:
        """The chat completion records, oldest first."""
        return [r for r in self.records if r.route == "chat"]

    def __iter__(self) -> Iterator[RequestRecord]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def clear(self) -> None:
        self.records.clear()
        self.counters.clear()
