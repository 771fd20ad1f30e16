"""Several processes share one ledger; a killed process's money is recovered."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import pytest

from provider_router import Reservation
from tests.ledger.conftest import Backend

D = Decimal
WORKER = Path(__file__).with_name("ledger_worker.py")
ROOT = Path(__file__).parents[2]

shared = pytest.mark.parametrize(
    "backend_name", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)], indirect=True
)


def _target(backend: Backend) -> tuple[str, str]:
    ledger = backend._opened[0]
    if backend.name == "redis":
        return ledger._url, ledger.name  # type: ignore[attr-defined]
    return str(ledger.path), "-"  # type: ignore[attr-defined]


def _spawn(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(  # noqa: S603 - our own worker script
        [sys.executable, str(WORKER), *args], stdout=subprocess.PIPE, text=True, env=env
    )


@pytest.mark.slow
@shared
async def test_four_processes_never_together_pass_the_limit(backend: Backend) -> None:
    ledger = backend.make(D("1.5"))
    await ledger.snapshot()  # creates the store before the workers open it
    target, name = _target(backend)
    workers = [_spawn("spend", backend.name, target, name, str(seed)) for seed in range(4)]
    outputs = [w.communicate(timeout=60)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0, 0, 0]
    settled = sum(D(out.strip()) for out in outputs)
    state = await ledger.snapshot()
    assert state.spent == settled
    assert state.spent <= D("1.5")
    assert (state.reserved, state.open) == (0, 0)
    # Workers stop only when even settling everything could not fit a request,
    # so at most one largest reservation ($0.05) is left unused.
    assert state.spent > D("1.5") - D("0.05")


@shared
async def test_a_killed_process_is_recovered_exactly_once(backend: Backend) -> None:
    ledger = backend.make(D("10"))
    await ledger.snapshot()
    target, name = _target(backend)
    worker = _spawn("hold", backend.name, target, name)
    assert worker.stdout is not None
    assert worker.stdout.readline().strip() == "ready"
    worker.send_signal(signal.SIGKILL)
    worker.communicate(timeout=10)  # reaps it, so its pid is really gone

    state = await ledger.snapshot()
    assert (state.reserved, state.open) == (6, 3)

    async def resolve(res: Reservation) -> Decimal | None:
        return D("0.25") if res.generation_id == "gen-first" else None

    if backend.name == "redis":  # another host cannot see the pid: wait out the lease
        recoverer = backend.make(None, clock=lambda: time.time() + 61)
    else:  # same host: a dead pid frees its reservations at once
        recoverer = backend.make(None)
    report = await recoverer.recover(resolve)
    assert (report.reconciled_cost, report.worst_case_cost) == (D("0.25"), D("5"))
    assert (await recoverer.recover(resolve)).worst_case == ()
    state = await ledger.snapshot()
    assert (state.spent, state.reserved, state.open, state.recovered) == (D("5.25"), 0, 0, 3)
