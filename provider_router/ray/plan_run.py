"""A plan on a Ray cluster: what ``provider-router run --plan plan.yaml --ray`` does.

The same plan, outputs and summary as a run on one machine: each dataset's
prompts are read on the driver (the formats ``run`` reads, bad lines skipped and
reported), sent through a :class:`~provider_router.ray.RayJob` stage, and every
answered row is written to ``DIR/<dataset>.jsonl`` as an output record (docs/output.md);
then ``summary.json`` and ``report.html``.

Resuming is the Redis store's: the job is named after the plan's ledger, a
prompt already in ``DIR/<dataset>.jsonl`` is not sent again, and one answered in
Redis but not yet written (the driver died) comes back from the store for free
and is written then. Each id is written once, whatever Ray retried.

Not on this path yet: ``target_output_tokens`` (refused with a clear error), the
preflight, the live progress table, ``journal.jsonl`` (its role is the store's).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from provider_router._exceptions import ConfigurationError
from provider_router._log import get_logger
from provider_router._types import JSONObject, Message
from provider_router.batch.output import encode_record, make_record, read_outputs
from provider_router.batch.report import write_report
from provider_router.batch.summary import RunSummary
from provider_router.plan import DatasetSpec, Plan
from provider_router.prompts import PromptReader
from provider_router.ray._stage import ANSWERED
from provider_router.ray.job import SUMMARY_FILE, RayJob
from provider_router.ray.job import _import_ray_data as import_ray_data

__all__ = ["run_plan_on_ray"]

log = get_logger(__name__)

FLUSH_INTERVAL = 1.0
"""Seconds between two flushes of an output file (its answers are in Redis meanwhile)."""


@dataclass
class _Dataset:
    spec: DatasetSpec
    reader: PromptReader
    written: set[str]
    prompts: dict[str, tuple[list[Message], JSONObject, list[JSONObject] | None]] = field(
        default_factory=dict
    )
    total: int = 0


def _cut_torn_tail(path: Path) -> int:
    """Cut a last line a killed driver left half written; the bytes cut.

    The answer it held is in the job's Redis store, so the next run writes it again
    for free; left in place, it would fail the resume and the next record would be
    appended to it."""
    with path.open("r+b") as fh:
        size = fh.seek(0, 2)
        keep = size
        while keep > 0:
            step = min(keep, 65536)
            fh.seek(keep - step)
            chunk = fh.read(step)
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                keep = keep - step + newline + 1
                break
            keep -= step
        if keep < size:
            fh.truncate(keep)
        return size - keep


def _written_ids(path: Path) -> set[str]:
    if not path.is_file():
        return set()
    cut = _cut_torn_tail(path)
    if cut:
        log.warning("ray.output_repaired", path=str(path), cut_bytes=cut)
    return {record["id"] for _, record in read_outputs(path)}


def _open_dataset(spec: DatasetSpec, out: Path, strict: bool) -> _Dataset:
    if spec.target_output_tokens is not None:
        raise ConfigurationError(
            f"dataset {spec.name!r}: target_output_tokens is not supported with --ray yet; "
            "use max_requests, or run it on one machine"
        )
    reader = PromptReader(list(spec.inputs), strict=strict)
    ds = _Dataset(spec, reader, _written_ids(out / f"{spec.name}.jsonl"))
    room = None if spec.max_requests is None else max(spec.max_requests - len(ds.written), 0)
    for prompt in reader:
        ds.total += 1
        if prompt.id in ds.written or (room is not None and len(ds.prompts) >= room):
            continue
        tools = prompt.request_fields.get("tools")
        ds.prompts[prompt.id] = (prompt.messages, prompt.metadata, tools)
    return ds


def _items(ds: _Dataset) -> list[dict[str, Any]]:
    items = []
    for prompt_id, (messages, _, _) in ds.prompts.items():
        items.append({"id": prompt_id, "dataset": ds.spec.name, "messages": messages})
    return items


def _record(ds: _Dataset, row: Mapping[str, Any], model: str) -> bytes:
    messages, metadata, tools = ds.prompts[str(row["id"])]
    calls = json.loads(row["tool_calls"]) if row.get("tool_calls") else []
    return encode_record(
        make_record(
            prompt_id=str(row["id"]),
            dataset=ds.spec.name,
            messages=messages,
            text=row["answer"],
            reasoning=row["reasoning"],
            finish_reason=row["finish_reason"],
            provider=row["provider"],
            model=model,
            served_model=row["served_model"],
            generation_id=row["generation_id"],
            prompt_tokens=int(row["prompt_tokens"]),
            completion_tokens=int(row["completion_tokens"]),
            reasoning_tokens=int(row["reasoning_tokens"]),
            cached_tokens=int(row["cached_tokens"]),
            cost=Decimal(row["cost"]),
            metadata=metadata,
            started_at=float(row["started_at"]),
            finished_at=float(row["finished_at"]),
            tool_calls=calls,
            tools=tools,
        )
    )


def _write_outputs(ds: _Dataset, rows: Any, out: Path, model: str) -> None:
    """Every answered row once, in arrival order; flushed about once a second."""
    last_flush = time.monotonic()
    with (out / f"{ds.spec.name}.jsonl").open("ab") as fh:
        for row in rows:
            prompt_id = str(row["id"])
            if row["status"] != ANSWERED or prompt_id in ds.written:
                continue
            fh.write(_record(ds, row, model))
            ds.written.add(prompt_id)
            if time.monotonic() - last_flush >= FLUSH_INTERVAL:
                fh.flush()
                last_flush = time.monotonic()


def run_plan_on_ray(
    plan: Plan,
    out: str | Path,
    *,
    address: str | None = None,
    api_key: str | None = None,
    base_url: str | None = None,
    actors: int | None = None,
    strict: bool = False,
    init_options: Mapping[str, Any] | None = None,
) -> RunSummary:
    """Run ``plan`` on Ray into ``out``; returns the summary (also in ``summary.json``).

    Args:
        plan: the plan; it needs a budget and a Redis ledger (``ledger:``).
        out: the job directory.
        address: the Ray cluster's address (``None``: a local cluster, unless this
            process is already connected to one).
        api_key, base_url: OpenRouter's (defaults from the environment).
        actors: stage actors (default: one per alive node).
        strict: the first bad input line raises before anything is sent.
        init_options: further ``ray.init`` keyword arguments.

    Raises:
        ConfigurationError: no budget, no Redis ledger, or a setting Ray cannot run.
    """
    if plan.budget is None:
        raise ConfigurationError("a run needs a budget (--budget USD or `budget:` in the plan)")
    if plan.ledger is None or plan.shared_ledger_name is None:
        raise ConfigurationError(
            "--ray needs a Redis ledger (--ledger redis://host:6379/0 or `ledger:` in the "
            "plan): the budget and the paid answers live there, shared by every actor"
        )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    datasets = [_open_dataset(spec, out, strict) for spec in plan.datasets]
    job = RayJob(
        plan.model,
        budget=plan.budget,
        redis_url=plan.ledger,
        name=plan.shared_ledger_name,
        policy=plan.policy,
        concurrency=plan.concurrency,
        api_key=api_key,
        base_url=base_url,
        actors=actors,
    )
    ray_data = import_ray_data()
    import ray

    started_ray = False
    if not ray.is_initialized():
        ray.init(address=address, **{"logging_level": "WARNING", **(init_options or {})})
        started_ray = True
    try:
        blocks = job.blocks
        for ds in datasets:
            items = _items(ds)
            if not items:
                continue
            params = plan.params_for(ds.spec).request_params()
            max_tokens = params.pop("max_tokens")
            generated = job.generate(
                ray_data.from_items(items, override_num_blocks=min(blocks, len(items))),
                dataset=ds.spec.name,
                max_tokens=max_tokens,
                params=params,
            )
            _write_outputs(ds, generated.iter_rows(), out, plan.model)
        summary = job.finish(
            None,
            prompts={ds.spec.name: ds.total for ds in datasets},
            targets={ds.spec.name: (None, ds.spec.max_requests) for ds in datasets},
            raise_on_stop=False,
        )
    finally:
        if started_ray:
            ray.shutdown()
    problems = [str(p) for ds in datasets for p in ds.reader.problems]
    summary.bad_lines = problems
    for report, ds in zip(summary.datasets, datasets, strict=True):
        report.bad_lines = ds.reader.bad_lines
    summary.write(out / SUMMARY_FILE)
    write_report(out)
    return summary
