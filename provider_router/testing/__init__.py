"""The local OpenRouter: a faithful simulator for demos, tests and benchmarks.

A real aiohttp server speaking OpenRouter's API (models, endpoints, providers,
chat completions as JSON and SSE, generation, key, credits) over a market loaded
from a data file, with OpenRouter's routing, exact billing, 402s, and seeded,
scheduled faults. It imports nothing from the client side of the package, so a
bug cannot hide in both. See docs/simulator.md.

    from provider_router.testing import SimulatorServer

    async with SimulatorServer(speed=1000, seed=7) as sim:
        ...  # point any OpenAI-compatible client at sim.url
"""

from __future__ import annotations

from provider_router.testing.billing import Cost, compute_cost
from provider_router.testing.chat.delivery import COMPLETION_TOKENS_HEADER
from provider_router.testing.faults import FAULT_KINDS, Fault, fault_from_mapping, load_faults
from provider_router.testing.introspection import RequestLog, RequestRecord
from provider_router.testing.market.listing import EndpointSpec, Market, ModelSpec, ProviderSpec
from provider_router.testing.server import DEFAULT_TEST_KEY, SimulatorServer
from provider_router.testing.simulator import Simulator

__all__ = [
    "COMPLETION_TOKENS_HEADER",
    "Cost",
    "DEFAULT_TEST_KEY",
    "EndpointSpec",
    "FAULT_KINDS",
    "Fault",
    "Market",
    "ModelSpec",
    "ProviderSpec",
    "RequestLog",
    "RequestRecord",
    "Simulator",
    "SimulatorServer",
    "compute_cost",
    "fault_from_mapping",
    "load_faults",
]
