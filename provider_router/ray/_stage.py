"""The per-row Ray Data stage: one prompt in, one row out, paid at most once.

:class:`PromptStage` is an async callable class for ``Dataset.flat_map`` on an actor
pool; each row is its own coroutine, so a slow answer holds no other row back. A row is
looked up in the job's :class:`~provider_router.ray._store.AnswerStore` (a stored
answer is emitted again, free), else sent through the actor's Router from the job's
shared :class:`~provider_router.RedisLedger` under the row's sending lease, so the same
row elsewhere waits instead of paying twice; a paid answer is stored *before* its
reservation is settled. No row raises out of the stage (Ray would fail the whole job
and cut every request in flight): a refused prompt comes out ``not_sent``, and a paid
answer Redis cannot take is spilled to the node's disk (:mod:`~provider_router.ray._spill`).
Guarantees, and the pitfalls the stage handles: docs/workers.md.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

from provider_router._exceptions import (
    AllAttemptsFailed,
    AuthenticationError,
    BudgetExhausted,
    ConfigurationError,
    CreditsExhausted,
    LedgerUnavailableError,
    LedgerWriteError,
    ProviderRouterError,
    RouterStopping,
)
from provider_router._format import decimal_str
from provider_router._log import get_logger
from provider_router._types import Sleep
from provider_router.client.results import ChatResult
from provider_router.client.router import Router
from provider_router.jobs.store.digest import RequestDigest
from provider_router.ledger import RedisLedger
from provider_router.ledger._outage import DEFAULT_OUTAGE_WINDOW
from provider_router.planning.prompts import REQUEST_KEYS, _snippet, content_id, parse_prompt_line
from provider_router.ray._control import StageControl
from provider_router.ray._rows import (
    DIGEST_COLUMN,
    EMPTY_ANSWER,
    REQUEST_COLUMN,
    answer_fields,
    clean_messages,
    plain,
    request_fields,
    row_key,
)
from provider_router.ray._secret import MaskedKey, MaskedPassword, with_password
from provider_router.ray._spill import SpillFile, spill_dir, store_spilled
from provider_router.ray._store import AnswerStore, Stored
from provider_router.routing.policy import ProviderPolicy

__all__ = [
    "ANSWERED",
    "FAILED",
    "NOT_SENT",
    "QUARANTINED",
    "PromptStage",
    "StageConfig",
]

log = get_logger(__name__)

ANSWERED: Final = "answered"
NOT_SENT: Final = "not_sent"
FAILED: Final = "failed"
QUARANTINED: Final = "quarantined"
BAD_INPUT: Final = "bad_input"
PARTIAL: Final = "a billed partial answer (a charged error finish): kept, the prompt retried"
_NOT_ASIDE: Final = (
    "error: its stored answer to an earlier content could not be kept aside (Redis); "
    "the next run sends it"
)


@dataclass(frozen=True)
class StageConfig:
    """What every actor of a job needs (pickled into Ray's task; holds no secret)."""

    model: str
    name: str
    redis_url: str
    store_prefix: str
    key: MaskedKey
    dataset: str
    max_tokens: int
    params: Mapping[str, Any] = field(default_factory=dict)
    policy: Mapping[str, Any] = field(default_factory=dict)
    base_url: str | None = None
    concurrency: int = 500
    lease: float = 60.0
    recover_interval: float = 30.0
    router_options: Mapping[str, Any] = field(default_factory=dict)
    run: str = ""
    """This run (one :meth:`RayJob.generate`): a retried task replays its notes."""
    spill_dir: str | None = None
    """Where a paid answer Redis could not take is written (fsynced) until it can, on
    each node (None: ``provider-router-spill`` in the node's temporary directory)."""
    holder_poll: float = 1.0
    """Seconds between looks at the store while another actor sends the same row."""
    outage_window: float = DEFAULT_OUTAGE_WINDOW
    """Seconds a Redis outage is waited out by the store's calls."""
    redis_password: MaskedPassword | None = None
    """``redis_url``'s password, masked (the URL travels without it: Ray keeps task
    specifications in its logs and dashboard)."""


def _duplicate(prompt_id: str) -> str:
    """What ``provider-router run`` says of a duplicate id (:class:`PromptReader`)."""
    return f"duplicate id {_snippet(prompt_id)!r}: an earlier line of this dataset already has it"


def _params(defaults: Mapping[str, Any], metadata: Mapping[str, Any]) -> Mapping[str, Any]:
    """The request's fields: the job's, and those the row's line sets itself."""
    request = None
    for name in REQUEST_KEYS:
        if name in metadata:
            if request is None:
                request = dict(defaults)
            request[name] = metadata[name]
    return defaults if request is None else request


def _error_kind(exc: BaseException) -> str:
    if isinstance(exc, AllAttemptsFailed) and exc.exceptions:
        return type(exc.exceptions[-1]).__name__
    return type(exc).__name__


class PromptStage:
    """The stage's callable class: ``ds.flat_map(PromptStage, fn_constructor_args=(config,))``.

    Build it through :meth:`~provider_router.ray.RayJob.generate`, which also sets
    the ledger's limit (only the driver may) and the per-actor concurrency.

    A row never raises out of the stage (Ray would fail the whole job and cut every
    request in flight): whatever happens, it comes out with a ``status``, as
    ``provider-router run`` writes a failure and goes on.
    """

    def __init__(self, config: StageConfig) -> None:
        self.config = config
        self._router: Router | None = None
        self._ledger: RedisLedger | None = None
        self._store: AnswerStore | None = None
        self._control: StageControl | None = None
        self._opening: asyncio.Lock | None = None
        self._recovering: asyncio.Task[None] | None = None
        self._stopped: str | None = None
        """Why this actor sends nothing more (``budget: ...``, ``credits: ...``)."""
        self._refused: Decimal | None = None
        """The reservation the budget refused (the summary's room for the next one)."""
        self._flying: dict[str, asyncio.Future[dict[str, Any]]] = {}
        """Rows being sent, by row key: the same row arriving meanwhile waits for it."""
        self._url: str | None = None
        """The Redis URL with its password (never pickled: built in the actor)."""
        self._token = secrets.token_hex(8)
        """This actor's name on the sending leases it holds."""
        self._held: set[str] = set()
        """Row keys whose sending lease this actor holds (renewed in the background)."""
        self._sleep: Sleep = asyncio.sleep
        """Awaited between looks at a row another actor sends (tests replace it)."""
        self._partials: dict[str, dict[str, Any]] = {}
        """The last billed partial answer (a charged error finish) of rows being sent."""
        self._unstored: dict[str, dict[str, Any]] = {}
        """Paid answers Redis could not take (an outage past its window), by row key:
        replayed from here, spilled to ``_spill`` and stored again by the background
        task (their sending leases held until then)."""
        self._spill = SpillFile(spill_dir(config.spill_dir, config.name), self._token)
        self._digest: RequestDigest | None = None

    def __repr__(self) -> str:
        return f"PromptStage(name={self.config.name!r}, dataset={self.config.dataset!r})"

    async def _redis_url(self) -> str:
        config = self.config
        if config.redis_password is None:
            return config.redis_url
        password = await asyncio.to_thread(config.redis_password.unmask)
        return with_password(config.redis_url, password)

    async def _get_store(self) -> AnswerStore:
        if self._store is None:
            config = self.config
            self._url = await self._redis_url()
            if self._store is None:  # another row opened it meanwhile
                self._store = AnswerStore(
                    self._url,
                    config.name,
                    prefix=config.store_prefix,
                    outage_window=config.outage_window,
                )
        return self._store

    async def _open(self) -> Router:
        if self._router is not None:
            return self._router
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._router is None:
                await self._open_once()
        assert self._router is not None
        return self._router

    async def _open_once(self) -> None:
        config = self.config
        store = await self._get_store()
        pad = await store.get_pad(config.key.pad_name)
        api_key = config.key.unmask(pad)
        # No limit here: only the driver sets it (two actors racing a top-up could
        # otherwise put back an old one).
        url = self._url or await self._redis_url()
        ledger = RedisLedger(
            url, config.name, lease=config.lease, outage_window=config.outage_window
        )
        try:
            router = Router(
                config.model,
                policy=ProviderPolicy(**config.policy),
                ledger=ledger,
                max_concurrency=config.concurrency,
                base_url=config.base_url,
                api_key=api_key,
                **{"budget_wait": True, **config.router_options},
            )
            await router.open()
        except BaseException:
            await ledger.close()
            raise
        self._ledger, self._router = ledger, router
        # The driver's stop word and the datasets' targets (run --ray): no new attempt.
        self._control = StageControl(url, config.name, prefix=config.store_prefix)
        self._control.watch(router.stop)
        await self._adopt_spills()  # dead actors' answers on this node, before any send
        self._recovering = asyncio.get_running_loop().create_task(self._recover_forever())

    async def _recover_forever(self) -> None:
        """Reconcile dead actors' reservations now and then: nothing else would.

        Also stores again the paid answers an outage kept from Redis."""
        config = self.config
        step = min(config.lease / 3, config.recover_interval)  # leases outlive a step
        waited = 0.0
        while True:
            await asyncio.sleep(step)
            await self._store_unstored()
            await self._renew_held()
            waited += step
            if waited < config.recover_interval:
                continue
            waited = 0.0
            await self._adopt_spills()
            if self._ledger is None or self._router is None:
                continue
            try:
                report = await self._ledger.recover(self._router.resolve)
            except Exception as exc:
                log.warning("ray.recover_failed", error=repr(exc))
                continue
            if report.reconciled or report.worst_case:
                log.info(
                    "ray.recovered",
                    reconciled=len(report.reconciled),
                    worst_case=len(report.worst_case),
                )

    async def _renew_held(self) -> None:
        if self._store is None or not self._held:
            return
        try:
            await self._store.renew(list(self._held), self._token, self.config.lease)
        except Exception as exc:  # Redis out: the holders' answers wait for it anyway
            log.warning("ray.renew_failed", error=repr(exc))

    async def _store_unstored(self) -> None:
        store = self._store
        if store is None or not self._unstored:
            return
        spilled_before = self._spill.appended  # what an emptied file may have held
        for key, fields in list(self._unstored.items()):
            try:
                await store.put(key, fields)
            except Exception:
                return  # still out: the next round tries again
            self._unstored.pop(key, None)
            await self._let_go(store, key)  # stored at last: the lease may go
        if self._unstored:  # spilled meanwhile: its file stays
            return
        try:
            await asyncio.to_thread(self._spill.empty, spilled_before)
        except OSError as exc:  # stored all the same: a later finder stores them again, unpaid
            log.warning("ray.spill_failed", path=str(self._spill.path), error=repr(exc))

    async def _adopt_spills(self) -> None:
        """Store the answers dead actors on this node spilled (never over a stored one)."""
        store = self._store
        if store is None:
            return
        directory = self._spill.path.parent
        try:
            await store_spilled(store, directory)
        except Exception as exc:  # kept on disk: the next round tries again
            log.warning("ray.spill_failed", path=str(directory), error=repr(exc))

    async def __call__(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        config = self.config
        data = plain(dict(row))
        if "messages" in data:
            data["messages"] = clean_messages(data["messages"])
        dataset = str(data.get("dataset") or config.dataset)
        given = data.pop(DIGEST_COLUMN, None)
        try:
            # A null column is an absent key: Arrow gives every row every column.
            present = {k: v for k, v in data.items() if v is not None and k != REQUEST_COLUMN}
            raw = data.get(REQUEST_COLUMN)
            if raw is not None:
                present.update(request_fields(raw))
            line = json.dumps(present, default=str, sort_keys=True)
            explicit_id, messages, metadata = parse_prompt_line(line)
        except (ValueError, TypeError) as exc:
            ident = str(data.get("id", ""))
            return [self._row(data, dataset, ident, BAD_INPUT, f"bad input row: {exc}")]
        prompt_id = explicit_id if explicit_id is not None else content_id(messages)
        digest = hashlib.blake2b(line.encode(), digest_size=16).hexdigest()
        request = given if isinstance(given, str) else self._request_digest(messages, metadata)
        try:
            return [
                await self._answer(data, dataset, prompt_id, digest, messages, metadata, request)
            ]
        except Exception as exc:  # never out of the UDF: Ray would fail the whole job
            log.error("ray.unexpected_error", dataset=dataset, error=repr(exc))
            kind = type(exc).__name__
            return [self._row(data, dataset, prompt_id, FAILED, f"{kind}: {exc}")]

    def _request_digest(self, messages: Any, metadata: Mapping[str, Any]) -> str:
        """The digest of the request a row is sent as (a row the driver gave none)."""
        if self._digest is None:
            config = self.config
            self._digest = RequestDigest(
                config.model, {**config.params, "max_tokens": config.max_tokens}
            )
        own = {key: metadata[key] for key in REQUEST_KEYS if key in metadata}
        return self._digest(messages, own)

    async def _answer(
        self,
        data: dict[str, Any],
        dataset: str,
        prompt_id: str,
        digest: str,
        messages: Any,
        metadata: dict[str, Any],
        request: str,
    ) -> dict[str, Any]:
        key = row_key(dataset, prompt_id)
        unstored = self._unstored.get(key)
        if unstored is not None:
            return {**self._base(data, dataset, prompt_id), **unstored, "status": ANSWERED}
        try:
            store = await self._get_store()
        except ProviderRouterError as exc:  # the password's pad is gone
            return self._row(data, dataset, prompt_id, NOT_SENT, f"error: {exc}")
        run = self.config.run
        try:
            stored = await store.lookup(key, claim=(run, digest) if run else None)
        except LedgerUnavailableError as exc:
            # Unknown whether it was paid: never send it blind. The next run will.
            return self._row(data, dataset, prompt_id, NOT_SENT, f"error: {exc}")
        if stored.claim is not None and stored.claim != digest:
            # Another row of this run has the id (the first to claim it): as `run` does
            # with a duplicate line, this one is refused, never paid a second time.
            why = _duplicate(prompt_id)
            try:
                await store.duplicate(key, digest, why)
            except Exception as exc:  # refused either way; only the summary misses it
                log.warning("ray.note_failed", error=repr(exc))
            return self._row(data, dataset, prompt_id, BAD_INPUT, why)
        if stored.answer is not None:
            if _answers(stored.answer, request):
                return {**self._base(data, dataset, prompt_id), **stored.answer,
                        "status": ANSWERED}  # fmt: skip
            # Paid for another request (the prompt changed under its id): kept aside in
            # the store, never emitted for this one, which is sent as new.
            if not await self._set_aside(store, key, stored.answer):
                return self._row(data, dataset, prompt_id, NOT_SENT, _NOT_ASIDE)
        replay = self._replay(data, dataset, prompt_id, stored)
        if replay is not None:
            return replay
        flying = self._flying.get(key)
        if flying is not None:  # the same row twice at once in this actor: one request
            return dict(await asyncio.shield(flying))
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._flying[key] = future
        row: dict[str, Any] | None = None
        held = False
        try:
            row = await self._wait_for_holder(store, data, dataset, prompt_id, request)
            if row is None:  # this actor holds the sending lease now
                held = True
                self._held.add(key)
                row = await self._send(data, dataset, prompt_id, messages, metadata, request)
        except LedgerUnavailableError as exc:  # at the lease: unknown, never sent blind
            row = self._row(data, dataset, prompt_id, NOT_SENT, f"error: {exc}")
        except Exception as exc:
            kind = type(exc).__name__
            row = self._row(data, dataset, prompt_id, FAILED, f"{kind}: {exc}")
            log.error("ray.unexpected_error", dataset=dataset, error=repr(exc))
        finally:
            self._flying.pop(key, None)
            if row is None:  # cut off (cancelled): so are the rows waiting for it
                future.cancel()
            else:
                future.set_result(row)
        if held:
            await self._let_go(store, key)
        assert row is not None  # set above unless cancelled, which raised
        return row

    async def _wait_for_holder(
        self, store: AnswerStore, data: dict[str, Any], dataset: str, prompt_id: str, request: str
    ) -> dict[str, Any] | None:
        """Take the row's sending lease (None), or the row another actor's send stored.

        The same row in two actors at once (an exact duplicate line, or a task Ray
        retried elsewhere) is thus paid once: the second waits for the first's answer
        and emits it, as this actor's ``_flying`` does within one actor. It is emitted,
        not refused as ``run`` refuses a duplicate line: the two cannot be told apart,
        and refusing a retried task would leave its id out of the output.
        """
        config, key = self.config, row_key(dataset, prompt_id)
        adopted = False
        while True:
            holder, stored = await store.hold(key, self._token, config.lease)
            if stored.answer is not None and not _answers(stored.answer, request):
                if not await self._set_aside(store, key, stored.answer):
                    if holder == self._token:
                        await self._let_go(store, key)
                    return self._row(data, dataset, prompt_id, NOT_SENT, _NOT_ASIDE)
                stored = Stored(None, stored.unsent, stored.failed)
            if stored.answer is not None:
                if holder == self._token:
                    await self._let_go(store, key)
                return {**self._base(data, dataset, prompt_id), **stored.answer,
                        "status": ANSWERED}  # fmt: skip
            replay = self._replay(data, dataset, prompt_id, stored)
            if replay is not None:  # the holder before noted it (this run): as it did
                if holder == self._token:
                    await self._let_go(store, key)
                return replay
            if not adopted and self._spills_here():
                # A dead actor of this node may have spilled this row's paid answer
                # (its lease then outlives it): stored, then looked at again.
                adopted = True
                await self._adopt_spills()
                continue
            if holder == self._token:
                return None
            await self._sleep(config.holder_poll)  # another actor sends it now

    def _spills_here(self) -> bool:
        """Whether another actor's spill file is on this node (one ``stat`` usually)."""
        directory = self._spill.path.parent
        if not os.path.isdir(directory):
            return False
        own = self._spill.path.name
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.name != own and entry.name.endswith(".jsonl"):
                    return True
        return False

    async def _let_go(self, store: AnswerStore, key: str) -> None:
        if key in self._unstored:
            return  # held until stored: it was paid
        self._held.discard(key)
        try:
            await store.release(key, self._token)
        except Exception as exc:  # it runs out after one lease
            log.warning("ray.release_failed", key=key, error=repr(exc))

    async def _send(
        self,
        data: dict[str, Any],
        dataset: str,
        prompt_id: str,
        messages: Any,
        metadata: dict[str, Any],
        request: str,
    ) -> dict[str, Any]:
        config = self.config
        key = row_key(dataset, prompt_id)
        try:
            router = await self._open()
        except ProviderRouterError as exc:
            if isinstance(exc, ConfigurationError):  # the pad: every row would hit it
                self._stopped = f"error: {exc}"
            return await self._not_sent(data, dataset, prompt_id, f"error: {exc}")
        if self._stopped is None and router.halted is not None:
            self._stopped = f"halted: {router.halted}"
        if self._stopped is not None:
            return await self._not_sent(data, dataset, prompt_id)
        assert self._control is not None
        held = await self._control.admit(dataset)  # the driver's stop, a dataset's target
        if held is not None:
            # Not noted in the store: not a stop of the job (a retried task asks again).
            return self._row(data, dataset, prompt_id, NOT_SENT, held)
        params = _params(config.params, metadata)
        started = time.time()
        result: ChatResult | None = None
        kept: list[tuple[bool, dict[str, Any]]] = []
        try:
            result = await router.chat(
                messages,
                max_tokens=config.max_tokens,
                key=key,
                stream=True,
                # A partial of a method, not a nested function: no cells made per row
                # and kept alive through the request.
                on_paid=functools.partial(self._keep_into, kept, key, started, request),
                **params,
            )
        except LedgerWriteError as exc:  # paid and whole: kept like any answer
            result = exc.result
            log.error("ray.ledger_write_failed", key=key, error=str(exc))
        except BudgetExhausted as exc:
            self._stopped, self._refused = f"budget: {exc}", exc.requested
            return await self._not_sent(data, dataset, prompt_id)
        except CreditsExhausted as exc:
            # A budget OpenRouter keeps (the key's limit, a workspace's) stops as ours does.
            limit = exc.limit
            kind = "budget" if limit is not None and limit.is_budget else "credits"
            remedy = f" ({limit.remedy})" if limit is not None else ""
            self._stopped = f"{kind}: {exc}{remedy}"
            return await self._not_sent(data, dataset, prompt_id)
        except RouterStopping as exc:
            return await self._not_sent(data, dataset, prompt_id, f"error: {exc}")
        except ConfigurationError as exc:  # this row's own fields: it alone is refused
            return await self._failed(
                data, dataset, prompt_id, BAD_INPUT, type(exc).__name__, str(exc)
            )
        except (AuthenticationError, LedgerUnavailableError) as exc:
            # Every other row would hit it too (as the batch runner, stop sending).
            self._stopped = f"error: {exc}"
            return await self._not_sent(data, dataset, prompt_id)
        except ProviderRouterError as exc:
            kind = _error_kind(exc)
            partial = self._partials.pop(key, None)  # what a billed error finish gave
            return await self._failed(
                data, dataset, prompt_id, FAILED, kind, f"{kind}: {exc}", partial
            )
        finally:
            self._partials.pop(key, None)
            await self._control.landed(dataset, result)
        # The fields as stored, when they were: a replay then emits the very same row.
        fields = kept[0][1] if kept else answer_fields(result, started, time.time(), request)
        if result.quarantined:
            # Never accepted as data (as the batch runner): the next run sends it again.
            reason = result.quarantine_reason or "served by a provider the policy forbids"
            if not kept:
                await self._note_failed(key, QUARANTINED, "PolicyViolation", reason, fields)
            return {**self._base(data, dataset, prompt_id), **fields, "status": QUARANTINED,
                    "error": reason}  # fmt: skip
        row = {**self._base(data, dataset, prompt_id), **fields, "status": ANSWERED}
        if not (kept and kept[0][0]) and not await self._put(key, fields):
            row["error"] = "paid answer not stored in Redis yet (an outage): kept in this row"
        return row

    async def _keep_into(
        self,
        kept: list[tuple[bool, dict[str, Any]]],
        key: str,
        started: float,
        request: str,
        paid: ChatResult,
    ) -> None:
        if paid.finish_reason == "error":
            # A billed partial answer (an error finish that was charged), retried now:
            # never the row's answer, but kept as its failure until the answer comes.
            fields = answer_fields(paid, started, time.time(), request)
            self._partials[key] = fields
            await self._note_failed(key, FAILED, "ChargedErrorFinish", PARTIAL, fields)
            return
        # Before the settle: a kill after it finds the answer stored, free.
        kept.append(await self._keep(key, paid, started, request))

    async def _keep(
        self, key: str, paid: ChatResult, started: float, request: str
    ) -> tuple[bool, dict[str, Any]]:
        """Store a paid answer before its settle: (stored or noted, its fields)."""
        fields = answer_fields(paid, started, time.time(), request)
        if paid.quarantined:
            reason = paid.quarantine_reason or "served by a provider the policy forbids"
            noted = await self._note_failed(key, QUARANTINED, "PolicyViolation", reason, fields)
            return noted, fields
        return await self._put(key, fields), fields

    async def _put(self, key: str, fields: dict[str, Any]) -> bool:
        try:
            await (await self._get_store()).put(key, fields)
        except Exception as exc:
            # Paid: never lost. Kept here and on this node's disk (an actor killed before
            # Redis is back loses nothing), its sending lease held; stored again later.
            self._unstored[key] = fields
            log.error("ray.store_failed", key=key, error=repr(exc))
            try:
                await asyncio.to_thread(self._spill.append, key, fields)
            except OSError as spill_exc:
                log.error("ray.spill_failed", path=str(self._spill.path), error=repr(spill_exc))
            return False
        self._unstored.pop(key, None)
        return True

    async def _set_aside(self, store: AnswerStore, key: str, answer: Mapping[str, Any]) -> bool:
        """Move a stored answer to another request out of the answers (kept, counted);
        False when the store could not: the row is not sent (its answer would replace it)."""
        digest = answer.get("request_digest")
        try:
            await store.set_aside(key, digest if isinstance(digest, str) else None)
        except Exception as exc:
            log.warning("ray.set_aside_failed", key=key, error=repr(exc))
            return False
        return True

    def _replay(
        self, data: dict[str, Any], dataset: str, prompt_id: str, stored: Stored
    ) -> dict[str, Any] | None:
        """The row a note of this very run says (a retried task): the same as the first."""
        for note in (stored.unsent, stored.failed):
            if note is None or note.get("run") != self.config.run or not self.config.run:
                continue
            status = str(note.get("status") or (NOT_SENT if note is stored.unsent else FAILED))
            error = str(note.get("error") or note.get("reason") or note.get("kind") or "")
            row = self._row(data, dataset, prompt_id, status, error)
            fields = note.get("fields")
            if isinstance(fields, dict):
                row.update(fields)
            return row
        return None

    async def _not_sent(
        self, data: dict[str, Any], dataset: str, prompt_id: str, reason: str | None = None
    ) -> dict[str, Any]:
        why = reason if reason is not None else self._stopped
        assert why is not None
        requested = None
        if reason is None and self._refused is not None:
            requested = decimal_str(self._refused)
        note = {"reason": why, "requested": requested, "run": self.config.run}
        try:
            await (await self._get_store()).not_sent(row_key(dataset, prompt_id), note)
        except Exception as exc:  # not sent: nothing to lose; the row says so
            log.warning("ray.note_failed", error=repr(exc))
        return self._row(data, dataset, prompt_id, NOT_SENT, why)

    async def _note_failed(
        self,
        key: str,
        status: str,
        kind: str,
        error: str,
        fields: dict[str, Any] | None = None,
    ) -> bool:
        note: dict[str, Any] = {
            "kind": kind,
            "status": status,
            "error": error,
            "run": self.config.run,
        }
        if fields is not None:
            note["fields"] = fields
        try:
            await (await self._get_store()).failed(key, note)
        except Exception as exc:
            log.warning("ray.note_failed", error=repr(exc))
            return False
        return True

    async def _failed(
        self,
        data: dict[str, Any],
        dataset: str,
        prompt_id: str,
        status: str,
        kind: str,
        error: str,
        fields: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        await self._note_failed(row_key(dataset, prompt_id), status, kind, error, fields)
        row = self._row(data, dataset, prompt_id, status, error)
        if fields is not None:  # a billed partial answer: kept in its row
            row.update(fields)
        return row

    @staticmethod
    def _base(data: dict[str, Any], dataset: str, prompt_id: str) -> dict[str, Any]:
        return {**data, "id": prompt_id, "dataset": dataset, "error": None}

    def _row(
        self, data: dict[str, Any], dataset: str, prompt_id: str, status: str, error: str
    ) -> dict[str, Any]:
        return {
            **self._base(data, dataset, prompt_id),
            **EMPTY_ANSWER,
            "status": status,
            "error": error,
        }


def _answers(answer: Mapping[str, Any], request: str) -> bool:
    """Whether a stored answer answers ``request`` (one stored before digests never
    can be shown to: it is kept aside and the row sent again)."""
    return answer.get("request_digest") == request
