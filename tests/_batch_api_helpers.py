"""The Batch API route's test job on the local OpenRouter, shared by its test files."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _job_helpers import times_submitted

from provider_router import MemoryLedger
from provider_router._http.session import HttpClient
from provider_router.jobs.batch_api.api import BatchApi
from provider_router.jobs.batch_api.route import BatchRouteResult, BatchRouteRun
from provider_router.jobs.store.journal import FileJournal
from provider_router.planning.prompts import Prompt
from provider_router.testing import SimulatorServer

K3 = "moonshotai/kimi-k3"


MAX_TOKENS = 200


class Killed(BaseException):
    """A kill -9 at a chosen point (BaseException: nothing in the route catches it)."""


class FakeTime:
    """One clock for the simulator (monotonic) and the client (wall), moved by sleeps."""

    def __init__(self) -> None:
        self.t = float(int(time.time()))  # the simulator's batches carry Unix times
        self.sleeps: list[float] = []
        self.hook: Callable[[], None] | None = None

    def __call__(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds
        if self.hook is not None:
            self.hook()
        await asyncio.sleep(0)


def prompts(n: int) -> list[Prompt]:
    return [
        Prompt(
            f"p{i}",
            [{"role": "user", "content": f"question {i}"}],
            {"n": i},
            Path("in.jsonl"),
            i + 1,
            location=i,
        )
        for i in range(n)
    ]


class Job:
    def __init__(
        self,
        sim: SimulatorServer,
        directory: Path,
        ledger: MemoryLedger,
        time: FakeTime,
        http: HttpClient,
        route: Any,
    ) -> None:
        self.sim, self.directory, self.ledger, self.time = sim, directory, ledger, time
        self.http, self.route = http, route

    def run(self, api: BatchApi | None = None, **options: Any) -> BatchRouteRun:
        journal = FileJournal.open(self.directory)
        return BatchRouteRun(
            api=api or BatchApi(self.http),
            ledger=self.ledger,
            journal=journal,
            directory=self.directory,
            route=self.route,
            params={"max_tokens": MAX_TOKENS},
            clock=self.time,
            sleep=self.time.sleep,
            poll_initial=30.0,
            poll_max=600.0,
            **{"max_batch_requests": 5, **options},
        )

    async def go(
        self, items: list[Prompt], api: BatchApi | None = None, **options: Any
    ) -> BatchRouteResult:
        runner = self.run(api, **options)
        try:
            return await runner.run({"ds": items})
        finally:
            runner.journal.close()
            runner.close()

    def outputs(self) -> list[str]:
        path = self.directory / "ds.jsonl"
        if not path.exists():
            return []
        return [json.loads(line)["id"] for line in path.read_text().splitlines()]

    def output_lines(self) -> list[str]:
        return (self.directory / "ds.jsonl").read_text().splitlines()

    def submitted(self) -> Counter[str]:
        return times_submitted(self.directory, self.sim)

    async def money_agrees(self) -> None:
        self.sim.simulator.batches.settle_all()
        state = await self.ledger.snapshot()
        charged = self.sim.simulator.usage
        assert state.reserved == 0
        assert state.spent == charged, "ledger vs simulator, to the picodollar"


class PollEdits(BatchApi):
    """Edits each batch object a poll reads (list items, and a GET by id)."""

    def edit(self, batch: dict[str, Any]) -> None:
        pass

    async def list_page(self, created_after: int, after: str | None) -> dict[str, Any]:
        page = await super().list_page(created_after, after)
        for item in page["data"]:
            self.edit(item)
        return page

    async def get(self, batch_id: str, **kw: Any) -> dict[str, Any]:
        batch = await super().get(batch_id, **kw)
        self.edit(batch)
        return batch


class FailedAfterLines(PollEdits):
    """A failed batch that reports lines completed (and, with ``cost``, what they cost)."""

    cost: str | None = None

    def edit(self, batch: dict[str, Any]) -> None:
        if batch["status"] == "failed":
            batch["request_counts"] = {"total": 5, "completed": 2, "failed": 3}
            batch["usage"] = None if self.cost is None else {"cost": self.cost}


class AbsurdBill(PollEdits):
    """One line (``line``) or the batch's usage.cost (``batch``) says $1,000,000."""

    where = "line"

    async def results_page(self, batch_id: str, cursor: str | None, **kw: Any) -> dict[str, Any]:
        page = await super().results_page(batch_id, cursor, **kw)
        if self.where == "line" and page["data"]:
            page["data"][0]["response"]["body"]["usage"]["cost"] = 1_000_000
        return page

    def edit(self, batch: dict[str, Any]) -> None:
        if self.where == "batch" and batch.get("usage"):
            batch["usage"]["cost"] = 1_000_000
