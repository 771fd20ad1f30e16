"""Ray benchmark: ``run --ray`` against ``run`` on one machine, and a kill -9 campaign.

Run: ``python -m bench ray`` (``--prompts 500 --concurrency 500`` for a reduced run,
``--skip-speed`` or ``--skip-kills`` for one half). Needs the ``ray`` extra and a
``redis-server`` binary.

1. **Wall time and memory.** The local OpenRouter runs in its own process at speed 1
   (realistic latency: answers of the default market's lengths take seconds to a
   minute). The same one-dataset plan (``--prompts`` prompts, ``--concurrency`` in
   flight) runs as ``provider-router run`` (the baseline) and as
   ``provider-router run --ray --ledger redis://...`` on a local Ray cluster, each a
   command in its own process, one after the other. Reported: the command's wall
   time (Ray's includes starting the local cluster), the job's own wall time
   (``summary.json``), the ratio against the baseline, and the peak PSS of the
   command's whole process tree (Ray's: the driver, GCS, raylet and workers).
2. **Start-up.** The same two commands on ``--startup-prompts`` prompts answered at
   once (the simulator at infinite speed), ``--startup-rounds`` times each: their wall
   time is what each way costs before and after the work (Ray's: ``import ray.data``,
   the local cluster, the actor pool, the shutdown).
3. **Kill -9 campaign.** A :class:`~provider_router.ray.RayJob` (4 actors) on a local cluster
   (``num_cpus=2``) answers ``--prompts`` prompts while a thread SIGKILLs one stage
   actor every few seconds, ``--kills`` times. At each kill the killed actor's open
   reservations in the job's ledger are counted (their owner names the actor's pid;
   nothing settles them until recovery, a lease later): those are exactly its
   requests in flight when it died. Reported: ids duplicated and missing in the
   output, requests paid twice (generations the simulator served beyond one per
   prompt) against the sum of those in-flight counts, and the ledger against what the
   simulator charged.

The machine is shared: compare ratios measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import psutil

from bench.bench_client import KEY, MODEL, Sim
from bench.bench_ledger import _start_redis

STAGE_TITLE = "MapWorker(FlatMap(PromptStage))"
MAX_TOKENS = 4096


def _write_prompts(path: Path, count: int) -> Path:
    with path.open("w") as fh:
        for i in range(count):
            fh.write(json.dumps({"id": f"p{i}", "prompt": f"Write about routing, case {i}."}))
            fh.write("\n")
    return path


def _tree_pss(pid: int) -> int:
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for proc in procs:
        try:
            total += proc.memory_full_info().pss
        except psutil.Error:
            continue
    return total


def _command(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run a command; its wall time and the peak PSS of its process tree (sampled 1/s)."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # noqa: S603
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _tree_pss(proc.pid))
        time.sleep(1.0)
    assert proc.stderr is not None
    err = proc.stderr.read().decode(errors="replace")
    return {
        "wall_s": time.monotonic() - start,
        "peak_pss_mib": peak / 2**20,
        "code": proc.returncode,
        "stderr": err,
    }


def _both_ways(
    prompts: int, concurrency: int, redis_url: str, sim_speed: float, work: Path
) -> dict[str, dict[str, Any]]:
    """``run`` then ``run --ray`` on the same prompts, each a command of its own."""
    sim = Sim(speed=sim_speed, completion_tokens=None)
    binary = str(Path(sys.executable).with_name("provider-router"))
    env = {**os.environ, "OPENROUTER_API_KEY": KEY}
    try:
        source = _write_prompts(work / "prompts.jsonl", prompts)
        common = [
            binary, "run", str(source), "--model", MODEL, "--budget", "1000",
            "--concurrency", str(concurrency), "--max-tokens", str(MAX_TOKENS),
            "--base-url", sim.url, "--no-preflight", "--progress", "off",
        ]  # fmt: skip
        results = {}
        name_ray = f"bench-ray-{time.time_ns()}"
        for name, out_dir, extra in (
            ("run", work / f"one-{time.time_ns()}", []),
            (
                "run --ray",
                work / f"ray-{time.time_ns()}",
                ["--ray", "--ledger", redis_url, "--ledger-name", name_ray],
            ),
        ):
            out = _command([*common, "--out", str(out_dir), *extra], env)
            if not (out_dir / "summary.json").is_file():
                raise RuntimeError(
                    f"{name}: exit {out['code']}, no summary\n{out['stderr'][-4000:]}"
                )
            summary = json.loads((out_dir / "summary.json").read_text())
            out["job_wall_s"] = summary["wall_time_s"]
            out["completed"] = sum(d["completed"] for d in summary["datasets"].values())
            results[name] = out
            if out["code"] != 0:
                print(f"{name}: exit {out['code']}\n{out['stderr'][-2000:]}", file=sys.stderr)
    finally:
        sim.stop()
    return results


def startup(prompts: int, rounds: int, redis_url: str) -> None:
    walls: dict[str, list[float]] = {"run": [], "run --ray": []}
    peaks: dict[str, list[float]] = {"run": [], "run --ray": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(rounds):
            results = _both_ways(prompts, prompts, redis_url, float("inf"), Path(tmp))
            for name, r in results.items():
                walls[name].append(r["wall_s"])
                peaks[name].append(r["peak_pss_mib"])
    print(f"\nstart-up: {prompts} prompts answered at once, {rounds} rounds (median)")
    print(f"{'command':<10} {'wall s':>8} {'peak PSS MiB':>13}  all rounds (s)")
    for name in walls:
        rounded = ", ".join(f"{w:.1f}" for w in walls[name])
        print(
            f"{name:<10} {statistics.median(walls[name]):8.1f} "
            f"{statistics.median(peaks[name]):13.0f}  {rounded}"
        )


def speed(prompts: int, concurrency: int, redis_url: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        results = _both_ways(prompts, concurrency, redis_url, 1.0, Path(tmp))
    base = results["run"]["wall_s"]
    print(f"\n{prompts} prompts, {concurrency} in flight, speed 1, max_tokens {MAX_TOKENS}")
    print(f"{'command':<10} {'wall s':>8} {'job s':>8} {'ratio':>6} {'peak PSS MiB':>13} done")
    for name, r in results.items():
        print(
            f"{name:<10} {r['wall_s']:8.1f} {r['job_wall_s']:8.1f} {r['wall_s'] / base:6.2f} "
            f"{r['peak_pss_mib']:13.0f} {r['completed']}"
        )


async def _held_by(redis_url: str, name: str, pid: int) -> int:
    """Open reservations of the actor ``pid`` in the job's ledger (owner ``host:pid:...``)."""
    from provider_router.ledger import RedisLedger

    ledger = RedisLedger(redis_url, name)
    try:
        found = await ledger.open_reservations()
    finally:
        await ledger.close()
    return sum(1 for r in found if (r.owner or "").split(":")[1:2] == [str(pid)])


def _stage_pids() -> list[int]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if STAGE_TITLE in " ".join(proc.info["cmdline"] or ()):
            found.append(proc.pid)
    return found


def kills(prompts: int, concurrency: int, count: int, interval: float, redis_url: str) -> None:
    import ray

    sys.path.insert(0, str(Path(__file__).parent.parent))
    from provider_router.ray import RayJob
    from tests.ray._sim_thread import SimulatorThread

    credits = Decimal(10**4)
    sim = SimulatorThread(api_keys=[KEY], speed=1.0, credits=credits)
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    name = f"bench-kill-{time.time_ns()}"
    killed: list[tuple[int, int]] = []
    """(pid, its requests in flight when it died) per kill."""
    done = threading.Event()

    def killer() -> None:
        while len(killed) < count and not done.wait(interval):
            pids = _stage_pids()
            if pids:
                pid = pids[len(killed) % len(pids)]
                os.kill(pid, signal.SIGKILL)
                killed.append((pid, asyncio.run(_held_by(redis_url, name, pid))))

    try:
        job = RayJob(
            MODEL, budget="1000", redis_url=redis_url, name=name,
            api_key=KEY, base_url=sim.url, max_tokens=MAX_TOKENS, concurrency=concurrency,
            actors=4, lease=10.0, recover_interval=5.0,
        )  # fmt: skip
        rows_in = [
            {"id": f"p{i}", "prompt": f"Write about routing, case {i}."} for i in range(prompts)
        ]
        thread = threading.Thread(target=killer, daemon=True)
        start = time.monotonic()
        thread.start()
        ds = job.generate(ray.data.from_items(rows_in, override_num_blocks=job.blocks))
        rows = ds.take_all()
        wall = time.monotonic() - start
        done.set()
        thread.join()
        summary = job.finish(raise_on_stop=False)
        charged = sim.charged(credits)
        generations = sum(1 for r in sim.server.requests if r.generation_id)
    finally:
        ray.shutdown()
        sim.stop()
    ids = Counter(r["id"] for r in rows)
    statuses = Counter(r["status"] for r in rows)
    dup = sum(n - 1 for n in ids.values() if n > 1)
    missing = prompts - len(ids)
    answered = statuses.get("answered", 0)
    paid_twice = generations - answered
    bound = sum(held for _, held in killed)
    print(f"\nkill -9 campaign: {prompts} prompts, {concurrency} in flight, {len(killed)} kills")
    print(f"wall {wall:.1f} s; statuses {dict(statuses)}")
    print(f"duplicated ids {dup}, missing ids {missing}")
    print(f"in flight in the killed actor at each kill: {[held for _, held in killed]}")
    verdict = "ok" if paid_twice <= bound else "EXCEEDED"
    print(
        f"generations served {generations} for {answered} answered prompts: paid twice "
        f"{paid_twice}, bound (sum of the in-flight counts at the kills) {bound}: {verdict}"
    )
    print(
        f"ledger ${summary.spent} vs simulator ${charged}: difference ${summary.spent - charged} "
        f"(reserved left ${summary.reserved}); recovered: {summary.recovered}"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench ray")
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=2000)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--kill-interval", type=float, default=6.0)
    parser.add_argument("--startup-prompts", type=int, default=20)
    parser.add_argument("--startup-rounds", type=int, default=3)
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--skip-startup", action="store_true")
    parser.add_argument("--skip-kills", action="store_true")
    args = parser.parse_args(argv)
    cpus, python = os.cpu_count(), platform.python_version()
    print(f"machine: {platform.machine()}, {cpus} CPUs (shared), Python {python}")
    proc, redis_url = _start_redis()
    if proc is None or redis_url is None:
        return 1
    try:
        if not args.skip_speed:
            speed(args.prompts, args.concurrency, redis_url)
        if not args.skip_startup:
            startup(args.startup_prompts, args.startup_rounds, redis_url)
        if not args.skip_kills:
            kills(args.prompts, args.concurrency, args.kills, args.kill_interval, redis_url)
    finally:
        proc.terminate()
        proc.wait(10)
    return 0
