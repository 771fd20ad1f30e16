"""Shared helpers of the Router tests."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Container
from pathlib import Path

from provider_router import Router
from provider_router.client._request import PreparedRequest
from provider_router.testing import Market

KIMI = "moonshotai/kimi-k2.5"
MESSAGES = [{"role": "user", "content": "Say hello in Portuguese."}]

MakeRouter = Callable[..., Awaitable[Router]]

MARKETS = Path(__file__).parents[1] / "data" / "markets"
"""Small market files shared by the simulator's and the Router's tests."""


class RecordingSleep:
    """An injected sleep that records what it was asked and returns at once."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def served_as(name: str, tags: Container[str] | None = None) -> Market:
    """The default market with the endpoints ``tags`` (default: all) served as ``name``."""
    market = Market.default()
    model = market.models[KIMI]
    endpoints = tuple(
        dataclasses.replace(e, provider_name=name) if tags is None or e.tag in tags else e
        for e in model.endpoints
    )
    return Market([dataclasses.replace(model, endpoints=endpoints)], market.providers)


def route_first(router: Router, request: PreparedRequest) -> None:
    """Admit a prepared request as its first attempt does and route it (its payload and
    worst case become the admitted endpoint's), then give the place back."""
    admission = router.admission
    ticket = admission.try_admit(admission.queue(*request.pin_needs, request.pinned))
    assert ticket is not None
    router._route(request, ticket, admission)
    admission.release(ticket, "neutral")
