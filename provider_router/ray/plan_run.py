"""A plan on a Ray cluster: what ``provider-router run --plan plan.yaml --ray`` does.

The same plan, outputs and summary as a run on one machine: each dataset's prompts are
read on the driver, sent through a :class:`~provider_router.ray.RayJob` stage, and every
answered row is written to ``DIR/<dataset>.jsonl`` as an output record; then
``summary.json`` and ``report.html``. As ``run`` does, it locks DIR, runs the preflight,
stops each dataset at its ``target_output_tokens`` (:mod:`provider_router.ray._control`),
shows live progress, serves the metrics, and stops on the first Ctrl-C
(:meth:`RayPlanRun.stop`) without killing a request. Resuming is the Redis store's: a
prompt already written is not sent again, and one answered in Redis but not written
comes back free. Datasets of ``route: batch`` or ``auto`` are refused: the Batch API
route runs on one machine.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from rich.console import Console

from provider_router._exceptions import ConfigurationError
from provider_router._log import get_logger
from provider_router._money import from_units
from provider_router._types import JSONObject, Message
from provider_router.client.metrics import Metrics
from provider_router.jobs.identity import settle_identity
from provider_router.jobs.observe.report import write_report
from provider_router.jobs.revisions import Revision, RowCheck, read_row_requests
from provider_router.jobs.store._journal_file import lock_directory, unlock
from provider_router.jobs.store._layout import SET_ASIDE_DIR, JobLayout
from provider_router.jobs.store.aside import finish_move, rows_of, stage_move, staged_file
from provider_router.jobs.store.digest import RequestDigest, request_fields
from provider_router.jobs.store.outputs import encode_record, make_record, read_outputs
from provider_router.jobs.summary import RunSummary, StopReason
from provider_router.planning.plan import DatasetSpec, Plan
from provider_router.planning.prompts import PromptReader
from provider_router.ray._control import CONTROL_UNREACHABLE, INTERRUPTED
from provider_router.ray._driver import DriverLoop
from provider_router.ray._rows import DIGEST_COLUMN, REQUEST_COLUMN
from provider_router.ray._stage import ANSWERED, NOT_SENT
from provider_router.ray.job import RayJob
from provider_router.ray.job import _import_ray_data as import_ray_data

__all__ = ["RayPlanRun", "run_plan_on_ray"]

log = get_logger(__name__)

FLUSH_INTERVAL = 1.0
"""Seconds between two flushes of an output file (its answers are in Redis meanwhile)."""


@dataclass
class Written:
    """What an output file holds: its ids, and their output tokens and cost."""

    ids: set[str] = field(default_factory=set)
    output_tokens: int = 0
    cost: Decimal = Decimal(0)


_Item = tuple[list[Message], JSONObject, list[JSONObject] | None, JSONObject, str]
"""A prompt to send: its messages, metadata, the tools sent, its own request fields, and
the digest of its request."""


@dataclass
class _Dataset:
    spec: DatasetSpec
    reader: PromptReader
    written: Written
    prompts: dict[str, _Item] = field(default_factory=dict)
    total: int = 0
    finished: bool = False
    revision: Revision | None = None
    """What checking its written rows against its prompts moved aside and found gone."""

    @property
    def cap(self) -> int:
        """The most prompts it will complete."""
        cap = self.spec.max_requests
        return self.total if cap is None else min(self.total, cap)


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


def read_written(path: Path) -> Written:
    """What ``path`` holds (a torn last line cut first)."""
    written = Written()
    if not path.is_file():
        return written
    cut = _cut_torn_tail(path)
    if cut:
        log.warning("ray.output_repaired", path=str(path), cut_bytes=cut)
    for _, record in read_outputs(path):
        written.ids.add(record["id"])
        written.output_tokens += int(record["usage"]["completion_tokens"])
        written.cost += Decimal(record["cost"])
    return written


def _check_plan(plan: Plan) -> None:
    if plan.budget is None:
        raise ConfigurationError("a run needs a budget (--budget USD or `budget:` in the plan)")
    if plan.ledger is None or plan.shared_ledger_name is None:
        raise ConfigurationError(
            "--ray needs a Redis ledger (--ledger redis://host:6379/0 or `ledger:` in the "
            "plan): the budget and the paid answers live there, shared by every actor"
        )
    if plan.response_cache is not None:
        raise ConfigurationError(
            "response_cache (--response-cache) is not available with --ray: the actors' "
            "routers do not send its headers; run on one machine, or without it"
        )
    for spec in plan.datasets:
        if spec.route != "sync":
            where = plan.where(spec.name, "route")
            raise ConfigurationError(
                ("" if where is None else f"{where}: ")
                + f"dataset {spec.name!r} has route: {spec.route}: the Batch API route runs on "
                "one machine (provider-router run without --ray); give it route: sync to send "
                "its prompts on Ray"
            )


def _revise(spec: DatasetSpec, out: Path, digest: RequestDigest) -> Revision:
    """Set aside the written rows that no longer answer the dataset's prompts (their
    content changed under their id), as a journaled job does
    (:mod:`provider_router.jobs.revisions`); the output is swapped atomically."""
    layout = JobLayout(out)
    path = layout.output(spec.name)
    # A move a kill cut short: its staged files go (the output is whole; a set-aside file
    # renamed just before the kill keeps its rows, which the next move may append again).
    for stray in [
        *out.glob(staged_file(path, "*").name),
        *layout.out.glob(f"{SET_ASIDE_DIR}/*/{staged_file(path, '*').name}"),
    ]:
        stray.unlink(missing_ok=True)
    revision = Revision(spec.name)
    if not path.is_file() or path.stat().st_size == 0:
        return revision
    _cut_torn_tail(path)
    check = RowCheck(read_row_requests(path), digest)
    seen: set[str] = set()
    for prompt in PromptReader(list(spec.inputs)):
        if prompt.id not in check.rows:
            continue
        seen.add(prompt.id)
        why = check.why_not(prompt)
        if why is not None:
            revision.moved.setdefault(why, []).append(prompt.id)
    revision.gone = sorted(set(check.rows) - seen)
    for why, ids in revision.moved.items():
        move, renames = stage_move(
            path,
            path.stat().st_size,
            rows_of(ids),
            layout.set_aside(why, spec.name),
            uuid.uuid4().hex[:12],
        )
        finish_move(renames)
        revision.moved_cost += from_units(sum(move.cost))
    return revision


def _open_dataset(spec: DatasetSpec, out: Path, strict: bool, plan: Plan) -> _Dataset:
    params = plan.params_for(spec).request_params()
    digest = RequestDigest(plan.model, params)
    revision = _revise(spec, out, digest)
    reader = PromptReader(list(spec.inputs), strict=strict)
    ds = _Dataset(spec, reader, read_written(JobLayout(out).output(spec.name)), revision=revision)
    written = ds.written.ids
    room = None if spec.max_requests is None else max(spec.max_requests - len(written), 0)
    for prompt in reader:
        ds.total += 1
        if prompt.id in written or (room is not None and len(ds.prompts) >= room):
            continue
        request = dict(prompt.request_fields)  # its own tools / tool_choice, sent as given
        tools = request_fields(params, request).get("tools")
        item = (prompt.messages, prompt.metadata, tools, request, digest.of(prompt))
        ds.prompts[prompt.id] = item
    return ds


def _record(ds: _Dataset, row: Mapping[str, Any], model: str, max_tokens: int | None) -> bytes:
    messages, metadata, tools, _, request_digest = ds.prompts[str(row["id"])]
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
            request_digest=request_digest,
            max_tokens=max_tokens,
        )
    )


class RayPlanRun:
    """One ``run --ray`` of a plan into a job directory (see the module docstring).

    Args:
        plan: the plan; it needs a budget and a Redis ledger (``ledger:``).
        out: the job directory.
        address: the Ray cluster's address (``None``: a local cluster, unless this
            process is already connected to one).
        api_key, base_url: OpenRouter's (defaults from the environment).
        actors: stage actors (default: one per alive node).
        strict: the first bad input line raises before anything is sent.
        preflight: run the preflight first (paid from the job's ledger).
        account_horizon: the key is the job's own (``run --own-key``): worst cases
            are bounded by the key's usage this many seconds after (negative: the
            stream deadline; docs/ledger.md).
        metrics: Prometheus metrics the driver keeps current (served by the caller).
        console, progress: where and how to show live progress (``run --progress``).
        lease: seconds a dead actor's reservations stay held before recovery
            (``run --lease``).
        raise_budget: the plan's budget may raise a limit set by ``ledger topup``
            (``run --raise-budget``; :meth:`RayJob.settle_budget`).
        init_options: further ``ray.init`` keyword arguments.

    Raises:
        ConfigurationError: no budget, no Redis ledger, a batch-route dataset, or a
            setting Ray cannot run.
    """

    def __init__(
        self,
        plan: Plan,
        out: str | Path,
        *,
        address: str | None = None,
        api_key: str | SecretStr | None = None,
        base_url: str | None = None,
        actors: int | None = None,
        strict: bool = False,
        preflight: bool = False,
        account_horizon: float | None = None,
        metrics: Metrics | None = None,
        console: Console | None = None,
        progress: str = "off",
        lease: float = 60.0,
        init_options: Mapping[str, Any] | None = None,
        raise_budget: bool = False,
    ) -> None:
        _check_plan(plan)
        assert plan.budget is not None
        assert plan.ledger is not None
        self.plan = plan
        self.out = Path(out)
        self.address = address
        self.strict = strict
        self.init_options = dict(init_options or {})
        self.job = RayJob(
            plan.model,
            budget=plan.budget,
            redis_url=plan.ledger,
            name=plan.shared_ledger_name or "",
            policy=plan.policy,
            concurrency=plan.concurrency,
            api_key=api_key,
            base_url=base_url,
            actors=actors,
            lease=lease,
            raise_budget=raise_budget,
            router_options={"max_premium": plan.max_premium},
        )
        self.driver = DriverLoop(
            self,
            api_key=api_key,
            base_url=base_url,
            preflight=preflight,
            account_horizon=account_horizon,
            metrics=metrics,
            console=console,
            progress=progress,
        )
        self.datasets: list[_Dataset] = []
        self.interrupted = False
        self.unreachable = False
        """Rows were held back because the job's control in Redis was unreachable."""
        self._started = time.monotonic()

    def __repr__(self) -> str:
        return f"RayPlanRun(out={str(self.out)!r}, job={self.job!r})"

    def stop(self) -> None:
        """Send nothing more; requests in flight finish and are written (the first Ctrl-C).

        Safe to call from a signal handler: it only hands the word to the driver's loop.
        """
        self.interrupted = True
        self.driver.stop(INTERRUPTED)

    def run(self) -> RunSummary:
        """Run the plan; the summary (also in ``summary.json``).

        Raises:
            ConfigurationError: another process runs a job in ``out``.
            PreflightFailed: the preflight failed (nothing was sent).
        """
        self._started = time.monotonic()
        self.out.mkdir(parents=True, exist_ok=True)
        lock = lock_directory(self.out)
        try:
            return self._run_locked()
        finally:
            unlock(lock)

    def _run_locked(self) -> RunSummary:
        # What the job is, refused if this run would change what its outputs answer.
        self.job.recovered += settle_identity(self.plan, self.out)
        self.datasets = [
            _open_dataset(spec, self.out, self.strict, self.plan) for spec in self.plan.datasets
        ]
        for ds in self.datasets:
            if ds.revision is not None:
                self.job.recovered += ds.revision.sentences()
        ray_data = import_ray_data()
        import ray

        self.driver.start()
        started_ray = False
        try:
            self.driver.begin()
            if not ray.is_initialized():
                options = {"logging_level": "WARNING", **self.init_options}
                ray.init(address=self.address, **options)
                started_ray = True
            if self.driver.mode != "off":
                # One display: ours (run's table and lines), not Ray Data's besides it.
                ray_data.DataContext.get_current().enable_progress_bars = False
            for ds in self.datasets:
                self._run_dataset(ds, ray_data)
            summary = self.job.finish(
                None,
                prompts={ds.spec.name: ds.total for ds in self.datasets},
                targets={
                    ds.spec.name: (ds.spec.target_output_tokens, ds.spec.max_requests)
                    for ds in self.datasets
                },
                raise_on_stop=False,
            )
            self.driver.end(summary)
        finally:
            try:
                if started_ray:
                    ray.shutdown()
            finally:
                self.driver.close()
        self._conclude(summary)
        summary.write(JobLayout(self.out).summary)
        write_report(self.out)
        return summary

    def _run_dataset(self, ds: _Dataset, ray_data: Any) -> None:
        """Every prompt of ``ds`` not yet written, once (its target may hold the rest)."""
        items = [
            {
                "id": prompt_id,
                "dataset": ds.spec.name,
                "messages": messages,
                REQUEST_COLUMN: json.dumps(request) if request else None,
                DIGEST_COLUMN: request_digest,
            }
            for prompt_id, (messages, _, _, request, request_digest) in ds.prompts.items()
        ]
        if items and not self.interrupted:
            params = self.plan.params_for(ds.spec).request_params()
            max_tokens = params.pop("max_tokens")
            generated = self.job.generate(
                ray_data.from_items(items, override_num_blocks=min(self.job.blocks, len(items))),
                dataset=ds.spec.name,
                max_tokens=max_tokens,
                params=params,
            )
            self._write_outputs(ds, generated.iter_rows())
        ds.finished = True

    def _write_outputs(self, ds: _Dataset, rows: Any) -> None:
        """Every answered row once, in arrival order; flushed about once a second."""
        last_flush = time.monotonic()
        max_tokens = self.plan.params_for(ds.spec).max_tokens
        with JobLayout(self.out).output(ds.spec.name).open("ab") as fh:
            for row in rows:
                prompt_id, status = str(row["id"]), row["status"]
                if status == NOT_SENT:
                    self.unreachable |= row["error"] == CONTROL_UNREACHABLE
                    continue
                if status != ANSWERED:
                    self.driver.failed(str(row["error"] or status).partition(":")[0])
                    continue
                if prompt_id in ds.written.ids:
                    continue
                fh.write(_record(ds, row, self.plan.model, max_tokens))
                ds.written.ids.add(prompt_id)
                if time.monotonic() - last_flush >= FLUSH_INTERVAL:
                    fh.flush()
                    last_flush = time.monotonic()

    def _conclude(self, summary: RunSummary) -> None:
        """The summary's words as ``run``'s: bad lines, a stop, a target not reached."""
        summary.bad_lines = [str(p) for ds in self.datasets for p in ds.reader.problems]
        for report, ds in zip(summary.datasets, self.datasets, strict=True):
            report.bad_lines = ds.reader.bad_lines
        summary.wall_time = time.monotonic() - self._started
        if summary.reason in (StopReason.BUDGET, StopReason.CREDITS):
            return
        if self.interrupted:
            summary.reason, summary.message = StopReason.INTERRUPTED, "interrupted by Ctrl-C"
            return
        if self.unreachable:
            summary.reason = StopReason.ERROR
            summary.message = f"prompts held back: {CONTROL_UNREACHABLE}; run again to resume"
            return
        short = [
            (ds, report)
            for ds, report in zip(self.datasets, summary.datasets, strict=True)
            if ds.spec.target_output_tokens is not None
            and report.output_tokens < ds.spec.target_output_tokens
            and (ds.spec.max_requests is None or report.completed < ds.spec.max_requests)
        ]
        if summary.reason is StopReason.COMPLETE and short:
            # Every prompt done and a target still not reached: run's words.
            summary.reason = StopReason.TARGET_NOT_REACHED
            summary.message = (
                "; ".join(
                    f"{ds.spec.name}: its prompts ran out at {report.output_tokens:,} of "
                    f"{ds.spec.target_output_tokens:,} target output tokens"
                    for ds, report in short
                )
                + " (add prompts, or lower target_output_tokens)"
            )

    # --- for the live display ---------------------------------------------------------------

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._started


def run_plan_on_ray(plan: Plan, out: str | Path, **options: Any) -> RunSummary:
    """Run ``plan`` on Ray into ``out``; the summary (also in ``summary.json``).

    ``options`` are :class:`RayPlanRun`'s.
    """
    return RayPlanRun(plan, out, **options).run()
