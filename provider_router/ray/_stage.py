"""The per-row Ray Data stage: one prompt in, one row out, paid at most once.

:class:`PromptStage` is an async callable class for ``Dataset.flat_map`` run on an
actor pool (``compute=ActorPoolStrategy(size=...)``). Ray Data runs up to
``DEFAULT_ASYNC_ROW_UDF_MAX_CONCURRENCY`` rows of a task at once on the actor's
event loop (:class:`~provider_router.ray.RayJob` sets it), so a slow answer holds
no other row back, as a batch UDF would (273 s against 96 s per-row, measured in #22).

Each row:

1. is looked up in the job's :class:`~provider_router.ray._store.AnswerStore`:
   a stored answer (a retried task, or a resumed job) is emitted again, free;
2. else it is sent through the actor's :class:`~provider_router.Router`
   (streaming, so the generation id is on the reservation before the answer is
   done), reserving from the job's shared :class:`~provider_router.RedisLedger`;
3. a paid answer is stored *before* the row is returned; a prompt the budget or
   OpenRouter's credits refused is emitted with ``status="not_sent"`` (never
   dropped: a dropped row makes a budget stop look like a success) and noted in
   the store, as is a failure (``status="failed"``).

Everything that needs an event loop is opened in the first call: Ray builds the
class before its loop exists. A background task calls
:meth:`~provider_router.Ledger.recover` every ``recover_interval`` seconds, since
nothing in Ray runs cleanup code of an actor that was killed.
"""

from __future__ import annotations

import asyncio
import json
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
from provider_router.client import Router
from provider_router.ledger import RedisLedger
from provider_router.policy import ProviderPolicy
from provider_router.prompts import REQUEST_KEYS, content_id, parse_prompt_line
from provider_router.ray._control import INTERRUPTED, StageControl
from provider_router.ray._secret import MaskedKey
from provider_router.ray._store import AnswerStore
from provider_router.results import ChatResult

__all__ = [
    "ANSWERED",
    "FAILED",
    "NOT_SENT",
    "QUARANTINED",
    "PromptStage",
    "StageConfig",
    "plain",
    "row_key",
]

log = get_logger(__name__)

ANSWERED: Final = "answered"
NOT_SENT: Final = "not_sent"
FAILED: Final = "failed"
QUARANTINED: Final = "quarantined"
BAD_INPUT: Final = "bad_input"


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


def row_key(dataset: str, prompt_id: str) -> str:
    """The store's and the ledger's label of one prompt (as the batch runner's)."""
    return f"{dataset}/{prompt_id}"


def plain(value: Any) -> Any:
    """``value`` with numpy arrays and scalars (how Ray hands nested columns) as Python."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    tolist = getattr(value, "tolist", None)
    if tolist is not None and not isinstance(value, str | bytes):
        return plain(tolist())
    return value


def clean_messages(messages: Any) -> Any:
    """Messages as sent: without the ``None`` fields Arrow adds when it unifies the
    keys of different messages into one struct (``content`` stays: it may be null)."""
    if not isinstance(messages, list):
        return messages
    return [
        {k: v for k, v in m.items() if v is not None or k == "content"}
        if isinstance(m, dict)
        else m
        for m in messages
    ]


def answer_fields(result: ChatResult, started: float, finished: float) -> dict[str, Any]:
    """The columns an answer adds to its row (stored as they are: a replay is identical)."""
    usage = result.usage
    cost = result.cost if result.cost is not None else Decimal(0)
    return {
        "answer": result.text,
        "reasoning": result.reasoning or None,
        "finish_reason": result.finish_reason,
        "provider": result.provider,
        "served_model": result.model,
        "generation_id": result.generation_id,
        "cost": decimal_str(cost),
        "prompt_tokens": usage.prompt_tokens if usage else 0,
        "completion_tokens": usage.completion_tokens if usage else 0,
        "reasoning_tokens": usage.reasoning_tokens if usage else 0,
        "cached_tokens": usage.cached_tokens if usage else 0,
        "tool_calls": (
            json.dumps([call.message() for call in result.tool_calls])
            if result.tool_calls
            else None
        ),
        "attempts": result.attempts,
        "started_at": started,
        "finished_at": finished,
    }


_EMPTY_ANSWER: Final[dict[str, Any]] = {
    "answer": None,
    "reasoning": None,
    "finish_reason": None,
    "provider": None,
    "served_model": None,
    "generation_id": None,
    "cost": "0",
    "prompt_tokens": 0,
    "completion_tokens": 0,
    "reasoning_tokens": 0,
    "cached_tokens": 0,
    "tool_calls": None,
    "attempts": 0,
    "started_at": None,
    "finished_at": None,
}


def _error_kind(exc: BaseException) -> str:
    if isinstance(exc, AllAttemptsFailed) and exc.exceptions:
        return type(exc.exceptions[-1]).__name__
    return type(exc).__name__


class PromptStage:
    """The stage's callable class: ``ds.flat_map(PromptStage, fn_constructor_args=(config,))``.

    Build it through :meth:`~provider_router.ray.RayJob.generate`, which also sets
    the ledger's limit (only the driver may) and the per-actor concurrency.
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

    def __repr__(self) -> str:
        return f"PromptStage(name={self.config.name!r}, dataset={self.config.dataset!r})"

    async def _open(self) -> tuple[Router, AnswerStore]:
        if self._router is not None and self._store is not None:
            return self._router, self._store
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._router is None or self._store is None:
                await self._open_once()
        assert self._router is not None
        assert self._store is not None
        return self._router, self._store

    async def _open_once(self) -> None:
        config = self.config
        store = AnswerStore(config.redis_url, config.name, prefix=config.store_prefix)
        try:
            pad = await store.get_pad(config.key.pad_name)
            api_key = config.key.unmask(pad)
            # No limit here: only the driver sets it (two actors racing a top-up could
            # otherwise put back an old one).
            ledger = RedisLedger(config.redis_url, config.name, lease=config.lease)
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
            await store.close()
            raise
        self._store, self._ledger, self._router = store, ledger, router
        self._control = StageControl(config.redis_url, config.name, prefix=config.store_prefix)
        self._control.watch(router.stop)  # the driver's stop word: no new attempt
        self._recovering = asyncio.get_running_loop().create_task(self._recover_forever())

    async def _recover_forever(self) -> None:
        """Reconcile dead actors' reservations now and then: nothing else would."""
        while True:
            await asyncio.sleep(self.config.recover_interval)
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

    async def __call__(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        config = self.config
        data = plain(dict(row))
        if "messages" in data:
            data["messages"] = clean_messages(data["messages"])
        dataset = str(data.get("dataset") or config.dataset)
        try:
            # A null column is an absent key: Arrow gives every row every column.
            present = {k: v for k, v in data.items() if v is not None}
            explicit_id, messages, metadata = parse_prompt_line(json.dumps(present, default=str))
        except (ValueError, TypeError) as exc:
            ident = str(data.get("id", ""))
            return [self._row(data, dataset, ident, BAD_INPUT, f"bad input row: {exc}")]
        prompt_id = explicit_id if explicit_id is not None else content_id(messages)
        router, store = await self._open()
        key = row_key(dataset, prompt_id)
        stored = await store.get(key)
        if stored is not None:
            return [{**self._base(data, dataset, prompt_id), **stored, "status": ANSWERED}]
        if self._stopped is None and router.halted is not None:
            self._stopped = f"halted: {router.halted}"
        if self._stopped is not None:
            return [await self._not_sent(store, data, dataset, prompt_id)]
        assert self._control is not None
        held = await self._control.admit(dataset)  # the driver's stop, a dataset's target
        if held is not None:
            return [self._row(data, dataset, prompt_id, NOT_SENT, held)]
        request = {k: metadata[k] for k in REQUEST_KEYS if k in metadata}
        params = {**config.params, **request} if request else config.params
        started = time.time()
        result: ChatResult | None = None
        try:
            result = await router.chat(
                messages, max_tokens=config.max_tokens, key=key, stream=True, **params
            )
        except LedgerWriteError as exc:  # paid and whole: kept like any answer
            result = exc.result
            log.error("ray.ledger_write_failed", key=key, error=str(exc))
        except BudgetExhausted as exc:
            self._stopped, self._refused = f"budget: {exc}", exc.requested
            return [await self._not_sent(store, data, dataset, prompt_id)]
        except CreditsExhausted as exc:
            self._stopped = f"credits: {exc}"
            return [await self._not_sent(store, data, dataset, prompt_id)]
        except ConfigurationError:
            raise  # the job's own mistake (a field that cannot be priced): fail it loudly
        except (AuthenticationError, LedgerUnavailableError) as exc:
            # Every other row would hit it too (as the batch runner, stop sending).
            self._stopped = f"error: {exc}"
            return [await self._not_sent(store, data, dataset, prompt_id)]
        except RouterStopping:  # the driver's stop word: left for the next run, not failed
            return [self._row(data, dataset, prompt_id, NOT_SENT, INTERRUPTED)]
        except ProviderRouterError as exc:
            kind = _error_kind(exc)
            await store.failed(key, kind)
            return [self._row(data, dataset, prompt_id, FAILED, f"{kind}: {exc}")]
        finally:
            await self._control.landed(dataset, result)
        fields = answer_fields(result, started, time.time())
        if result.quarantined:
            # Never accepted as data (as the batch runner): the next run sends it again.
            await store.failed(key, "PolicyViolation")
            reason = result.quarantine_reason or "served by a provider the policy forbids"
            return [{**self._base(data, dataset, prompt_id), **fields, "status": QUARANTINED,
                     "error": reason}]  # fmt: skip
        await store.put(key, fields)
        return [{**self._base(data, dataset, prompt_id), **fields, "status": ANSWERED}]

    async def _not_sent(
        self, store: AnswerStore, data: dict[str, Any], dataset: str, prompt_id: str
    ) -> dict[str, Any]:
        assert self._stopped is not None
        refused = None if self._refused is None else decimal_str(self._refused)
        note = {"reason": self._stopped, "requested": refused}
        await store.not_sent(row_key(dataset, prompt_id), json.dumps(note))
        return self._row(data, dataset, prompt_id, NOT_SENT, self._stopped)

    @staticmethod
    def _base(data: dict[str, Any], dataset: str, prompt_id: str) -> dict[str, Any]:
        return {**data, "id": prompt_id, "dataset": dataset, "error": None}

    def _row(
        self, data: dict[str, Any], dataset: str, prompt_id: str, status: str, error: str
    ) -> dict[str, Any]:
        return {
            **self._base(data, dataset, prompt_id),
            **_EMPTY_ANSWER,
            "status": status,
            "error": error,
        }
