"""A full disk mid-run: one clear line, a resumable job, and no money lost (issue #10)."""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import sys
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path

from _batch_helpers import ledger_spent, read_records, write_prompts

from provider_router.cli._errors import EXIT_IO
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

Factory = Callable[..., Awaitable[SimulatorServer]]


def _files_stop_growing_at(limit: int) -> Callable[[], None]:
    def apply() -> None:  # in the child, before exec: every write past `limit` fails
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


async def _run(
    prompts: Path, out: Path, sim: SimulatorServer, limit: int | None = None
) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "provider_router", "--log-level", "error", "run",
        str(prompts), "--out", str(out), "--model", "moonshotai/kimi-k2.5",
        "--budget", "5", "--max-tokens", "500", "--concurrency", "20",
        "--base-url", sim.url, "--progress", "off",
        # The preflight's two ledger commits would make the ledger's file the first to
        # fill; this test is about the outputs and the journal filling.
        "--no-preflight",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "OPENROUTER_API_KEY": DEFAULT_TEST_KEY},
        preexec_fn=None if limit is None else _files_stop_growing_at(limit),
    )  # fmt: skip
    _, stderr = await proc.communicate()
    return proc.returncode or 0, stderr.decode()


async def test_a_full_disk_stops_the_run_with_one_line_and_loses_nothing(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(speed=400, seed=9)
    prompts = write_prompts(tmp_path / "p.jsonl", 120)
    out = tmp_path / "out"
    code, stderr = await _run(prompts, out, sim, limit=48_000)
    assert code == EXIT_IO, stderr
    assert "Traceback" not in stderr
    assert "File too large" in stderr
    assert str(out) in stderr
    code, stderr = await _run(prompts, out, sim)  # space again: the same command resumes
    assert code == 0, stderr
    ids = [r["id"] for r in read_records(out / "p.jsonl")]
    assert sorted(ids) == sorted(f"q{n}" for n in range(120))
    # Every charge is in the ledger (answers lost with the disk were paid and sent again).
    assert ledger_spent(out) >= sim.simulator.usage > Decimal(0)
