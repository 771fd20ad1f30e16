"""A minimal fleet worker for the multi-process tests (run as a script).

``fleet_worker.py CONFIG.json``: join the fleet, send every claimed prompt through
a :class:`Router` with the shared Redis ledger, write results to this worker's
own journal, and acknowledge them to the fleet once journaled; stop when the
budget is spent or the plan is done, then print one JSON line of counts.

It stands in for ``provider-router run --workers-share`` (the batch runner) and
uses exactly the seam that runner plugs into: :class:`FleetSource` as the work
source and its :class:`FleetJournal` as the journal.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import structlog

from provider_router import BudgetExhausted, CreditsExhausted, ProviderPolicy, RedisLedger, Router
from provider_router._money import to_units
from provider_router.batch.fleet import FleetQueue, WorkItem
from provider_router.batch.fleet_source import FleetSource
from provider_router.batch.journal import FileJournal
from provider_router.batch.output import encode_record, make_record
from provider_router.batch.plan import load_plan


async def run(config: dict[str, Any]) -> dict[str, Any]:
    plan = load_plan(config["plan"])
    queue = FleetQueue(
        config["redis"], config["fleet"], worker=config["worker"], idle_timeout=config["idle"]
    )
    ledger = RedisLedger(
        config["redis"], config["ledger"], Decimal(config["limit"]), lease=config["lease"]
    )
    journal = FileJournal.open(config["out"])
    router = Router(
        plan.model,
        policy=ProviderPolicy(**plan.policy),
        ledger=ledger,
        base_url=config["base_url"],
        api_key=config["api_key"],
        budget_wait=True,
        max_concurrency=plan.concurrency,
    )
    params = {d.name: plan.params_for(d).request_params() for d in plan.datasets}
    stats = {"completed": 0, "failed": 0, "budget_stops": 0}
    async with ledger, router:
        source = FleetSource(
            queue,
            plan,
            journal=journal,
            prefetch=plan.concurrency,
            ledger=ledger,
            resolve=router.resolve,
        )
        fleet_journal = source.journal
        slots = asyncio.Semaphore(plan.concurrency)
        tasks: set[asyncio.Task[None]] = set()

        async def one(item: WorkItem) -> None:
            prompt, ds = item.prompt, item.dataset
            try:
                if not fleet_journal.claim(ds, prompt.id):
                    return
                started = time.time()
                try:
                    request = dict(params[ds])
                    max_tokens = request.pop("max_tokens")
                    result = await router.chat(
                        prompt.messages, max_tokens=max_tokens, key=prompt.id, **request
                    )
                except (BudgetExhausted, CreditsExhausted):
                    stats["budget_stops"] += 1
                    source.stop()
                    fleet_journal.release(ds, prompt.id, reason="budget")
                    return
                except Exception as exc:
                    stats["failed"] += 1
                    fleet_journal.release(ds, prompt.id, reason=type(exc).__name__)
                    return
                usage = result.usage
                cost = result.cost or Decimal(0)
                record = make_record(
                    prompt_id=prompt.id,
                    dataset=ds,
                    messages=prompt.messages,
                    text=result.text,
                    reasoning=result.reasoning,
                    finish_reason=result.finish_reason,
                    provider=result.provider,
                    model=plan.model,
                    served_model=result.model,
                    generation_id=result.generation_id,
                    prompt_tokens=usage.prompt_tokens if usage else 0,
                    completion_tokens=usage.completion_tokens if usage else 0,
                    reasoning_tokens=usage.reasoning_tokens if usage else 0,
                    cached_tokens=usage.cached_tokens if usage else 0,
                    cost=cost,
                    metadata=prompt.metadata,
                    started_at=started,
                    finished_at=time.time(),
                )
                fleet_journal.complete(
                    ds,
                    prompt.id,
                    encode_record(record),
                    output_tokens=usage.completion_tokens if usage else 0,
                    prompt_tokens=usage.prompt_tokens if usage else 0,
                    cost_units=to_units(cost),
                )
                fleet_journal.flush()
                stats["completed"] += 1
            finally:
                slots.release()

        async with source:
            async for item in source:
                await slots.acquire()
                task = asyncio.create_task(one(item))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.gather(*tasks)
        stats["reclaimed"] = source.reclaimed
        stats["duplicates"] = source.duplicates
        await queue.close()
    journal.close("done")
    return stats


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    # A script may configure logging (the library never does): warnings to stderr.
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    print(json.dumps(asyncio.run(run(config))), flush=True)


if __name__ == "__main__":
    main()
