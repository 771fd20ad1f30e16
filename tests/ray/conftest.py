"""The Ray suite: one local cluster for the whole session, a real redis-server, the
local OpenRouter on a thread the actors reach on 127.0.0.1.

Without Ray (the ``ray`` extra) these tests skip, saying why, except where
``PROVIDER_ROUTER_REQUIRE_RAY`` is set (CI): there a missing Ray is a failure.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.ledger.conftest import RedisServer, redis_server
from tests.ray._sim_thread import SimulatorThread

__all__ = ["redis_server"]

REQUIRE_RAY_ENV = "PROVIDER_ROUTER_REQUIRE_RAY"
KEY = "sk-or-v1-" + "5eC12e7" * 9
"""A key shaped like OpenRouter's: the suite looks for it in every file Ray keeps."""
CREDITS = Decimal(100)
MODEL = "moonshotai/kimi-k2.5"
_names = itertools.count(1)
_RECORD_FACTORY = logging.getLogRecordFactory()
"""The process's log record factory before Ray's: importing Ray replaces it with one
that adds ``_ray_timestamp_ns`` to every record, which later tests would see."""


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Path]:
    """``ray.init(num_cpus=2)`` once per session; yields Ray's session directory."""
    try:
        import ray
    except ImportError:
        reason = "Ray not installed (pip install -e '.[ray]')"
        if os.environ.get(REQUIRE_RAY_ENV):
            pytest.fail(f"{reason}, and {REQUIRE_RAY_ENV} is set: Ray tests must run")
        pytest.skip(f"Ray tests skipped: {reason}")
    # A short root: Ray's Unix sockets live under it (107-byte path limit).
    root = tempfile.mkdtemp(prefix="prr-", dir="/tmp")
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _temp_dir=root,
        logging_level="WARNING",
        log_to_driver=False,
    )
    logging.setLogRecordFactory(_RECORD_FACTORY)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    try:
        yield Path(root)
    finally:
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def sim() -> Iterator[SimulatorThread]:
    """The local OpenRouter (no waiting), accepting :data:`KEY`, with $100 of credits."""
    server = SimulatorThread(api_keys=[KEY], speed=math.inf, credits=CREDITS)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def slow_sim() -> Iterator[SimulatorThread]:
    """The local OpenRouter with answers taking about a second (speed 20 of realistic
    latency): a job is still mid-way when a test cuts it."""
    server = SimulatorThread(api_keys=[KEY], speed=20, credits=CREDITS)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def job_name() -> str:
    return f"ray-{os.getpid()}-{next(_names)}"


def prompts(count: int, *, start: int = 0) -> list[dict[str, Any]]:
    return [{"id": f"p{i}", "prompt": f"question {i}"} for i in range(start, start + count)]


def make_job(
    sim: SimulatorThread, redis: RedisServer, name: str, budget: str = "5", **kwargs: Any
) -> Any:
    from provider_router.ray import RayJob

    options: dict[str, Any] = {
        "max_tokens": 256,
        "concurrency": 64,
        "actors": 2,
        "recover_interval": 0.5,
        "lease": 2.0,
        **kwargs,
    }
    options.setdefault("api_key", KEY)
    return RayJob(MODEL, budget=budget, redis_url=redis.url, name=name, base_url=sim.url, **options)
