"""Exactly once, within the budget, across the loss of the node the stage runs on."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest

from tests._polling import wait_until
from tests.ledger.conftest import RedisServer
from tests.ray._sim_thread import SimulatorThread
from tests.ray.conftest import CREDITS, KEY

pytestmark = [pytest.mark.ray, pytest.mark.redis, pytest.mark.timeout(200)]

COUNT = 160
SCRIPT_TIMEOUT = 180.0
EVENTS = {"ready", "removed", "added", "resuming", "done"}
REPO = Path(__file__).resolve().parents[2]


def _remove_when(
    sim: SimulatorThread, proc: subprocess.Popen[str], sent: int, log: list[str]
) -> None:
    """Tell the script to remove its worker node once ``sent`` requests reached the
    simulator; record what the script says."""
    assert proc.stdout is not None
    assert proc.stdin is not None
    asked = False
    for line in proc.stdout:  # the script's events, and Ray's own lines (ignored)
        if line.strip() in EVENTS:
            log.append(line.strip())
        if line.strip() == "ready" and not asked:
            wait_until(lambda: len(sim.server.requests) >= sent, SCRIPT_TIMEOUT)
            log.append(f"asked to remove at {len(sim.server.requests)} requests")
            proc.stdin.write("remove\n")
            proc.stdin.flush()
            asked = True


def test_a_lost_node_keeps_each_id_once_within_the_budget_and_every_paid_answer(
    redis_server: RedisServer, slow_sim: SimulatorThread, tmp_path: Path
) -> None:
    pytest.importorskip("ray")
    result_path = tmp_path / "result.json"
    # Ray's address file and sockets go to a short private root, so no other Ray on
    # the machine finds this cluster (ray.init() connects to the last one started).
    ray_root = tempfile.mkdtemp(prefix="prn-", dir="/tmp")
    env = {**os.environ, "RAY_TMPDIR": ray_root, "PYTHONPATH": str(REPO)}
    stderr_path = tmp_path / "stderr.txt"
    stderr_file = stderr_path.open("w")
    proc = subprocess.Popen(  # noqa: S603 - our own script and arguments
        [
            sys.executable,
            "-m",
            "tests.ray._node_loss",
            redis_server.url,
            slow_sim.url,
            f"node-loss-{os.getpid()}",
            str(COUNT),
            str(result_path),
        ],
        cwd=REPO,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr_file,
        text=True,
    )
    log: list[str] = []
    reader = threading.Thread(target=_remove_when, args=(slow_sim, proc, COUNT // 3, log))
    reader.start()
    try:
        proc.wait(timeout=SCRIPT_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"script timed out: {log}\n{stderr_path.read_text()[-4000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()  # its Ray processes go with it (Cluster's reaper)
            proc.wait(timeout=30)
        reader.join(timeout=30)
        for pipe in (proc.stdin, proc.stdout, stderr_file):
            if pipe is not None:
                pipe.close()
        shutil.rmtree(ray_root, ignore_errors=True)
    stderr = stderr_path.read_text()
    assert proc.returncode == 0, f"script failed ({proc.returncode}): {log}\n{stderr[-4000:]}"
    assert "removed" in log, log
    assert "added" in log, log
    result = json.loads(result_path.read_text())
    rows = result["rows"]
    print("node loss:", log, {k: v for k, v in result.items() if k != "rows"})

    ids = Counter(row["id"] for row in rows)
    assert sorted(ids) == sorted(f"p{i}" for i in range(COUNT))
    assert set(ids.values()) == {1}
    assert {row["status"] for row in rows} == {"answered"}
    charged = slow_sim.charged(CREDITS)
    spent, budget = Decimal(result["spent"]), Decimal(result["budget"])
    assert Decimal(result["reserved"]) == 0
    assert charged <= spent <= budget
    # The requests the loss cut are settled at OpenRouter's charge wherever their
    # generation id reconciles (/generation has it); only the others are counted at
    # their worst case. Paid twice: at most those in flight.
    lost = result["lost"]
    # Only the lost node offered the stage's resource: it held every actor running.
    assert lost["actors"] >= 1, "no stage actor ran on the lost node"
    assert lost["in_flight"] > 0, "the node was lost with no request in flight"
    assert lost["unknown"] == lost["without_generation_id"]  # every id reconciles
    assert spent - charged <= Decimal(lost["unknown_held"])
    if lost["unknown"] == 0:
        assert spent == charged
    chats = [record for record in slow_sim.server.requests if record.route == "chat"]
    served = [record for record in chats if record.generation_id is not None]
    outcomes = Counter((record.status, record.outcome) for record in chats)
    assert COUNT <= len(served) <= COUNT + lost["in_flight"], outcomes
    # No paid answer lost: every row carries a generation the simulator served.
    known = slow_sim.server.simulator.generations
    assert all(known.get(row["generation_id"]) is not None for row in rows)
    paid_rows = sum((Decimal(row["cost"]) for row in rows), Decimal(0))
    assert paid_rows <= charged


@pytest.mark.parametrize(
    ("resources", "match"),
    [
        ({"stage": 0}, r"resources\['stage'\] must be a number > 0, got 0"),
        ({"stage": -1.5}, r"resources\['stage'\] must be a number > 0, got -1.5"),
        ({"stage": "1"}, r"resources\['stage'\] must be a number > 0, got '1'"),
        ({"stage": True}, r"resources\['stage'\] must be a number > 0, got True"),
    ],
)
def test_resources_must_be_positive_numbers(resources: dict[str, object], match: str) -> None:
    pytest.importorskip("ray")
    from provider_router import ConfigurationError
    from provider_router.ray import RayJob

    def job(resources: dict[str, object]) -> RayJob:
        return RayJob(
            "moonshotai/kimi-k2.5",
            budget="1",
            redis_url="redis://127.0.0.1:1/0",
            name="resources",
            api_key=KEY,
            base_url="http://127.0.0.1:1/api/v1",
            resources=resources,  # type: ignore[arg-type]
        )

    with pytest.raises(ConfigurationError, match=match):
        job(resources)
    assert job({"stage": 0.5}).resources == {"stage": 0.5}
