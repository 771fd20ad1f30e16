"""Start-up and idle memory: ``provider-router run`` on one machine against a local Ray.

Run: ``python -m bench startup`` (``--rounds N``, default 3). Each round starts fresh
interpreters, one after the other:

1. **one machine** (the baseline): the imports ``provider-router run`` makes before
   its first request (``provider_router.cli`` and the batch runner), timed; then the
   process's PSS.
2. **Ray**: ``import ray.data`` timed, then a local ``ray.init(num_cpus=2)`` timed;
   after 5 s idle, the PSS of the process tree (the driver, GCS, raylet, idle
   workers), then ``ray.shutdown()``.

Reported: the median and range over the rounds of each figure, and Ray's against the
same run's baseline. What a whole job costs beyond this (wall time, peak memory at
2,000 in flight, actor kills) is ``python -m bench ray``. Needs the ``ray`` extra.
The machine is shared: compare figures measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

import psutil

IDLE_SETTLE = 5.0
"""Seconds a fresh local Ray is left idle before its memory is read."""


def _one_machine() -> dict[str, float]:
    start = time.perf_counter()
    import provider_router.cli.run
    import provider_router.jobs.runner  # noqa: F401

    imported = time.perf_counter() - start
    return {"import_s": imported, "pss_mib": _pss_mib()}


def _ray() -> dict[str, float]:
    start = time.perf_counter()
    import ray.data

    imported = time.perf_counter() - start
    import ray

    start = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR)
    initialised = time.perf_counter() - start
    try:
        time.sleep(IDLE_SETTLE)
        pss = _pss_mib()
    finally:
        ray.shutdown()
    return {"import_s": imported, "init_s": initialised, "pss_mib": pss}


def _pss_mib() -> float:
    """PSS of this process and everything it started (before any timed import)."""
    me = psutil.Process()
    total = 0
    for proc in (me, *me.children(recursive=True)):
        try:
            total += proc.memory_full_info().pss
        except psutil.Error:  # a worker that just exited
            continue
    return total / 2**20


CHILDREN = {"one machine": _one_machine, "ray": _ray}


def _child(kind: str) -> dict[str, float]:
    # A fresh interpreter per figure: nothing imported before the timed imports.
    # Its stderr (Ray's warnings, a traceback) goes straight to ours.
    out = subprocess.check_output(  # noqa: S603
        [sys.executable, "-m", "bench.bench_startup", "--child", kind], text=True, timeout=300
    )
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def _spread(values: list[float], unit: str, digits: int) -> str:
    return (
        f"{statistics.median(values):.{digits}f} {unit} "
        f"[{min(values):.{digits}f}–{max(values):.{digits}f}]"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench startup")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(CHILDREN[args.child]()))
        return 0
    rounds: dict[str, list[dict[str, float]]] = {kind: [] for kind in CHILDREN}
    for _ in range(args.rounds):
        for kind in CHILDREN:
            rounds[kind].append(_child(kind))
    base, ray = rounds["one machine"], rounds["ray"]
    load = os.getloadavg()
    print(
        f"# {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"load {load[0]:.1f}; {args.rounds} rounds; median [range]"
    )
    rows: list[tuple[str, Any, Any]] = [
        (
            "imports before the first request",
            _spread([r["import_s"] for r in base], "s", 2),
            _spread([r["import_s"] for r in ray], "s", 2) + " (`import ray.data`)",
        ),
        ("local cluster start (`ray.init`)", "—", _spread([r["init_s"] for r in ray], "s", 2)),
        (
            "idle PSS of the process tree",
            _spread([r["pss_mib"] for r in base], "MiB", 0),
            _spread([r["pss_mib"] for r in ray], "MiB", 0),
        ),
    ]
    print("| | one machine | Ray |\n|---|---:|---:|")
    for name, one, other in rows:
        print(f"| {name} | {one} | {other} |")
    ratio = [r["pss_mib"] / b["pss_mib"] for r, b in zip(ray, base, strict=True)]
    print(
        f"\nRay's idle memory against one machine's, per round: {statistics.median(ratio):.1f}× "
        f"[{min(ratio):.1f}–{max(ratio):.1f}]"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
