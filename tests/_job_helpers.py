"""Helpers for the batch tests: prompt files, output reading, ledger audits."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
from collections import Counter
from collections.abc import Iterable
from decimal import Decimal
from pathlib import Path
from typing import Any

from provider_router._money import from_units
from provider_router.jobs.batch_api.journal import BatchJournal
from provider_router.jobs.runner import JobRunner
from provider_router.jobs.store.journal import FileJournal
from provider_router.planning.plan import Plan
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer


def write_prompts(path: Path, count: int, *, prefix: str = "q", extra: Iterable[str] = ()) -> Path:
    """``count`` prompt lines with ids ``<prefix><n>``, then any ``extra`` raw lines."""
    with path.open("w") as fh:
        for n in range(count):
            fh.write(json.dumps({"id": f"{prefix}{n}", "prompt": f"question {n}", "n": n}) + "\n")
        for line in extra:
            fh.write(line + "\n")
    return path


def simulate_crash(j: FileJournal) -> None:
    """Let go of the files as a killed process would: no release of claims, no stop line."""
    for fh in (j._fh, *(o.fh for o in j._outputs.values())):
        if fh is not None:
            fh.close()
    j._fh = None
    j._closed = True
    j._release_lock()


def read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def ledger_rows(directory: Path) -> list[dict[str, Any]]:
    con = sqlite3.connect(directory / "ledger.sqlite")
    con.row_factory = sqlite3.Row
    try:
        return [dict(row) for row in con.execute("SELECT * FROM reservations")]
    finally:
        con.close()


def ledger_spent(directory: Path) -> Decimal:
    con = sqlite3.connect(directory / "ledger.sqlite")
    try:
        (units,) = con.execute("SELECT spent FROM totals").fetchone()
    finally:
        con.close()
    return from_units(units)


def assert_consistent(directory: Path, datasets: Iterable[str]) -> list[dict[str, Any]]:
    """Outputs hold each id once, and every output is a settled ledger row at its cost."""
    rows = ledger_rows(directory)
    by_generation = {row["generation_id"]: row for row in rows if row["state"] == "settled"}
    records: list[dict[str, Any]] = []
    for ds in datasets:
        found = read_records(directory / f"{ds}.jsonl")
        ids = [r["id"] for r in found]
        assert len(ids) == len(set(ids)), f"an id appears twice in {ds}"
        for record in found:
            row = by_generation[record["generation_id"]]
            assert row["key"] == f"{ds}/{record['id']}"
            assert from_units(row["cost"]) == Decimal(record["cost"])
        records += found
    assert not [r for r in rows if r["state"] == "open"], "open reservations left"
    spent = sum((from_units(r["cost"] or 0) for r in rows), Decimal(0))
    assert spent == ledger_spent(directory), (spent, ledger_spent(directory))
    return records


async def run_cli(*argv: str, key: str | None = DEFAULT_TEST_KEY) -> tuple[int, str, str]:
    """``python -m provider_router ARGV``: (exit code, stdout, stderr)."""
    env = {k: v for k, v in os.environ.items() if k != "OPENROUTER_API_KEY"}
    if key is not None:
        env["OPENROUTER_API_KEY"] = key
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "provider_router",
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def times_submitted(directory: Path, sim: SimulatorServer) -> Counter[str]:
    """How many batches each prompt went out in, over every batch the simulator took
    (the batch route's journal maps each ``custom_id`` back to its prompt)."""
    with BatchJournal.open(directory) as journal:
        intents = {i.intent: i for i in journal}
    seen: Counter[str] = Counter()
    for batch in sim.simulator.batches:
        for custom_id, _ in batch.submission.requests:
            pid = intents[custom_id.rpartition("-")[0]].prompt_for(custom_id)
            assert pid is not None
            seen[pid] += 1
    return seen


async def spawn_cli(*argv: str, stderr: int | None = asyncio.subprocess.DEVNULL) -> Any:
    """``python -m provider_router ARGV`` started with the test key (a Process)."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "provider_router", *argv,
        stdout=asyncio.subprocess.DEVNULL, stderr=stderr,
        env={**os.environ, "OPENROUTER_API_KEY": DEFAULT_TEST_KEY},
    )  # fmt: skip


def small_plan(
    tmp_path: Path,
    *,
    requests: int | None = 6,
    prompts: int = 12,
    model: str = "moonshotai/kimi-k2.5",
    route: str = "sync",
) -> Plan:
    """One dataset ``p`` of ``prompts`` prompts (``requests`` of them sent), budget $10."""
    path = write_prompts(tmp_path / "p.jsonl", prompts)
    dataset: dict[str, object] = {"name": "p", "input": str(path), "route": route}
    if requests is not None:
        dataset["max_requests"] = requests
    return Plan.model_validate(
        {
            "model": model,
            "budget": "10",
            "concurrency": 4,
            "policy": {"exclude_below": "int4"},
            "generation": {"max_tokens": 200},
            "datasets": [dataset],
        }
    )


def runner(plan: Plan, out: Path, sim: SimulatorServer) -> JobRunner:
    """A runner of ``plan`` into ``out`` against the local OpenRouter ``sim``."""
    return JobRunner(plan, out, base_url=sim.url, api_key=DEFAULT_TEST_KEY)
