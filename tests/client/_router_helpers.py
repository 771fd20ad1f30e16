"""Shared helpers of the Router tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from provider_router import Router

KIMI = "moonshotai/kimi-k2.5"
MESSAGES = [{"role": "user", "content": "Say hello in Portuguese."}]

MakeRouter = Callable[..., Awaitable[Router]]


class RecordingSleep:
    """An injected sleep that records what it was asked and returns at once."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)
