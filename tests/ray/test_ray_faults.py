"""Exactly once across a killed actor, and the key in no file Ray keeps."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import threading
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import psutil
import pytest

from provider_router import Router
from tests.ledger.conftest import RedisServer, _start_redis
from tests.ray._sim_thread import SimulatorThread
from tests.ray.conftest import CREDITS, KEY, MODEL, make_job, prompts

pytestmark = [pytest.mark.ray, pytest.mark.redis, pytest.mark.timeout(240)]

STAGE_TITLE = "MapWorker(FlatMap(PromptStage))"


def stage_actors() -> list[psutil.Process]:
    """The stage's actor processes (Ray titles each worker after its actor class)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if STAGE_TITLE in " ".join(proc.info["cmdline"] or ()):
            found.append(proc)
    return found


def _kill_one_when(sim: SimulatorThread, sent: int, done: threading.Event, log: list[int]) -> None:
    while not done.wait(0.05):
        if len(sim.server.requests) >= sent:
            actors = stage_actors()
            if actors:
                os.kill(actors[0].pid, signal.SIGKILL)
                log.append(actors[0].pid)
                return


def test_a_killed_actor_costs_at_most_its_requests_in_flight_and_no_id_twice(
    ray_session: Path, redis_server: RedisServer, slow_sim: SimulatorThread, job_name: str
) -> None:
    import ray

    count = 120
    job = make_job(slow_sim, redis_server, job_name, concurrency=16)
    done, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_one_when, args=(slow_sim, count // 3, done, killed))
    killer.start()
    try:
        ds = job.generate(ray.data.from_items(prompts(count), override_num_blocks=4))
        rows = ds.take_all()
    finally:
        done.set()
        killer.join()
    assert killed, "no stage actor was found to kill"
    ids = Counter(row["id"] for row in rows)
    assert sorted(ids) == sorted(f"p{i}" for i in range(count))
    assert set(ids.values()) == {1}
    assert {row["status"] for row in rows} == {"answered"}
    sent = len(slow_sim.server.requests)
    assert count <= sent <= count + job.per_actor  # paid twice: only what was in flight
    summary = job.finish()
    charged = slow_sim.charged(CREDITS)
    assert summary.reserved == 0
    assert summary.spent >= charged
    paid_rows = sum((Decimal(row["cost"]) for row in rows), Decimal(0))
    assert paid_rows <= charged
    # A killed request whose generation id had arrived (streaming) is settled at what
    # OpenRouter charged; one cut before its first byte is counted at its worst case.
    worst = asyncio.run(_worst_case(slow_sim.url, max_tokens=256))
    assert summary.spent - charged <= job.per_actor * worst


async def _worst_case(base_url: str, *, max_tokens: int) -> Decimal:
    async with Router(MODEL, base_url=base_url, api_key=KEY) as router:
        return router.plan.worst_case(prompt_tokens=64, max_tokens=max_tokens)


def test_the_key_is_in_no_file_ray_keeps(
    ray_session: Path,
    redis_server: RedisServer,
    sim: SimulatorThread,
    job_name: str,
) -> None:
    import ray

    job = make_job(sim, redis_server, job_name)
    rows = job.generate(ray.data.from_items(prompts(20), override_num_blocks=2)).take_all()
    assert len(rows) == 20
    job.finish()
    found, scanned = _files_holding(ray_session, KEY.encode())
    assert found == []
    assert scanned > 10  # Ray's session logs were there to look at

    # The scan would see a leak: what runtime_env env vars carry lands in Ray's files.
    control = "control-" + "9f3a" * 8

    @ray.remote(runtime_env={"env_vars": {"PROVIDER_ROUTER_CONTROL": control}})
    def read_env() -> str:
        return os.environ["PROVIDER_ROUTER_CONTROL"]

    assert ray.get(read_env.remote(), timeout=120) == control
    leaked, _ = _files_holding(ray_session, control.encode())
    assert leaked, "runtime_env env vars were expected in Ray's session files"


def _files_holding(root: Path, needle: bytes) -> tuple[list[Path], int]:
    found, scanned = [], 0
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                data = path.read_bytes()
            except OSError:
                continue
            scanned += 1
            if needle in data:
                found.append(path)
    return found, scanned


@pytest.fixture
def redis_with_password() -> Any:
    """A redis-server of its own that asks for :data:`REDIS_PASSWORD`."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server not found on PATH (apt-get install redis-server)")
    server = _start_redis(binary, None, "--appendonly", "no", "--requirepass", REDIS_PASSWORD)
    try:
        yield server
    finally:
        server.process.terminate()
        server.process.wait(timeout=10)


REDIS_PASSWORD = "redis-" + "Pw7q" * 8
"""A Redis password the suite looks for in every file Ray keeps."""


def test_the_redis_password_is_in_no_task_spec_nor_any_file_ray_keeps(
    ray_session: Path, redis_with_password: Any, sim: SimulatorThread, job_name: str
) -> None:
    import dataclasses
    import pickle

    import ray

    port = redis_with_password.url.rsplit(":", 1)[1].split("/")[0]
    url = f"redis://:{REDIS_PASSWORD}@127.0.0.1:{port}/0"
    server = RedisServer(url, redis_with_password.process)
    job = make_job(sim, server, job_name)
    out = job.generate(ray.data.from_items(prompts(12), override_num_blocks=2))
    [config] = out._logical_plan.dag.fn_constructor_args
    # What Ray pickles into the task spec, and what its metadata exporter writes.
    assert REDIS_PASSWORD.encode() not in pickle.dumps(config)
    assert REDIS_PASSWORD not in str(dataclasses.asdict(config))
    rows = out.take_all()
    assert {row["status"] for row in rows} == {"answered"}
    assert job.finish().spent > 0
    found, scanned = _files_holding(ray_session, REDIS_PASSWORD.encode())
    assert found == []
    assert scanned > 10
