"""The local OpenRouter on its own thread and loop, reachable by Ray's actors on 127.0.0.1."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from decimal import Decimal
from typing import Any, TypeVar

from provider_router.testing import SimulatorServer

T = TypeVar("T")


class SimulatorThread:
    """A :class:`SimulatorServer` served from a background thread (the driver's
    own loop is busy in ``ray`` calls, which block)."""

    def __init__(self, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.server = self.call(self._start(kwargs))

    async def _start(self, kwargs: dict[str, Any]) -> SimulatorServer:
        server = SimulatorServer(**kwargs)
        await server.start()
        return server

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=60)

    @property
    def url(self) -> str:
        return self.server.url

    def charged(self, credits: Decimal) -> Decimal:
        """What the simulator charged, once every abandoned generation is billed."""
        self.call(self.server.simulator.settle_abandoned(now=True))
        return credits - self.server.balance

    def stop(self) -> None:
        try:
            self.call(self.server.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()
