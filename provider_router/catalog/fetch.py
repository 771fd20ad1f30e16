"""Fetch, cache and snapshot OpenRouter's model and endpoint metadata.

:class:`Catalog` reads ``/models/{author}/{slug}/endpoints`` and ``/models``, keeps
each answer for a TTL (OpenRouter's own ``max-age``: fetching more often gains
nothing), and can write what it holds to a JSON snapshot, so a run records exactly
what it decided from; a catalog loaded from a snapshot never touches the network. A
snapshot is ``{"format": "provider-router/catalog-snapshot@1", "base_url": ...,
"endpoints": {"<model id>": <wire body>, ...}, "models": <wire body> | null}``, each
wire body as OpenRouter returned it; a single endpoints response loads too (the
bundled market snapshot is one).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from ssl import SSLContext
from typing import Any, Final, TypeVar

import cachetools
from pydantic import SecretStr

from provider_router._constants import DEFAULT_CATALOG_TTL
from provider_router._exceptions import (
    ConfigurationError,
    DataFileError,
    InvalidResponseError,
    NotFoundError,
    ProviderRouterError,
)
from provider_router._http.options import check_headers, check_ssl
from provider_router._http.session import HttpClient
from provider_router._log import get_logger
from provider_router._resource import AsyncResource
from provider_router._types import Clock, ModelId
from provider_router.catalog.records import (
    Model,
    ModelEndpoints,
    describe_json,
    parse_endpoints_response,
    parse_models_response,
)

__all__ = ["SNAPSHOT_FORMAT", "Catalog"]

log = get_logger(__name__)

SNAPSHOT_FORMAT: Final = "provider-router/catalog-snapshot@1"
_MODELS_KEY: Final = "\x00models"  # cannot collide with a model id
_CACHE_SIZE: Final = 1024

_R = TypeVar("_R")


def _endpoints_path(model_id: str) -> str:
    author, sep, slug = model_id.strip().partition("/")
    if not sep or not author or not slug or "/" in slug:
        raise ConfigurationError(
            f"model id must look like 'author/slug' (e.g. 'moonshotai/kimi-k2.5'), got {model_id!r}"
        )
    return f"/models/{author}/{slug}/endpoints"


def _did_you_mean(model_id: str, known: Iterable[str]) -> str:
    """``"; did you mean 'a/b'?"`` for the known ids closest to ``model_id`` ("" if none):
    a mistyped id, or the right slug under another author."""
    ids = list(dict.fromkeys(known))
    slug = model_id.partition("/")[2]
    near = [i for i in ids if slug and i.partition("/")[2] == slug and i != model_id]
    near += difflib.get_close_matches(model_id, ids, n=1, cutoff=0.6)
    near = list(dict.fromkeys(near))[:3]
    if not near:
        return ""
    return f"; did you mean {' or '.join(repr(i) for i in near)}?"


class Catalog(AsyncResource):
    """Model and endpoint metadata, fetched on demand and cached for ``ttl`` seconds.

    Args:
        base_url: API root (default ``$OPENROUTER_BASE_URL`` or OpenRouter's).
        api_key: optional key (default ``$OPENROUTER_API_KEY``); with one,
            OpenRouter also fills in latency and throughput.
        ttl: seconds an answer stays fresh.
        http: an :class:`HttpClient` to use (not closed by the catalog; its own TLS
            settings and headers apply).
        ssl: an :class:`ssl.SSLContext` for an ``https://`` base URL (a private CA);
            default: the system's CAs. Only for the catalog's own client.
        headers: extra headers sent with every request (attribution, as
            :class:`~provider_router.Router` takes them); headers the library sets
            itself are refused. Only for the catalog's own client.
        timer: the clock the cache uses (default :func:`time.monotonic`).

    Example:
        >>> async with Catalog() as catalog:  # doctest: +SKIP
        ...     model = await catalog.endpoints("moonshotai/kimi-k2.5")
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | SecretStr | None = None,
        *,
        ttl: float = DEFAULT_CATALOG_TTL,
        http: HttpClient | None = None,
        ssl: SSLContext | None = None,
        headers: Mapping[str, str] | None = None,
        timer: Clock | None = None,
    ) -> None:
        if ttl <= 0:
            raise ConfigurationError(f"ttl must be > 0 seconds, got {ttl}")
        if http is not None and (ssl is not None or headers):
            raise ConfigurationError(
                "Catalog: ssl= and headers= configure the catalog's own client; "
                "give them to the HttpClient passed as http= instead"
            )
        self._ssl = check_ssl(ssl)
        self._headers = check_headers(headers or {}, "Catalog(headers=...)")
        self.ttl = ttl
        self._http = http
        self._owns_http = http is None
        self._base_url = base_url
        self._api_key = api_key
        self._offline: dict[str, Any] | None = None
        self._source: str | None = None
        cache_args: dict[str, Any] = {"maxsize": _CACHE_SIZE, "ttl": ttl}
        if timer is not None:
            cache_args["timer"] = timer
        # key -> (record, raw wire body); raw is what a snapshot saves.
        self._cache: cachetools.TTLCache[str, tuple[Any, Any]] = cachetools.TTLCache(**cache_args)

    def __repr__(self) -> str:
        where = f"snapshot {self._source!r}" if self._offline is not None else self.base_url
        return f"Catalog({where}, ttl={self.ttl:g})"

    @property
    def base_url(self) -> str:
        """Where the catalog fetches from."""
        return self._client().base_url

    @property
    def offline(self) -> bool:
        """True for a catalog loaded from a snapshot."""
        return self._offline is not None

    def _client(self) -> HttpClient:
        if self._http is None:
            self._http = HttpClient(
                self._base_url, self._api_key, headers=self._headers, ssl=self._ssl
            )
        return self._http

    # --- lookups -------------------------------------------------------------------

    async def endpoints(self, model_id: ModelId, *, refresh: bool = False) -> ModelEndpoints:
        """Every provider endpoint of ``model_id`` (from cache while fresh).

        Raises:
            ConfigurationError: ``model_id`` is not ``author/slug``.
            NotFoundError: OpenRouter (or the snapshot) does not know the model.
            InvalidResponseError: the body is not an endpoints listing.
            APIError: any other failure talking to OpenRouter.
        """
        path = _endpoints_path(model_id)
        key = model_id.strip()
        if not refresh and (hit := self._cache.get(key)) is not None:
            record: ModelEndpoints = hit[0]
            return record
        if self._offline is not None:
            raw = self._offline["endpoints"].get(key)
            if raw is None:
                listed = sorted(self._offline["endpoints"])
                known = ", ".join(listed) or "none"
                raise NotFoundError(
                    404,
                    f"snapshot {self._source} has no listing for {key!r} (it has: {known})"
                    + _did_you_mean(key, listed),
                )
            return self._remember(key, parse_endpoints_response(raw, source=str(self._source)), raw)
        http = self._client()
        try:
            raw = await http.get_json(path, expect="an endpoints listing")
        except NotFoundError as exc:
            raise NotFoundError(
                404, await self._unknown_model(key, http, path, exc), body=exc.body,
                headers=exc.headers,
            ) from exc  # fmt: skip
        record = parse_endpoints_response(raw, source=f"GET {http.url(path)}")
        log.debug("catalog.fetched", model=key, endpoints=len(record.endpoints))
        return self._remember(key, record, raw)

    async def _unknown_model(
        self, key: str, http: HttpClient, path: str, exc: NotFoundError
    ) -> str:
        """Why ``key`` has no endpoints listing: the model is unknown there (and which
        listed ids are close), or the URL is not OpenRouter's API (no models list either).
        """
        said = f"GET {http.url(path)}: {exc.message.rstrip('. ')}"
        try:
            listed = [m.id for m in await self.models()]
        except ProviderRouterError:
            # A 404 without the URL would leave the reader no way to tell which.
            return (
                f"{said}: no model {key!r} there, or {http.base_url} is not OpenRouter's API "
                "(its base URL ends in /api/v1, e.g. https://openrouter.ai/api/v1)"
            )
        if key in listed:
            return f"{said}: {key!r} is listed in /models but has no endpoints listing"
        return f"{said}: no model {key!r} there{_did_you_mean(key, listed)}"

    async def batch_endpoints(self, model_id: ModelId, *, refresh: bool = False) -> ModelEndpoints:
        """The Batch API's endpoints of ``model_id``: the ``{model}:batch`` listing.

        Cached and snapshotted like :meth:`endpoints` (under ``author/slug:batch``). A
        model without batch endpoints answers an empty ``endpoints`` tuple, not an error.
        """
        base = model_id.strip().removesuffix(":batch")
        return await self.endpoints(f"{base}:batch", refresh=refresh)

    async def models(self, *, refresh: bool = False) -> tuple[Model, ...]:
        """Every model in ``/models`` (their prices are each model's top provider's).

        Raises:
            NotFoundError: a snapshot without a models list.
            InvalidResponseError: the body is not a models list.
            APIError: any other failure talking to OpenRouter.
        """
        if not refresh and (hit := self._cache.get(_MODELS_KEY)) is not None:
            models: tuple[Model, ...] = hit[0]
            return models
        if self._offline is not None:
            raw = self._offline.get("models")
            if raw is None:
                raise NotFoundError(404, f"snapshot {self._source} has no models list")
            return self._remember(
                _MODELS_KEY, parse_models_response(raw, source=str(self._source)), raw
            )
        http = self._client()
        raw = await http.get_json("/models", expect="a models list")
        models = parse_models_response(raw, source=f"GET {http.url('/models')}")
        log.debug("catalog.fetched", models=len(models))
        return self._remember(_MODELS_KEY, models, raw)

    def _remember(self, key: str, record: _R, raw: Any) -> _R:
        self._cache[key] = (record, raw)
        return record

    def refresh(self) -> None:
        """Forget every cached answer: the next lookups fetch afresh."""
        self._cache.clear()

    # --- snapshots -----------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """What the catalog holds now, as raw wire bodies (see the module docstring)."""
        endpoints = {k: raw for k, (_, raw) in sorted(self._cache.items()) if k != _MODELS_KEY}
        models = self._cache.get(_MODELS_KEY)
        base_url = self._source if self._offline is not None else self.base_url
        return {
            "format": SNAPSHOT_FORMAT,
            "base_url": base_url,
            "endpoints": endpoints,
            "models": None if models is None else models[1],
        }

    def save_snapshot(self, path: str | Path) -> Path:
        """Write :meth:`snapshot` to ``path`` as JSON; returns the path.

        Raises:
            DataFileError: the file cannot be written.
        """
        target = Path(path)
        try:
            target.write_text(json.dumps(self.snapshot(), indent=1, ensure_ascii=False) + "\n")
        except OSError as exc:
            raise DataFileError(target, f"cannot write snapshot: {exc.strerror or exc}") from exc
        return target

    @classmethod
    def load_snapshot(cls, path: str | Path) -> Catalog:
        """An offline catalog serving exactly what the snapshot at ``path`` holds.

        Raises:
            DataFileError: the file is missing, not JSON (with the line), or not a
                snapshot or endpoints listing (saying what was expected and what came).
        """
        source = Path(path)
        try:
            text = source.read_text(encoding="utf-8")
        except OSError as exc:
            raise DataFileError(source, f"cannot read snapshot: {exc.strerror or exc}") from exc
        except UnicodeDecodeError as exc:
            raise DataFileError(source, f"not UTF-8 text: {exc}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataFileError(
                source, f"not valid JSON: {exc.msg} (column {exc.colno})", line=exc.lineno
            ) from None
        return cls.from_snapshot(data, source=str(source))

    @classmethod
    def from_snapshot(cls, data: object, *, source: str = "snapshot") -> Catalog:
        """An offline catalog from a decoded snapshot (or a single endpoints response).

        Every listing is validated now, so a bad snapshot fails at load, not mid-run.

        Raises:
            DataFileError: ``data`` is neither a snapshot nor an endpoints response.
        """
        try:
            offline = _offline_contents(data, source)
        except InvalidResponseError as exc:
            raise DataFileError(source, str(exc).removeprefix(f"{source}: ")) from None
        catalog = cls(http=None)
        catalog._offline = offline
        catalog._source = source
        catalog._owns_http = False
        return catalog

    # --- lifecycle -----------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the HTTP session if the catalog opened it."""
        if self._owns_http and self._http is not None:
            await self._http.aclose()

    async def _on_exit(self) -> None:
        await self.aclose()


def _offline_contents(data: object, source: str) -> dict[str, Any]:
    if isinstance(data, Mapping) and "data" in data and "format" not in data:
        listing = parse_endpoints_response(data, source=source)
        return {"endpoints": {listing.id: data}, "models": None}
    if not isinstance(data, Mapping) or data.get("format") != SNAPSHOT_FORMAT:
        got = data.get("format") if isinstance(data, Mapping) else None
        raise InvalidResponseError(
            f'{source}: expected a catalog snapshot ({{"format": "{SNAPSHOT_FORMAT}", ...}}) '
            'or an endpoints response ({"data": {...}}), got '
            + (f"format {got!r}" if got is not None else describe_json(data))
        )
    endpoints = data.get("endpoints")
    if not isinstance(endpoints, Mapping):
        raise InvalidResponseError(f"{source}: 'endpoints' must map model ids to listings")
    for model_id, raw in endpoints.items():
        listing = parse_endpoints_response(raw, source=f"{source}: endpoints[{model_id!r}]")
        if listing.id != model_id:
            raise InvalidResponseError(
                f"{source}: endpoints[{model_id!r}] holds the listing of {listing.id!r}"
            )
    models = data.get("models")
    if models is not None:
        parse_models_response(models, source=f"{source}: models")
    return {"endpoints": dict(endpoints), "models": models}
