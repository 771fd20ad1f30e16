"""A job that loses the node its actors run on: run in its own process by
``test_ray_node_loss.py`` (the suite's driver holds a one-node ``ray.init`` already).

``python -m tests.ray._node_loss REDIS_URL SIM_URL NAME COUNT RESULT_JSON``

A two-node ``ray.cluster_utils.Cluster``: a head (the driver, the input blocks) and a
worker offering the ``stage`` resource, where the job's actors must go. When the test
writes ``remove`` on stdin, the worker node is removed (its raylet, object store and
actors killed) and a fresh one offering ``stage`` added. If Ray gives up on the
dataset (lost blocks it cannot rebuild), the job is resumed as a user would: the same
job's ``generate`` again. Writes the last output's rows, the summary and what
happened to ``RESULT_JSON``; prints one line per event on stdout for the test.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from decimal import Decimal
from typing import Any

import psutil
import ray
from ray._private import ray_constants
from ray.cluster_utils import Cluster

from provider_router import Router
from provider_router.ledger import RedisLedger, Reservation
from provider_router.ray.job import run_sync
from tests.ledger.conftest import RedisServer
from tests.ray.conftest import KEY, make_job, prompts

STAGE_RESOURCE = "stage"
STAGE_TITLE = "MapWorker(FlatMap(PromptStage))"
UNITS_PER_USD = 10**12
"""A reservation's ``units`` are picodollars."""
ATTEMPTS = 3
FAST_HEALTH_CHECKS = {
    # The GCS marks a node dead after period × threshold without a reply: 3 s here
    # (Ray's default is 5 × 3 s), so the lost node's actors restart sooner.
    "health_check_initial_delay_ms": 1000,
    "health_check_period_ms": 1000,
    "health_check_failure_threshold": 3,
}


class _Sim:
    """What :func:`make_job` reads of the simulator: its URL (it runs in the test)."""

    def __init__(self, url: str) -> None:
        self.url = url


def say(event: str) -> None:
    print(event, flush=True)


async def _open_reservations(redis_url: str, name: str) -> list[Reservation]:
    ledger = RedisLedger(redis_url, name)
    try:
        return await ledger.open_reservations()
    finally:
        await ledger.close()


async def _generation_costs(job: Any, ids: list[str | None]) -> list[Decimal | None]:
    """What OpenRouter's /generation says each cut request cost, once the job is done
    (``None``: no generation id, or no record of it)."""
    async with Router(job.model, api_key=KEY, base_url=job.base_url) as router:
        return [await router.generation_cost(gid, attempts=1) if gid else None for gid in ids]


def replace_worker_on_request(
    cluster: Cluster, worker: Any, events: list[str], lost: dict[str, Any], job: Any
) -> None:
    """On the main thread: Ray's node start sets a SIGTERM handler.

    Every stage actor ran on the removed node: the ledger's open reservations right
    after its removal (before any new actor exists to recover them) are exactly the
    requests in flight that the loss cut."""
    line = sys.stdin.readline()
    if line.strip() != "remove":
        return
    [raylet] = worker.all_processes[ray_constants.PROCESS_TYPE_RAYLET]
    actors = [
        child
        for child in psutil.Process(raylet.process.pid).children(recursive=True)
        if STAGE_TITLE in " ".join(child.cmdline())
    ]
    lost["actors"] = len(actors)
    started = time.monotonic()
    cluster.remove_node(worker, allow_graceful=False)
    events.append(f"removed after {time.monotonic() - started:.1f}s")
    # The raylet is gone, but its workers exit only when they notice: until then they
    # keep sending. Count what the loss cut once they are all gone.
    _, alive = psutil.wait_procs(actors, timeout=60)
    events.append(f"its actors gone after {time.monotonic() - started:.1f}s ({len(alive)} left)")
    cut = run_sync(_open_reservations(job.redis_url, job.name))
    blind = [r for r in cut if r.generation_id is None]
    lost["cut"] = cut
    lost["in_flight"] = len(cut)
    lost["without_generation_id"] = len(blind)
    lost["worst_case"] = str(sum((Decimal(r.units) / UNITS_PER_USD for r in blind), Decimal(0)))
    say("removed")
    cluster.add_node(num_cpus=1, resources={STAGE_RESOURCE: 4})
    events.append(f"added after {time.monotonic() - started:.1f}s")
    say("added")


def run_job(job: Any, count: int, events: list[str], out: dict[str, Any]) -> None:
    """Consume the job's dataset; resume it (``generate`` again) if Ray gives up."""
    for attempt in range(1, ATTEMPTS + 1):
        ds = job.generate(ray.data.from_items(prompts(count), override_num_blocks=8))
        try:
            out["rows"] = ds.take_all()
            out["attempts"] = attempt
            return
        except Exception as exc:  # Ray's failure types vary by what was lost
            events.append(f"attempt {attempt} failed: {type(exc).__name__}: {exc}"[:500])
            say("resuming")


def main(redis_url: str, sim_url: str, name: str, count: int, result_path: str) -> None:
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "include_dashboard": False,
            "_system_config": FAST_HEALTH_CHECKS,
        },
    )
    worker = cluster.add_node(num_cpus=1, resources={STAGE_RESOURCE: 4})
    ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    events: list[str] = []
    job = make_job(
        _Sim(sim_url),
        RedisServer(redis_url, None),  # type: ignore[arg-type]
        name,
        concurrency=32,
        actors=2,
        resources={STAGE_RESOURCE: 1},
    )
    say("ready")
    out: dict[str, Any] = {}
    runner = threading.Thread(target=run_job, args=(job, count, events, out), daemon=True)
    runner.start()
    lost: dict[str, Any] = {}
    replace_worker_on_request(cluster, worker, events, lost, job)
    runner.join()
    if "rows" not in out:
        raise SystemExit(f"the job did not finish in {ATTEMPTS} attempts: {events}")
    rows, attempts = out["rows"], out["attempts"]
    summary = job.finish(raise_on_stop=False)
    cut = lost.pop("cut", [])
    costs = run_sync(_generation_costs(job, [r.generation_id for r in cut]))
    unknown = [r for r, cost in zip(cut, costs, strict=True) if cost is None]
    lost["held"] = str(sum((Decimal(r.units) / UNITS_PER_USD for r in cut), Decimal(0)))
    lost["unknown"] = len(unknown)
    lost["unknown_held"] = str(sum((Decimal(r.units) / UNITS_PER_USD for r in unknown), Decimal(0)))
    result = {
        "rows": [
            {k: row.get(k) for k in ("id", "status", "cost", "generation_id")} for row in rows
        ],
        "attempts": attempts,
        "events": events,
        "spent": str(summary.spent),
        "reserved": str(summary.reserved),
        "lost": lost,
        "budget": str(job.budget),
        "recovered": job.recovered,
    }
    with open(result_path, "w") as fh:
        json.dump(result, fh)
    say("done")
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    assert KEY  # the simulator in the test accepts the suite's key
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
