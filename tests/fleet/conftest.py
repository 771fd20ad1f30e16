"""Fleet fixtures: a private redis-server (the ledger tests' fixture) and small plans.

Without a ``redis-server`` binary these tests skip, saying why, except where
``PROVIDER_ROUTER_REQUIRE_REDIS`` is set (CI): there they fail.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from provider_router.batch.fleet import FleetQueue
from provider_router.plan import Plan
from tests.ledger.conftest import RedisServer, redis_server

__all__ = ["redis_server"]

_names = itertools.count(1)


def write_prompts(path: Path, count: int, *, start: int = 0) -> Path:
    """A JSONL file of ``count`` prompts with ids ``p<start>``…"""
    with path.open("w") as fh:
        for index in range(start, start + count):
            fh.write(json.dumps({"id": f"p{index}", "prompt": f"question {index}"}) + "\n")
    return path


@pytest.fixture
def fleet_name() -> str:
    return f"fleet-{os.getpid()}-{next(_names)}"


@pytest.fixture
def two_dataset_plan(tmp_path: Path) -> Plan:
    return Plan.model_validate(
        {
            "model": "moonshotai/kimi-k2.5",
            "datasets": [
                {"name": "a", "input": str(write_prompts(tmp_path / "a.jsonl", 30))},
                {"name": "b", "input": str(write_prompts(tmp_path / "b.jsonl", 20, start=100))},
            ],
        }
    )


@pytest.fixture
async def make_queue(
    redis_server: RedisServer, fleet_name: str
) -> AsyncIterator[Callable[..., FleetQueue]]:
    made: list[FleetQueue] = []

    def make(**kwargs: object) -> FleetQueue:
        kwargs.setdefault("worker", f"w{len(made)}")
        queue = FleetQueue(redis_server.url, fleet_name, **kwargs)  # type: ignore[arg-type]
        made.append(queue)
        return queue

    yield make
    for queue in made:
        await queue.close()
