"""Run the simulator on a real loopback socket: in-process or standalone."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterable, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

from aiohttp import web

from provider_router._resource import AsyncResource
from provider_router._types import Clock, Sleep
from provider_router.testing.app import Simulator, make_app
from provider_router.testing.faults import Fault, fault_from_mapping, load_faults
from provider_router.testing.introspection import RequestLog, RequestRecord
from provider_router.testing.market.listing import Market

__all__ = ["SimulatorServer"]

DEFAULT_TEST_KEY = "sk-sim-test-key"
"""The key the pytest fixture accepts (not an OpenRouter-format key)."""


def _market(market: Market | str | Path | None) -> Market:
    if market is None:
        return Market.default()
    if isinstance(market, Market):
        return market
    return Market.from_file(market)


def _faults(faults: Iterable[Fault | Mapping[str, Any]] | str | Path | None) -> list[Fault]:
    if faults is None:
        return []
    if isinstance(faults, str | Path):
        return load_faults(faults)
    return [f if isinstance(f, Fault) else fault_from_mapping(f) for f in faults]


class SimulatorServer(AsyncResource):
    """The local OpenRouter on ``127.0.0.1`` (free port unless ``port`` is given).

    Use as ``async with SimulatorServer(...) as sim:``; ``sim.url`` is the base URL
    ending in ``/api/v1``. Everything else is on :attr:`simulator` and mirrored
    here for convenience: :attr:`log`, :meth:`top_up`, :meth:`set_balance`,
    :attr:`balance`, :meth:`add_fault`, :meth:`set_down`.

    Args:
        market: a :class:`Market`, a path to a market file, or None for the default.
        faults: :class:`Fault` objects or mappings (as in a fault file), or a path.
        seed, credits, api_keys, speed, clock, sleep, **options: see :class:`Simulator`.
        host, port: where to listen (defaults: 127.0.0.1, a free port).
    """

    def __init__(
        self,
        market: Market | str | Path | None = None,
        faults: Iterable[Fault | Mapping[str, Any]] | str | Path | None = None,
        *,
        seed: int = 0,
        credits: Decimal | int | str = 100,
        api_keys: Iterable[str] | Mapping[str, Decimal | int | str | None] | None = None,
        speed: float = 1.0,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        **options: Any,
    ) -> None:
        self.simulator = Simulator(
            _market(market),
            _faults(faults),
            seed=seed,
            credits=credits,
            api_keys=api_keys,
            speed=speed,
            clock=clock,
            sleep=sleep,
            **options,
        )
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:54321/api/v1``."""
        if self._runner is None:
            raise RuntimeError("the simulator is not running; use 'async with SimulatorServer()'")
        return f"http://{self.host}:{self.port}/api/v1"

    async def start(self) -> None:
        runner = web.AppRunner(
            make_app(self.simulator),
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=0.5,
        )
        await runner.setup()
        # A deep backlog: benchmarks open 2,000 connections at once.
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True, backlog=4096)
        await site.start()
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            self.port = sockets[0].getsockname()[1]
        self._runner = runner

    async def stop(self) -> None:
        if self._runner is None:
            return
        self.simulator.stopping.set()
        runner, self._runner = self._runner, None
        await runner.cleanup()
        # Generations whose client left are billed now: the charge record stays whole.
        await self.simulator.settle_abandoned(now=True)

    async def _on_enter(self) -> None:
        await self.start()

    async def _on_exit(self) -> None:
        await self.stop()

    # --- conveniences for tests ------------------------------------------------

    @property
    def log(self) -> RequestLog:
        return self.simulator.log

    @property
    def requests(self) -> list[RequestRecord]:
        """Chat completion records, oldest first."""
        return self.simulator.log.chat()

    @property
    def balance(self) -> Decimal:
        return self.simulator.balance

    def top_up(self, amount: Decimal | int | str) -> None:
        self.simulator.top_up(amount)

    def set_balance(self, amount: Decimal | int | str) -> None:
        self.simulator.set_balance(amount)

    def add_fault(self, fault: Fault | Mapping[str, Any]) -> Fault:
        return self.simulator.add_fault(
            fault if isinstance(fault, Fault) else fault_from_mapping(fault)
        )

    def set_down(self, provider: str, down: bool = True) -> None:
        self.simulator.set_down(provider, down)

    def __repr__(self) -> str:
        state = self.url if self._runner is not None else "stopped"
        speed = "inf" if math.isinf(self.simulator.speed) else self.simulator.speed
        return f"SimulatorServer({state}, speed={speed}, seed={self.simulator.seed})"
