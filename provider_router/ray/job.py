"""A generation job as a Ray Data stage: many machines, one budget, each prompt paid once.

::

    job = RayJob("moonshotai/kimi-k2.5", budget="100", redis_url="redis://redis:6379/0",
                 name="b3", policy={"exclude_below": "int4"}, max_tokens=8192)
    out = job.generate(ray.data.read_json("s3://bucket/prompts/"))  # lazy: a Ray Dataset
    out.write_parquet("s3://bucket/answers/")
    summary = job.finish("runs/b3")                 # raises JobStopped on a budget stop

Only the driver sets the limit of the job's :class:`~provider_router.RedisLedger`; every
actor reserves from that one ledger, so the cluster together never passes it. Rows come
out in ``provider-router run``'s formats; a refused row is emitted ``not_sent``, never
dropped, and :meth:`RayJob.finish` turns it into :class:`JobStopped`. Secrets stay out
of every file Ray keeps (docs/workers.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import secrets
import time
from collections.abc import Coroutine, Mapping
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

from pydantic import SecretStr

from provider_router._exceptions import (
    ConfigurationError,
    JobStopped,
    MissingDependencyError,
)
from provider_router._format import format_usd
from provider_router._http import session as _http
from provider_router._money import to_decimal
from provider_router.client.router import Router
from provider_router.jobs.budget import choose_limit
from provider_router.jobs.finish import resume_budget
from provider_router.jobs.store._layout import JobLayout
from provider_router.jobs.summary import RunSummary, StopReason
from provider_router.ledger import RedisLedger, Reservation
from provider_router.ledger._outage import DEFAULT_OUTAGE_WINDOW
from provider_router.ray._concurrency import scope_row_concurrency
from provider_router.ray._secret import (
    PAD_TTL,
    MaskedPassword,
    mask_key,
    mask_password,
    split_password,
)
from provider_router.ray._spill import spill_dir, store_spilled
from provider_router.ray._stage import PromptStage, StageConfig
from provider_router.ray._store import DEFAULT_STORE_PREFIX, AnswerStore
from provider_router.ray._tally import tally

if TYPE_CHECKING:
    from ray.data import Dataset

__all__ = ["RayJob", "run_sync"]

DEFAULT_CALLS_PER_ACTOR: Final = 16
"""Tasks (blocks) one actor runs at once. A task ends with its slowest row, so with one
at a time an actor idles behind every block's slowest answer (p99 ~1 minute)."""
DEFAULT_NUM_CPUS: Final = 0.25
"""CPUs an actor asks for: the work is waiting on sockets. More can deadlock a small
cluster with no error (docs/workers.md): keep it at 0-0.25."""

T = TypeVar("T")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to its end from sync code, even where a loop already runs (notebooks)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _import_ray_data() -> Any:
    try:
        import ray.data
    except ImportError as exc:
        raise MissingDependencyError("provider_router.ray", "ray") from exc
    return ray.data


async def _recover_orphans(
    ledger: RedisLedger, router: Router, lease: float, worst_case: list[Reservation]
) -> list[str]:
    """Settle what dead actors held: every reservation still open once the stage is done.

    Nothing in Ray runs a killed actor's cleanup, and Redis frees a reservation only
    when its lease runs out, so this waits up to one lease for the last ones (the
    stage is done: no live actor holds a reservation any more).
    """
    deadline = time.monotonic() + lease + 1.0
    reconciled = worst = 0
    reconciled_cost = worst_cost = Decimal(0)
    while True:
        report = await ledger.recover(router.resolve)
        reconciled += len(report.reconciled)
        worst += len(report.worst_case)
        worst_case += report.worst_case
        reconciled_cost += report.reconciled_cost
        worst_cost += report.worst_case_cost
        if not await ledger.open_reservations() or time.monotonic() >= deadline:
            break
        await asyncio.sleep(min(lease / 4, 1.0))
    if not (reconciled or worst):
        return []
    return [
        f"ledger: {reconciled} request(s) of dead actors reconciled "
        f"({format_usd(reconciled_cost)}), {worst} counted at worst case "
        f"({format_usd(worst_cost)})"
    ]


class RayJob:
    """One generation job on a Ray cluster (see the module docstring).

    Args:
        model: the OpenRouter model id.
        budget: the hard cap in USD over every run of this job (a top-up: a higher one).
        redis_url: the Redis holding the job's ledger and answers.
        name: the job's name: its ledger and answer store; the same name resumes.
        policy: :class:`~provider_router.ProviderPolicy` keyword arguments.
        max_tokens: the completion cap of every request.
        params: further request fields (``temperature``, ``reasoning``...).
        dataset: the dataset name of rows without a ``dataset`` column.
        concurrency: requests in flight across the cluster.
        actors: stage actors (each runs ``concurrency / actors`` requests at once);
            default: one per alive node of the cluster when :meth:`generate` is called
            (one process keeps 2,000 requests in flight, as ``provider-router run``
            does; more actors on one node only compete for its CPUs, and on a loaded
            2-CPU machine the second actor started 50 s after the first).
        num_cpus: CPUs each actor asks for (0-0.25).
        resources: custom Ray resources each actor asks for (``{"llm_egress": 1}``):
            the stage's actors go only to nodes that offer them.
        calls_per_actor: blocks one actor works on at once (its rows share the
            actor's ``concurrency / actors`` requests in flight).
        api_key: the OpenRouter key (default ``OPENROUTER_API_KEY`` on the driver);
            never in Ray's arguments or files (see :mod:`provider_router.ray._secret`).
        base_url: OpenRouter's API root (default ``OPENROUTER_BASE_URL`` on the driver).
        lease: seconds a dead actor's reservations stay held before recovery.
        recover_interval: seconds between two recoveries in each live actor.
        router_options: further :class:`~provider_router.Router` keyword arguments
            (the stage's routers and :meth:`finish`'s).
        store_prefix: the Redis key prefix of the answer store.
        outage_window: seconds a Redis outage is waited out (by the ledger and the
            answer store) before a row comes out ``not_sent`` naming it.
        raise_budget: ``budget`` may raise a limit set outside the job's runs (by
            ``provider-router ledger topup``); without it such a raise is refused.

    ``budget`` follows the rules of a job's budget (:mod:`provider_router.jobs.budget`,
    ``run``'s): below what the job spent it is refused, and a limit set by ``ledger
    topup`` stands unless the raise is explicit. The budget the job's runs gave is
    kept in its store's manifest.

    A job's store records what it was started with (the model, and each dataset's
    ``max_tokens`` and ``params``): a resume with others is refused, since the paid
    answers it keeps were made with the first ones.
    """

    def __init__(
        self,
        model: str,
        *,
        budget: Decimal | int | str,
        redis_url: str,
        name: str,
        policy: Mapping[str, Any] | None = None,
        max_tokens: int = 8192,
        params: Mapping[str, Any] | None = None,
        dataset: str = "default",
        concurrency: int = 2000,
        actors: int | None = None,
        num_cpus: float = DEFAULT_NUM_CPUS,
        resources: Mapping[str, float] | None = None,
        calls_per_actor: int = DEFAULT_CALLS_PER_ACTOR,
        api_key: str | SecretStr | None = None,
        base_url: str | None = None,
        lease: float = 60.0,
        recover_interval: float = 30.0,
        router_options: Mapping[str, Any] | None = None,
        store_prefix: str = DEFAULT_STORE_PREFIX,
        outage_window: float = DEFAULT_OUTAGE_WINDOW,
        raise_budget: bool = False,
    ) -> None:
        self.budget = to_decimal(budget, what="budget")
        """The job's budget: as given, then the limit that stands (:meth:`settle_budget`)."""
        self._asked = self.budget
        self.raise_budget = raise_budget
        if self.budget <= 0:
            raise ConfigurationError(f"budget must be more than $0, got {budget!r}")
        counts = (("concurrency", concurrency), ("calls_per_actor", calls_per_actor))
        for what, count in (*counts, ("actors", 1 if actors is None else actors)):
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ConfigurationError(f"{what} must be an int >= 1, got {count!r}")
        if not 0 <= num_cpus <= 1:
            raise ConfigurationError(f"num_cpus must be within 0-1, got {num_cpus!r}")
        for resource, amount in (resources or {}).items():
            if isinstance(amount, bool) or not isinstance(amount, int | float) or amount <= 0:
                raise ConfigurationError(
                    f"resources[{resource!r}] must be a number > 0, got {amount!r}"
                )
        if "/" in dataset or not dataset:
            raise ConfigurationError(f"dataset must be a non-empty name without '/': {dataset!r}")
        key = _http.resolve_api_key(api_key)
        if key is None:
            raise ConfigurationError(
                "no API key: give api_key= or set OPENROUTER_API_KEY on the driver"
            )
        self._api_key: SecretStr = key
        self.model = model
        self.redis_url = redis_url
        self.name = name
        self.policy = dict(policy or {})
        self.max_tokens = max_tokens
        self.params = dict(params or {})
        self.dataset = dataset
        self.concurrency = concurrency
        self._actors = actors
        self.num_cpus = num_cpus
        self.resources = dict(resources or {})
        self.calls_per_actor = calls_per_actor
        self.base_url = _http.resolve_base_url(base_url)
        self.lease = lease
        self.recover_interval = recover_interval
        self.router_options = dict(router_options or {})
        self.store_prefix = store_prefix
        self.outage_window = outage_window
        self.recovered: list[str] = []
        self._pads: list[str] = []
        """Pads this job stored in Redis: deleted by :meth:`finish`."""
        self._password_pads: list[Any] = []
        """``ObjectRef`` s of the Redis password's pads: dropped by :meth:`finish`."""
        self.worst_case: list[Reservation] = []
        """Dead actors' reservations :meth:`finish` counted at their worst case (``run
        --own-key`` takes back what the key's usage shows was never charged)."""
        self._since = time.time()
        self._started = time.monotonic()
        self._generated = False
        # The Router validates model, fields and policy: fail here, not on a worker.
        Router(
            model,
            ledger=None,
            api_key=key,
            base_url=self.base_url,
            **{"params": self.params, **self.router_options},
        )

    def __repr__(self) -> str:
        return f"RayJob(name={self.name!r}, model={self.model!r}, budget={self.budget})"

    @property
    def actors(self) -> int:
        """Stage actors: as given, else one per alive node (1 before Ray is started)."""
        if self._actors is not None:
            return self._actors
        import ray

        if not ray.is_initialized():
            return 1
        nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
        return max(1, len([node for node in nodes if node.get("Alive")]))

    @property
    def per_actor(self) -> int:
        """Requests in flight per actor."""
        return max(1, -(-self.concurrency // self.actors))

    @property
    def blocks(self) -> int:
        """Blocks that keep every actor busy: give the input at least this many
        (``ds.repartition(job.blocks)``); fewer leave actors idle."""
        return self.actors * self.calls_per_actor

    # --- the driver's side ------------------------------------------------------------------

    def generate(
        self,
        ds: Dataset,
        *,
        dataset: str | None = None,
        max_tokens: int | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Dataset:
        """``ds`` with every prompt answered (lazy: Ray runs it when it is consumed).

        Makes ``budget`` the job's ledger limit (creating the ledger if new; the
        rules of :meth:`settle_budget`) and stores a new pad for the key. Rows need
        ``messages`` or ``prompt``, and should have an ``id`` (without one, an id
        derived from the messages).
        One job may generate several datasets (``dataset``, ``max_tokens`` and
        ``params`` override the job's for this one); :meth:`finish` tallies them all.

        Raises:
            ConfigurationError: ``DataContext.max_errored_blocks`` is not 0 (Ray would
                drop failed blocks, paid answers with them), or the job's store was
                started with another model, ``max_tokens`` or ``params``.
            JobRefused: ``budget`` is below what the job spent, or raises a limit set
                by ``ledger topup`` without ``raise_budget``.
        """
        ray_data = _import_ray_data()
        context = ray_data.DataContext.get_current()
        if context.max_errored_blocks != 0:
            raise ConfigurationError(
                f"DataContext.max_errored_blocks is {context.max_errored_blocks}: Ray would "
                "drop failed blocks and the paid answers in them; set it to 0"
            )
        if not self._generated:  # "this run" starts with its first dataset
            self._since, self._started = time.time(), time.monotonic()
            self._generated = True
        name = dataset or self.dataset
        tokens = max_tokens or self.max_tokens
        fields = dict(self.params if params is None else params)
        masked, pad = mask_key(self._api_key, f"{self.store_prefix}:{{{self.name}}}")
        run_sync(self._prepare(masked.pad_name, pad, name, tokens, fields))
        self._pads.append(masked.pad_name)
        url, password = self._hide_password()
        scope_row_concurrency()
        config = StageConfig(
            model=self.model,
            name=self.name,
            redis_url=url,
            redis_password=password,
            store_prefix=self.store_prefix,
            key=masked,
            dataset=name,
            max_tokens=tokens,
            params=fields,
            policy=self.policy,
            base_url=self.base_url,
            concurrency=self.per_actor,
            lease=self.lease,
            recover_interval=self.recover_interval,
            router_options=self.router_options,
            run=secrets.token_hex(8),
            outage_window=self.outage_window,
        )
        actors = self._actors = self.actors  # fixed for this job from here on
        remote_args: dict[str, Any] = {"resources": self.resources} if self.resources else {}
        result: Dataset = ds.flat_map(
            PromptStage,
            fn_constructor_args=(config,),
            compute=ray_data.ActorPoolStrategy(
                size=actors, max_concurrent_calls_per_actor=self.calls_per_actor
            ),
            num_cpus=self.num_cpus,
            **remote_args,
        )
        return result

    def _hide_password(self) -> tuple[str, MaskedPassword | None]:
        """The Redis URL without its password, and the password masked (its pad put in
        Ray's object store): Ray writes task specifications to its logs."""
        url, password = split_password(self.redis_url)
        if password is None:
            return url, None
        import ray

        masked, pad = mask_password(password)
        ref = ray.put(pad)
        self._password_pads.append(ref)
        return url, MaskedPassword(masked, ref)

    async def _prepare(
        self, pad_name: str, pad: bytes, dataset: str, max_tokens: int, params: dict[str, Any]
    ) -> None:
        store = self._store()
        try:
            await self._check_manifest(store, dataset, max_tokens, params)
        finally:
            await store.close()
        ledger = RedisLedger(self.redis_url, self.name, lease=self.lease)
        try:
            if not await ledger.exists():
                await ledger.close()
                ledger = RedisLedger(self.redis_url, self.name, self.budget, lease=self.lease)
            await self.settle_budget(ledger)
        finally:
            await ledger.close()
        store = self._store()
        try:
            await store.put_pad(pad_name, pad, PAD_TTL)
        finally:
            await store.close()

    async def settle_budget(self, ledger: RedisLedger) -> None:
        """Give the job's ``ledger`` its budget, by the rules of a job's budget
        (:func:`provider_router.jobs.budget.choose_limit`): the budget the job's runs
        last gave it is in the store's manifest; what changed is said in
        :attr:`recovered`, and :attr:`budget` becomes the limit that stands.

        Raises:
            JobRefused: the budget is below what the job spent, or raises a limit set
                outside the job's runs without ``raise_budget`` (nothing was changed).
        """
        store = self._store()
        try:
            manifest = await store.manifest() or {"model": self.model, "datasets": {}}
            last = manifest.get("budget")
            choice = choose_limit(
                self._asked,
                await ledger.snapshot(),
                None if last is None else Decimal(str(last)),
                raise_limit=self.raise_budget,
                where=f"the job's Redis ledger {self.name!r}",
            )
            if choice.set_limit:
                await ledger.set_limit(choice.budget)
            if choice.record:
                manifest["budget"] = str(choice.budget)
                await store.put_manifest(manifest)
        finally:
            await store.close()
        self.budget = choice.budget
        if choice.note is not None and choice.note not in self.recovered:
            self.recovered.append(choice.note)

    async def last_budget(self) -> Decimal | None:
        """The budget the job's runs last gave its ledger (None: never recorded)."""
        store = self._store()
        try:
            last = (await store.manifest() or {}).get("budget")
        finally:
            await store.close()
        return None if last is None else Decimal(str(last))

    def _store(self) -> AnswerStore:
        return AnswerStore(
            self.redis_url, self.name, prefix=self.store_prefix, outage_window=self.outage_window
        )

    async def _check_manifest(
        self, store: AnswerStore, dataset: str, max_tokens: int, params: dict[str, Any]
    ) -> None:
        """Refuse a resume whose model or parameters differ from the job's first run."""
        manifest = await store.manifest() or {"model": self.model, "datasets": {}}
        if manifest.get("model") != self.model:
            raise ConfigurationError(
                f"job {self.name!r} was started with model {manifest.get('model')!r}, not "
                f"{self.model!r}: its paid answers are that model's. Resume it with the same "
                "model, or give the new job another name"
            )
        wanted = {"max_tokens": max_tokens, "params": json.loads(json.dumps(params))}
        datasets: dict[str, Any] = manifest.setdefault("datasets", {})
        first = datasets.get(dataset)
        if first is not None and first != wanted:
            raise ConfigurationError(
                f"job {self.name!r}, dataset {dataset!r} was started with {first}, not "
                f"{wanted}: its paid answers were made with the first. Resume it with the "
                "same max_tokens and params, or give the new job another name"
            )
        if first is None:
            datasets[dataset] = wanted
            await store.put_manifest(manifest)

    def finish(
        self,
        out: str | Path | None = None,
        *,
        prompts: Mapping[str, int | None] | None = None,
        targets: Mapping[str, tuple[int | None, int | None]] | None = None,
        raise_on_stop: bool = True,
    ) -> RunSummary:
        """Recover dead actors' reservations, tally, write ``summary.json``; raise on a stop.

        Call it once the generated dataset was consumed.

        Args:
            out: a directory for ``summary.json`` (None: not written).
            prompts: each dataset's number of prompts, when known.
            targets: per dataset, ``(target_output_tokens, max_requests)``.
            raise_on_stop: raise :class:`JobStopped` when prompts were not sent.

        Raises:
            JobStopped: prompts were not sent (the budget or the credits ran out);
                raised after ``summary.json`` is written. Every paid answer is kept.
        """
        summary = run_sync(self._finish(prompts or {}, targets))
        self._drop_password_pads()
        if out is not None:
            path = Path(out)
            path.mkdir(parents=True, exist_ok=True)
            summary.write(JobLayout(path).summary)
        if raise_on_stop and summary.reason in (StopReason.BUDGET, StopReason.CREDITS):
            resume = resume_budget(summary)
            raising = ", raise_budget=True" if resume.raise_limit else ""
            how = (
                f"RayJob(..., budget={str(resume.budget)!r}{raising}).generate(ds) resumes it"
                if resume.budget > summary.budget
                else "top up, then run the job again to resume it"
            )
            raise JobStopped(
                f"job {self.name!r} stopped: {summary.message}; {how} (the answered prompts "
                f"are not paid again; spent {format_usd(summary.spent)})",
                summary,
            )
        return summary

    def _drop_password_pads(self) -> None:
        # The last reference gone, Ray frees the object (the stage's actors, its only
        # borrowers, are gone with the finished dataset).
        self._password_pads = []

    async def _finish(
        self,
        prompts: Mapping[str, int | None],
        targets: Mapping[str, tuple[int | None, int | None]] | None,
    ) -> RunSummary:
        ledger = RedisLedger(self.redis_url, self.name, lease=self.lease)
        store = self._store()
        try:
            router = Router(
                self.model,
                ledger=ledger,
                api_key=self._api_key,
                base_url=self.base_url,
                **self.router_options,
            )
            async with router:
                notes = await _recover_orphans(ledger, router, self.lease, self.worst_case)
            self.recovered += notes
            # Paid answers dead actors on this node spilled while Redis was out.
            await store_spilled(store, spill_dir(None, self.name))
            state = await ledger.snapshot()
            # The job is done: its pads go (the masked halves in Ray's files say nothing
            # then). A dataset consumed again after this needs generate() again.
            pads, self._pads = self._pads, []
            await store.delete_pads(*pads)
            manifest = await store.manifest() or {}
            last = manifest.get("budget")
            return await tally(
                store,
                state,
                datasets=prompts,
                since=self._since,
                started=self._started,
                recovered=list(self.recovered),
                targets=targets,
                last_budget=None if last is None else Decimal(str(last)),
            )
        finally:
            await store.close()
            await ledger.close()
