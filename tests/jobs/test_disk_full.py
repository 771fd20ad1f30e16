"""A full disk mid-run: one clear line, a resumable job, and no money lost (issue #10)."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import sys
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path

from _job_helpers import ledger_spent, read_records, write_prompts

from provider_router.cli._errors import EXIT_IO
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

Factory = Callable[..., Awaitable[SimulatorServer]]


def _files_stop_growing_at(limit: int) -> Callable[[], None]:
    def apply() -> None:  # in the child, before exec: every write past `limit` fails
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


async def _run(
    prompts: Path,
    out: Path,
    sim: SimulatorServer,
    limit: int | None = None,
    *,
    max_tokens: int = 500,
    preflight: bool = False,
) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "provider_router", "--log-level", "error", "run",
        str(prompts), "--out", str(out), "--model", "moonshotai/kimi-k2.5",
        "--budget", "5", "--max-tokens", str(max_tokens), "--concurrency", "20",
        "--base-url", sim.url, "--progress", "off",
        # The preflight's two ledger commits make the ledger's file the first to fill
        # (its WAL grows by pages); without them the outputs and the journal fill first.
        *([] if preflight else ["--no-preflight"]),
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


async def test_a_full_disk_under_the_ledger_stops_the_run_the_same_way(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    # The ledger's WAL is the first file to reach the limit (short answers keep the
    # outputs well below it): reserves fail before sending, settles after paying.
    sim = await openrouter_sim_factory(speed=400, seed=9)
    prompts = write_prompts(tmp_path / "p.jsonl", 120)
    out = tmp_path / "out"
    code, stderr = await _run(prompts, out, sim, limit=100_000, max_tokens=60, preflight=True)
    assert code == EXIT_IO, stderr
    assert "Traceback" not in stderr
    assert "unexpected_error" not in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("provider-router: error:")]
    assert len(errors) == 1, stderr
    assert str(out / "ledger.sqlite") in errors[0]
    assert "the disk is full" in errors[0]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reason"] == "error"
    assert "cannot write the ledger" in summary["message"]
    kept = {r["id"]: r["generation_id"] for r in read_records(out / "p.jsonl")}
    assert kept  # some answers landed before the ledger filled
    code, stderr = await _run(prompts, out, sim, max_tokens=60)  # space again: resume
    assert code == 0, stderr
    records = read_records(out / "p.jsonl")
    ids = [r["id"] for r in records]
    assert sorted(ids) == sorted(f"q{n}" for n in range(120))  # each once: none sent twice
    assert all({r["id"]: r["generation_id"] for r in records}[k] == g for k, g in kept.items())
    # The held reservations were settled at their real cost: the ledger is exact.
    assert ledger_spent(out) == sim.simulator.usage > Decimal(0)
