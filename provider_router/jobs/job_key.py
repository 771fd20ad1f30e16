"""A key made for one run of a job: OpenRouter itself holds the run to its budget.

With ``run --job-key`` (the plan's ``job_key: true``) and a management key in
``OPENROUTER_MANAGEMENT_KEY``, a run makes its own OpenRouter key (``POST /keys``) whose
credit limit is what the job's budget has left and which expires after
``job_key_hours``, sends every request with it, and disables it (``PATCH /keys/{hash}``
with ``disabled: true``) when the run ends, however it ends. A worker that spends
outside the ledger (a bug, a forgotten process) is then refused by OpenRouter past the
budget. The key lives in memory only (a ``SecretStr``: never in a log, a file, a repr
or an error); the job directory keeps its hash (``job_keys.json``). The plaintext is
shown once, when the key is made, so a resume makes a new key, after disabling any
key a killed run left enabled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import ROUND_DOWN, Decimal
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from pydantic import SecretStr

from provider_router._constants import DEFAULT_JOB_KEY_HOURS, ENV_MANAGEMENT_KEY
from provider_router._exceptions import (
    APIConnectionError,
    APIError,
    ConfigurationError,
    InvalidResponseError,
    JobRefused,
)
from provider_router._format import decimal_str
from provider_router._http.session import HttpClient
from provider_router._log import get_logger
from provider_router._secrets import remember
from provider_router._types import Clock
from provider_router.jobs.store._layout import JobLayout
from provider_router.jobs.store.job_keys import KeyRecord, KeyRecords

__all__ = ["JobKey", "JobKeyLease", "management_key_from_env"]

log = get_logger(__name__)

KEYS_PATH: Final = "/keys"
_CENT: Final = Decimal("0.01")


def management_key_from_env() -> SecretStr | None:
    """The management key from the environment (``OPENROUTER_MANAGEMENT_KEY``), if set."""
    value = os.environ.get(ENV_MANAGEMENT_KEY, "").strip()
    return SecretStr(value) if value else None


class JobKey:
    """A key made for one run: its hash, name, limit and expiry, and the key itself
    (:attr:`secret`, a ``SecretStr``; the repr shows only the hash)."""

    __slots__ = ("expires_at", "hash", "limit", "name", "secret")

    def __init__(
        self, key_hash: str, name: str, limit: Decimal, expires_at: str, secret: SecretStr
    ) -> None:
        self.hash = key_hash
        self.name = name
        self.limit = limit
        self.expires_at = expires_at
        self.secret = secret

    def __repr__(self) -> str:
        return f"JobKey(hash={self.hash[:12]!r}..., limit={decimal_str(self.limit)})"

    def __reduce__(self) -> Any:
        # Never pickled (Ray would write it to its object store): hand out the
        # secret explicitly where it must travel (ray/_secret.py splits it).
        raise TypeError("a JobKey is not pickled: it holds an API key")


class JobKeyLease:
    """``async with JobKeyLease(out, budget_left=...) as key:`` a key for this run,
    disabled on exit.

    On entry (:meth:`make`): disables every key an earlier run of the job left
    enabled, makes a new one (limit: ``budget_left`` rounded down to the cent; expiry:
    ``hours`` from now) and records its hash before it is used. On exit (:meth:`end`),
    however the run ended: disables it and records that; a failure to disable is
    logged (``job.key_disable_failed``) and left for the next run, and the key still
    expires.

    Args:
        out: the job directory (``job_keys.json`` is kept there).
        budget_left: what the job's budget has left (its limit less spent and held).
        base_url: OpenRouter's (default from the environment).
        management_key: the management key (default ``OPENROUTER_MANAGEMENT_KEY``).
        hours: how long the key is accepted.
        clock: wall-clock seconds (the expiry and the record's times).

    Raises:
        JobRefused: no management key.
    """

    def __init__(
        self,
        out: str | Path,
        *,
        budget_left: Decimal,
        base_url: str | None = None,
        management_key: str | SecretStr | None = None,
        hours: float = DEFAULT_JOB_KEY_HOURS,
        clock: Clock = time.time,
    ) -> None:
        key = management_key if management_key is not None else management_key_from_env()
        if key is None or not (key.get_secret_value() if isinstance(key, SecretStr) else key):
            raise JobRefused(
                f"--job-key makes a key for the run with a management key: set "
                f"{ENV_MANAGEMENT_KEY} (create one at https://openrouter.ai/settings/management-keys)"
            )
        if not hours > 0:
            raise ConfigurationError(f"job_key_hours must be > 0, got {hours!r}")
        self.out = Path(out)
        self.records = KeyRecords(JobLayout(self.out).job_keys)
        self.budget_left = budget_left
        self.hours = hours
        self._clock = clock
        self._base_url = base_url
        self._management = key
        self.key: JobKey | None = None

    async def __aenter__(self) -> JobKey:
        return await self.make()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.end()

    @contextlib.contextmanager
    def held(self) -> Iterator[JobKey]:
        """``with lease.held() as key:`` the same, for a caller without an event loop
        (``run --ray``): the key is made and disabled each on a loop of its own."""
        key = asyncio.run(self.make())
        try:
            yield key
        finally:
            asyncio.run(self.end())

    async def make(self) -> JobKey:
        """Disable what earlier runs left enabled, then make this run's key.

        Each call of :meth:`make` and :meth:`end` opens its own connection, so each may
        run on an event loop of its own (``run --ray`` makes the key before Ray starts
        and disables it after Ray is gone)."""
        async with HttpClient(self._base_url, self._management) as http:
            for left in self.records.pending():
                await self._disable(http, left.hash)
            self.key = await self._make(http)
        return self.key

    async def end(self) -> None:
        """Disable this run's key (logged and left for the next run when it fails)."""
        if self.key is None:
            return
        async with HttpClient(self._base_url, self._management) as http:
            await self._disable(http, self.key.hash)

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self._clock(), UTC).replace(microsecond=0)

    async def _make(self, http: HttpClient) -> JobKey:
        now = self._now()
        expires = (now + timedelta(hours=self.hours)).isoformat().replace("+00:00", "Z")
        limit = max(self.budget_left, Decimal(0)).quantize(_CENT, rounding=ROUND_DOWN)
        name = (
            f"provider-router job {self.out.name} {now:%Y-%m-%dT%H:%M:%SZ} {secrets.token_hex(3)}"
        )
        fields = {"name": name, "expires_at": expires, "include_byok_in_limit": True}
        # The limit written from its digits (JSON has no decimal type; never a float).
        payload = json.dumps(fields)[:-1] + f', "limit": {decimal_str(limit)}}}'
        try:
            body = await http.call_json("POST", KEYS_PATH, payload.encode())
        except (APIConnectionError, InvalidResponseError):
            # The key may have been made: find it by its name and disable it.
            await self._disable_named(http, name)
            raise
        made = _made(body)
        if made is None:
            await self._disable_named(http, name)
            raise InvalidResponseError(
                f"POST {KEYS_PATH}: expected {{data: {{hash}}, key}}, got no key or hash"
            )
        key_hash, secret = made
        self.records.add(
            KeyRecord(key_hash, name, decimal_str(limit), expires, _iso(now), disabled_at=None)
        )
        log.info("job.key_made", hash=key_hash[:12], limit=decimal_str(limit), expires=expires)
        return JobKey(key_hash, name, limit, expires, secret)

    async def _disable(self, http: HttpClient, key_hash: str) -> bool:
        """Disable the key ``key_hash``; True when done (or it is gone already)."""
        payload = b'{"disabled": true}'
        try:
            await http.call_json("PATCH", f"{KEYS_PATH}/{key_hash}", payload)
        except APIError as exc:
            if getattr(exc, "status", None) != 404:
                log.error("job.key_disable_failed", hash=key_hash[:12], error=str(exc))
                return False
        self.records.disabled(key_hash, _iso(self._now()))
        log.info("job.key_disabled", hash=key_hash[:12])
        return True

    async def _disable_named(self, http: HttpClient, name: str) -> None:
        """Disable a key this lease may have made without learning its hash."""
        try:
            body = await http.call_json("GET", KEYS_PATH)
        except APIError as exc:
            log.error("job.key_disable_failed", hash=None, error=str(exc))
            return
        data = body.get("data") if isinstance(body, dict) else None
        for entry in data if isinstance(data, list) else ():
            if isinstance(entry, dict) and entry.get("name") == name:
                found = entry.get("hash")
                if isinstance(found, str) and found:
                    await self._disable(http, found)


def _made(body: Any) -> tuple[str, SecretStr] | None:
    """The hash and the key of a ``POST /keys`` answer: ``{"data": {"hash"}, "key"}``."""
    if not isinstance(body, dict):
        return None
    data = body.get("data")
    key = body.get("key")
    if isinstance(key, str):
        remember(key)  # scrubbed from anything built from now on, before it is used
    key_hash = data.get("hash") if isinstance(data, dict) else None
    if not isinstance(key, str) or not key or not isinstance(key_hash, str) or not key_hash:
        return None
    return key_hash, SecretStr(key)


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")
