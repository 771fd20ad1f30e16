"""The HTTP layer: one client per origin, and every transport error mapped here.

:class:`HttpClient` owns an :class:`aiohttp.ClientSession` (created lazily, inside
the running loop) with the base URL, the ``Authorization`` header built once from a
secret key, the ``User-Agent``, timeouts and connector limits; a completion's POST
goes through the leaner :class:`~provider_router._http.h1.H1Pool` when the client
owns its connections. Foreign failures are translated exactly once: a non-2xx answer
by :func:`error_from_response` (408 is a timeout), ``TimeoutError`` to
:class:`RequestTimeout`, any other transport error to :class:`APIConnectionError`
(each ``from`` the original), a 2xx body that is not JSON to
:class:`InvalidResponseError`. The key never appears in a repr, message or log line.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from functools import partial
from http import HTTPStatus
from ssl import SSLContext
from types import TracebackType
from typing import Any, Final

import aiohttp
from aiohttp import BytesPayload
from pydantic import SecretStr
from yarl import URL

from provider_router._constants import (
    DEFAULT_BASE_URL,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_METADATA_TIMEOUT,
    ENV_API_KEY,
    ENV_BASE_URL,
    USER_AGENT,
)
from provider_router._exceptions import (
    APIConnectionError,
    APIError,
    ConfigurationError,
    InvalidResponseError,
    RequestTimeout,
    error_for_status,
)
from provider_router._http.deadlines import Deadline, Deadlines
from provider_router._http.h1 import H1ConnectError, H1Error, H1Pool, H1Response
from provider_router._http.h1.proxy import proxy_for
from provider_router._http.options import check_headers, check_ssl
from provider_router._http.sse import SSEParser, SSETooLong
from provider_router._json import loads
from provider_router._money import pin_exact_cost
from provider_router._resource import AsyncResource
from provider_router._secrets import remember, scrub

__all__ = [
    "HttpClient",
    "PostRequest",
    "PostResponse",
    "connection_error",
    "decode_json",
    "error_from_response",
    "never_sent",
    "resolve_api_key",
    "resolve_base_url",
]

DEFAULT_CONNECTION_LIMIT: Final = 100
"""Connections the session keeps open at most (aiohttp's own default)."""

_SNIPPET: Final = 200

TRANSPORT_ERRORS: Final = (TimeoutError, aiohttp.ClientError, H1Error)
"""What a failed exchange raises, on either transport (mapped by :func:`connection_error`)."""

Params = Mapping[str, str | int | float]


_SESSION_HEADERS: Final = frozenset({"User-Agent", "Accept"})
"""The aiohttp session's default headers: aiohttp also sends them in a proxy's
``CONNECT``, so nothing that may be a secret is among them."""


def resolve_base_url(base_url: str | None = None) -> str:
    """``base_url``, else ``$OPENROUTER_BASE_URL``, else OpenRouter's; without trailing ``/``.

    Raises:
        ConfigurationError: the URL is not http(s).
    """
    url = base_url or os.environ.get(ENV_BASE_URL) or DEFAULT_BASE_URL
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigurationError(f"base URL must start with http:// or https://, got {url!r}")
    return url


def resolve_api_key(api_key: str | SecretStr | None = None) -> SecretStr | None:
    """``api_key``, else ``$OPENROUTER_API_KEY``, else ``None`` (metadata needs no key)."""
    if isinstance(api_key, SecretStr):
        api_key = api_key.get_secret_value()
    key = (api_key or os.environ.get(ENV_API_KEY) or "").strip()
    return SecretStr(key) if key else None


def _snippet(body: bytes) -> str:
    text = body[:_SNIPPET].decode("utf-8", errors="replace")
    return scrub(text) + ("..." if len(body) > _SNIPPET else "")


def decode_json(body: bytes, *, what: str, expect: str = "a JSON object") -> Any:
    """Decode a 2xx body (leading whitespace is fine: OpenRouter sends some).

    Raises:
        InvalidResponseError: the body is empty or not JSON; names ``what`` and ``expect``.
    """
    if not body.strip():
        raise InvalidResponseError(f"{what}: expected {expect}, got an empty body")
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidResponseError(
            f"{what}: expected {expect}, got a body that is not JSON ({exc}): {_snippet(body)!r}"
        ) from None
    pin_exact_cost(parsed, body)  # usage.cost / total_cost digit for digit, never a float
    return parsed


def _float(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if value >= 0 else None
    if isinstance(value, str):
        try:
            seconds = float(value.strip())
        except ValueError:
            return None  # an HTTP-date: rare here; the body usually says it too
        return seconds if seconds >= 0 else None
    return None


def _retry_after(headers: Mapping[str, str], error: Mapping[str, Any]) -> float | None:
    if "retry-after" in headers:
        seconds = _float(headers["retry-after"])
        if seconds is not None:
            return seconds
    metadata = error.get("metadata")
    if isinstance(metadata, Mapping):
        for key in ("retry_after_seconds_raw", "retry_after_seconds"):
            seconds = _float(metadata.get(key))
            if seconds is not None:
                return seconds
        upstream = metadata.get("headers")
        if isinstance(upstream, Mapping):
            for name, value in upstream.items():
                if str(name).lower() == "retry-after":
                    return _float(value)
    availability = error.get("availability")
    if isinstance(availability, Mapping):
        return _float(availability.get("retry_after"))
    return None


def error_from_response(
    status: int, headers: Mapping[str, str], body: bytes, *, what: str = "request"
) -> APIError:
    """The exception for a non-2xx answer, with OpenRouter's error body parsed.

    Reads ``error.message``, ``error.metadata.provider_name``, the error type
    (``error.metadata.error_type`` or ``error.error_type``) and the retry delay
    (``Retry-After`` header, ``metadata.retry_after_seconds``, the upstream
    headers OpenRouter relays, or ``error.availability.retry_after``). A 408 is
    a :class:`RequestTimeout`; everything else an :class:`APIStatusError` subclass.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    parsed: Any = None
    try:
        parsed = json.loads(body) if body.strip() else None
    except (ValueError, UnicodeDecodeError):
        parsed = None
    payload: Mapping[str, Any] | None = parsed if isinstance(parsed, Mapping) else None
    error_obj = payload.get("error") if payload is not None else None
    error: Mapping[str, Any] = error_obj if isinstance(error_obj, Mapping) else {}
    metadata_obj = error.get("metadata")
    metadata: Mapping[str, Any] = metadata_obj if isinstance(metadata_obj, Mapping) else {}

    message = error.get("message")
    if not isinstance(message, str) or not message:
        text = _snippet(body).strip()
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = "error"
        message = text if text and payload is None else phrase
    message = scrub(message)
    provider = metadata.get("provider_name")
    error_type = metadata.get("error_type") or error.get("error_type")
    if status == 408:
        return RequestTimeout(f"{what}: HTTP 408: {message}")
    return error_for_status(status)(
        status,
        message,
        body=payload,
        headers=lowered,
        provider_name=provider if isinstance(provider, str) else None,
        error_type=error_type if isinstance(error_type, str) else None,
        retry_after=_retry_after(lowered, error),
    )


def never_sent(exc: BaseException) -> bool:
    """Whether a transport failure provably happened before the request was written.

    Only a failure to open the connection (refused, DNS, TLS handshake, connect
    timeout) qualifies: once a connection is open, the request is written at
    once, and a later failure cannot tell how much of it OpenRouter received.
    """
    return isinstance(
        exc, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError | H1ConnectError
    )


def connection_error(
    exc: BaseException, *, what: str, timeout: float | None, sent: bool = True
) -> APIConnectionError:
    """Our error for a transport failure (raise it ``from exc``).

    ``sent=False`` marks a request that provably never reached OpenRouter
    (:attr:`APIConnectionError.request_sent`): it cannot have been billed.
    """
    error: APIConnectionError
    if isinstance(exc, TimeoutError):
        limit = f" within {timeout:g} s" if timeout is not None else ""
        phase = "no connection" if not sent else "no complete answer"
        error = RequestTimeout(f"{what}: {phase}{limit}")
    else:
        detail = scrub(str(exc)) or type(exc).__name__
        error = APIConnectionError(f"{what}: connection failed: {detail}")
    if not sent:
        error.request_sent = False
    return error


class HttpClient(AsyncResource):
    """One aiohttp session to OpenRouter (or the local one), with errors mapped.

    Args:
        base_url: API root; default ``$OPENROUTER_BASE_URL`` or OpenRouter's.
        api_key: bearer key; default ``$OPENROUTER_API_KEY``; optional for metadata.
        timeout: seconds for a whole request unless a call says otherwise.
        connect_timeout: seconds to open a connection.
        limit: most connections open at once (``0`` = no limit).
        limit_per_host: most connections to one host (``0`` = no limit).
        user_agent: the ``User-Agent`` header.
        headers: extra headers sent with every request (attribution such as
            ``HTTP-Referer``, ``X-OpenRouter-Title``); a header the client sets
            itself (:data:`~provider_router._http.options.OWNED_HEADERS`) is refused.
        ssl: the TLS settings for an ``https://`` base URL (an
            :class:`ssl.SSLContext` trusting a private CA, say); default: the
            system's CAs (``SSL_CERT_FILE`` honoured).
        session: an existing session to use instead (not closed by us; its own
            headers, TLS settings and proxy apply, so it must already carry any auth
            it needs).

    The proxy is the environment's (``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``ALL_PROXY``
    / ``NO_PROXY``, read when the client is built: :func:`~.h1.proxy.proxy_for`),
    for the lean POSTs and the GETs alike.

    Use as ``async with HttpClient() as http:`` or call :meth:`aclose`.
    """

    __slots__ = (
        "_api_key",
        "_closed",
        "_connect_timeout",
        "_deadlines",
        "_get_headers",
        "_headers",
        "_heads",
        "_limit",
        "_limit_per_host",
        "_owns_session",
        "_pool",
        "_proxy",
        "_proxy_headers",
        "_proxy_url",
        "_session",
        "_ssl",
        "_timeout",
        "_timeouts",
        "_urls",
        "base_url",
        "timeout",
    )

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | SecretStr | None = None,
        *,
        timeout: float = DEFAULT_METADATA_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        limit: int = DEFAULT_CONNECTION_LIMIT,
        limit_per_host: int = 0,
        user_agent: str = USER_AGENT,
        headers: Mapping[str, str] | None = None,
        ssl: SSLContext | None = None,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        if timeout <= 0 or connect_timeout <= 0:
            raise ConfigurationError(
                f"timeouts must be > 0 s, got timeout={timeout}, connect_timeout={connect_timeout}"
            )
        if limit < 0 or limit_per_host < 0:
            raise ConfigurationError("connection limits must be ≥ 0 (0 means unlimited)")
        self.base_url = resolve_base_url(base_url)
        self._api_key = resolve_api_key(api_key)
        self.timeout = timeout
        self._connect_timeout = connect_timeout
        self._timeout = aiohttp.ClientTimeout(total=timeout, connect=connect_timeout)
        self._timeouts: dict[float | None, aiohttp.ClientTimeout] = {}
        # POST deadlines: one timer for the client instead of aiohttp's per request.
        self._deadlines = Deadlines()
        self._urls: dict[str, URL] = {}
        self._limit = limit
        self._limit_per_host = limit_per_host
        self._headers = {"User-Agent": user_agent, "Accept": "application/json"}
        for name, value in check_headers(headers or {}, "headers").items():
            # A User-Agent given in any case replaces ours (never sent twice).
            self._headers["User-Agent" if name.lower() == "user-agent" else name] = value
        if self._api_key is not None:
            secret = self._api_key.get_secret_value()
            remember(secret)  # scrubbed from every error a server echoes it into
            self._headers["Authorization"] = f"Bearer {secret}"
        for name, value in self._headers.items():
            if any(c in name or c in value for c in "\r\n\0"):
                # Never the value itself: it may be the key.
                what = "the API key" if name == "Authorization" else f"the {name!r} header"
                raise ConfigurationError(
                    f"{what} holds a line break or NUL, which HTTP cannot carry"
                )
        self._session = session
        self._owns_session = session is None
        self._ssl = check_ssl(ssl)
        # The environment's proxy for our origin, once (an adopted session has its own).
        self._proxy = proxy_for(URL(self.base_url)) if session is None else None
        self._proxy_url: URL | None = None
        self._proxy_headers: dict[str, str] | None = None
        # What each GET adds to the session's headers: the key and the caller's headers
        # (aiohttp merges a session's default headers into a proxy's CONNECT, where the
        # key would become its Proxy-Authorization and a gateway key given in headers=
        # would reach the proxy), and, for a plain-HTTP origin, the proxy's credentials
        # (aiohttp sends proxy_headers only in a CONNECT: the request itself goes to
        # the proxy and must carry them).
        self._get_headers = {k: v for k, v in self._headers.items() if k not in _SESSION_HEADERS}
        if self._proxy is not None:
            self._proxy_url = URL(f"http://{self._proxy.authority}")
            if URL(self.base_url).scheme == "https":
                self._proxy_headers = self._proxy.headers()
            else:
                self._get_headers.update(self._proxy.headers())
        # The lean POST path (created on the first send, inside the running loop) and
        # its request heads, built once per path.
        self._pool: H1Pool | None = None
        self._heads: dict[str, bytes] = {}
        self._closed = False

    def __repr__(self) -> str:
        key = "set" if self._api_key is not None else "none"
        return f"HttpClient(base_url={self.base_url!r}, api_key=<{key}>)"

    @property
    def has_api_key(self) -> bool:
        """Whether requests carry an ``Authorization`` header."""
        return self._api_key is not None

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` ran (or an adopted session was closed)."""
        return self._closed or (self._session is not None and self._session.closed)

    def url(self, path: str) -> str:
        """The absolute URL of ``path`` (relative to the base URL)."""
        return f"{self.base_url}/{path.lstrip('/')}"

    def timeout_for(self, seconds: float | None) -> aiohttp.ClientTimeout:
        """The per-request timeout object for ``seconds`` (the default when ``None``)."""
        if seconds is None:
            return self._timeout
        return aiohttp.ClientTimeout(total=seconds, connect=self._connect_timeout)

    def session(self) -> aiohttp.ClientSession:
        """The session, created on first use (inside the running event loop)."""
        session = self._session
        if self._closed:
            raise ConfigurationError("this HttpClient is closed; create a new one")
        if session is None:
            connector = aiohttp.TCPConnector(
                limit=self._limit,
                limit_per_host=self._limit_per_host,
                ssl=self._ssl if self._ssl is not None else True,
            )
            # Only what may reach a proxy's CONNECT among the session's default headers
            # (aiohttp merges them into it): the rest goes with each GET (_get_headers).
            anonymous = {k: v for k, v in self._headers.items() if k in _SESSION_HEADERS}
            session = aiohttp.ClientSession(
                connector=connector, headers=anonymous, timeout=self._timeout
            )
            self._session = session
        elif session.closed:
            raise ConfigurationError("this HttpClient is closed; create a new one")
        return session

    async def get_json(
        self,
        path: str,
        params: Params | None = None,
        *,
        expect: str = "a JSON object",
        request_timeout: float | None = None,
        max_bytes: int | None = None,
    ) -> Any:
        """GET ``path`` and decode the JSON body.

        Args:
            path: relative to the base URL (``"/models"``).
            params: query parameters.
            expect: what the body should be, for the error when it is not JSON.
            request_timeout: seconds for this request (default: the client's).
            max_bytes: the most of a body read (None: no bound); a longer one is
                refused before it is held whole.

        Raises:
            APIStatusError: a non-2xx answer (the subclass says which).
            RequestTimeout: no complete answer in time (or HTTP 408).
            APIConnectionError: the connection failed.
            InvalidResponseError: the body is not JSON, or longer than ``max_bytes``.
        """
        url = self.url(path)
        what = f"GET {url}"
        session = self.session()
        try:
            async with session.get(
                url,
                params=params,
                timeout=self.timeout_for(request_timeout),
                headers=self._get_headers if self._owns_session else None,
                proxy=self._proxy_url,  # None for an adopted session: its own settings
                proxy_headers=self._proxy_headers,
            ) as response:
                if max_bytes is None:
                    body = await response.read()
                else:
                    body = await _read_at_most(response, max_bytes, what)
                status = response.status
                headers = response.headers
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise connection_error(
                exc, what=what, timeout=self.timeout if request_timeout is None else request_timeout
            ) from exc
        if not 200 <= status < 300:
            raise error_from_response(status, headers, body, what=what)
        return decode_json(body, what=what, expect=expect)

    async def call_json(
        self,
        method: str,
        path: str,
        payload: bytes | None = None,
        *,
        expect: str = "a JSON object",
        request_timeout: float | None = None,
    ) -> Any:
        """``method`` (``POST``, ``PATCH``, ``DELETE``...) ``path`` with an encoded JSON
        ``payload`` (or none), and the decoded JSON answer: the account's own calls (the
        management API's keys), on the session :meth:`get_json` uses, never the lean
        completion path.

        Raises:
            APIStatusError: a non-2xx answer (the subclass says which).
            RequestTimeout: no complete answer in time (or HTTP 408).
            APIConnectionError: the connection failed.
            InvalidResponseError: the body is not JSON.
        """
        url = self.url(path)
        what = f"{method} {url}"
        session = self.session()
        headers = dict(self._get_headers) if self._owns_session else {}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        try:
            async with session.request(
                method,
                url,
                data=payload,
                timeout=self.timeout_for(request_timeout),
                headers=headers or None,
                proxy=self._proxy_url,
                proxy_headers=self._proxy_headers,
            ) as response:
                body = await response.read()
                status = response.status
                response_headers = response.headers
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise connection_error(
                exc, what=what, timeout=self.timeout if request_timeout is None else request_timeout
            ) from exc
        if not 200 <= status < 300:
            raise error_from_response(status, response_headers, body, what=what)
        return decode_json(body, what=what, expect=expect)

    def post(
        self,
        path: str,
        payload: bytes,
        *,
        request_timeout: float | None = None,
        idle_timeout: float | None = None,
    ) -> PostRequest:
        """POST an encoded JSON ``payload``: ``async with http.post(...) as response``.

        The answer's status is checked on entry (a non-2xx raises, mapped like
        :meth:`get_json`); the body is read from the :class:`PostResponse`, whole
        (:meth:`PostResponse.json`) or as server-sent events (:meth:`PostResponse.events`).

        Args:
            path: relative to the base URL (``"/chat/completions"``).
            payload: the request body, already JSON-encoded (callers encode once).
            request_timeout: seconds for the whole exchange (default: the client's).
            idle_timeout: seconds of silence allowed between two reads of the body.
        """
        timeout, seconds, url = self._post_target(path, request_timeout, idle_timeout)
        if not self._owns_session:
            session = self.session()
            start = self._aiohttp_post(session, url, payload, timeout)
            return PostRequest(
                _ignoring_exchange(start), url, seconds, self._deadlines, not session.trace_configs
            )
        pool = self._lean()
        head = self._heads.get(path) or self._request_head(pool, path, url)
        lean = partial(pool.post, head, payload, idle_timeout)
        return PostRequest(lean, url, seconds, self._deadlines, True)

    def _lean(self) -> H1Pool:
        """The lean connection pool, created on first use (inside the running loop)."""
        if self._closed:
            raise ConfigurationError("this HttpClient is closed; create a new one")
        pool = self._pool
        if pool is None:
            origin = URL(self.base_url)
            pool = self._pool = H1Pool(
                origin.raw_host or "",
                origin.port or (443 if origin.scheme == "https" else 80),
                tls=origin.scheme == "https",
                headers=self._headers,
                limit=min((n for n in (self._limit, self._limit_per_host) if n), default=0),
                connect_timeout=self._connect_timeout,
                ssl_context=self._ssl,
                proxy=self._proxy,
            )
        return pool

    def send(
        self, path: str, payload: bytes, *, request_timeout: float | None = None
    ) -> Coroutine[Any, Any, PostResponse]:
        """:meth:`post` without the context manager: ``response = await http.send(...)``.

        The caller must end the response: :meth:`PostResponse.release` after
        reading it whole, :meth:`PostResponse.close` otherwise (on any error). One
        coroutine and two objects less per request than ``async with post(...)``;
        the router's non-streaming path takes it (docs/performance.md). Errors are
        mapped exactly as :meth:`post` maps them.
        """
        timeout, seconds, url = self._post_target(path, request_timeout, None)
        if not self._owns_session:
            session = self.session()
            start = self._aiohttp_post(session, url, payload, timeout)
            exchange = PostResponse(url, seconds, not session.trace_configs)
            return _send(start(), exchange, self._deadlines)
        pool = self._lean()
        head = self._heads.get(path) or self._request_head(pool, path, url)
        exchange = PostResponse(url, seconds, True)
        return _send(pool.post(head, payload, None, exchange), exchange, self._deadlines)

    def _request_head(self, pool: H1Pool, path: str, url: URL) -> bytes:
        """Build and keep the lean pool's request head for ``path`` (once per path)."""
        head = self._heads[path] = pool.request_head(url.raw_path_qs, _JSON_TYPE)
        return head

    @staticmethod
    def _aiohttp_post(
        session: aiohttp.ClientSession, url: URL, payload: bytes, timeout: aiohttp.ClientTimeout
    ) -> partial[aiohttp.client._RequestContextManager]:
        """A POST on a given aiohttp session (its connector and trace configs apply), to start."""
        # The body as a payload that names its own type: no per-request headers for
        # aiohttp to merge into the session's.
        typed = BytesPayload(payload, content_type=_JSON_TYPE)
        return partial(session.post, url, data=typed, timeout=timeout)

    def _post_target(
        self, path: str, request_timeout: float | None, idle_timeout: float | None
    ) -> tuple[aiohttp.ClientTimeout, float, URL]:
        timeout = self._timeouts.get(idle_timeout)
        if timeout is None:
            # No ``total``: the request's deadline is kept by ``self._deadlines`` (one
            # timer per client); ``connect`` still bounds opening a connection, whose
            # failure is "never sent" (never_sent).
            timeout = aiohttp.ClientTimeout(
                total=None, connect=self._connect_timeout, sock_read=idle_timeout
            )
            self._timeouts[idle_timeout] = timeout
        seconds = self.timeout if request_timeout is None else request_timeout
        url = self._urls.get(path)
        if url is None:
            # Parsed once: aiohttp would parse a string URL on every request.
            url = self._urls[path] = URL(self.url(path))
        return timeout, seconds, url

    async def post_json(
        self, path: str, body: Mapping[str, Any], *, request_timeout: float | None = None
    ) -> Any:
        """POST ``body`` as JSON and decode the JSON answer (errors as :meth:`post`)."""
        payload = json.dumps(body, separators=(",", ":")).encode()
        async with self.post(path, payload, request_timeout=request_timeout) as response:
            return await response.json()

    async def aclose(self) -> None:
        """Close the session if this client created it. Safe to call twice."""
        self._closed = True
        session = self._session
        if session is not None and self._owns_session and not session.closed:
            await session.close()
        pool = self._pool
        if pool is not None:
            await pool.aclose()
        self._deadlines.close()

    async def _on_exit(self) -> None:
        await self.aclose()


_JSON_TYPE: Final = "application/json"


async def _read_at_most(response: aiohttp.ClientResponse, limit: int, what: str) -> bytes:
    """The body, read chunk by chunk, or the error once it is longer than ``limit``."""
    length = response.content_length
    chunks: list[bytes] = []
    size = 0 if length is None or length <= limit else limit + 1
    while size <= limit:
        chunk = await response.content.read(1 << 20)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        chunks.append(chunk)
    raise InvalidResponseError(f"{what}: the body is longer than the {limit:,} bytes it may be")


_Answer = aiohttp.ClientResponse | H1Response
"""An answer's headers and body, from aiohttp or from the lean pool (same calls)."""


def _ignoring_exchange(
    start: Callable[[], Awaitable[_Answer]],
) -> Callable[[PostResponse], Awaitable[_Answer]]:
    """An aiohttp POST to start as the lean pool's is started (aiohttp cannot say
    whether it wrote the request: it counts as sent)."""
    return lambda _exchange: start()


async def _send(
    request: Awaitable[_Answer], exchange: PostResponse, deadlines: Deadlines
) -> PostResponse:
    """Await one POST (``request``, not started yet) and check its status: a 2xx
    :class:`PostResponse` (``exchange``, its headers set), or the mapped error.

    The request's deadline (``exchange``'s seconds) is registered before it is sent
    and ends here when the whole body came with the headers; otherwise the response
    keeps it until it is released or closed. A failure while the request still
    waited for a connection (the lean pool says so on ``exchange._unsent``) is
    "never sent", whatever ended the wait: the deadline, a connect failure, a close.
    """
    url = exchange._url
    seconds = exchange._seconds
    deadlines.begin(exchange, seconds)  # registered, and the wait for the headers guarded
    try:
        try:
            response = await request
        except BaseException as exc:
            exchange._leave(exc)  # the deadline's own cancel becomes TimeoutError
            raise
        if exchange._state:
            exchange._leave(None)  # expired as the headers came: its cancel taken back
        else:
            exchange._task = None
    except TRANSPORT_ERRORS as exc:
        exchange._end()
        sent = not (exchange._unsent or never_sent(exc))
        raise connection_error(exc, what=f"POST {url}", timeout=seconds, sent=sent) from exc
    except BaseException:
        exchange._end()
        raise
    exchange._response = response
    status = exchange.status = response.status
    exchange.headers = response.headers
    if response.content.is_eof():
        exchange._end()  # the whole body is here: nothing left to time
    if not 200 <= status < 300:
        try:
            with exchange:  # a guarded wait: the deadline's cancel becomes TimeoutError
                body = await response.read()
        except TRANSPORT_ERRORS:
            body = b""
        finally:
            exchange.release()
        raise error_from_response(status, response.headers, body, what=f"POST {url}")
    return exchange


class PostRequest:
    """One POST in flight; entering it sends the request and checks the status."""

    __slots__ = ("_deadlines", "_response", "_seconds", "_start", "_untraced", "_url")

    def __init__(
        self,
        start: Callable[[PostResponse], Awaitable[_Answer]],
        url: URL,
        seconds: float,
        deadlines: Deadlines,
        untraced: bool,
    ) -> None:
        self._start = start  # called on entry: nothing is sent before
        self._url = url
        self._seconds = seconds
        self._deadlines = deadlines
        self._untraced = untraced
        self._response: PostResponse | None = None

    async def __aenter__(self) -> PostResponse:
        exchange = PostResponse(self._url, self._seconds, self._untraced)
        response = await _send(self._start(exchange), exchange, self._deadlines)
        self._response = response
        return response

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        response = self._response
        if response is not None:
            self._response = None
            if exc_type is None:
                response.release()
            else:
                response.close()


class PostResponse(Deadline):
    """A 2xx answer to :meth:`HttpClient.post`: headers now, the body on demand.

    It carries the request's deadline (:mod:`provider_router._http.deadlines`) until
    it is released or closed, or its body has been read whole.

    Attributes:
        status: the HTTP status.
        headers: the response headers (case-insensitive lookup).
    """

    __slots__ = ("_response", "_seconds", "_unsent", "_untraced", "_url", "headers", "status")

    _response: _Answer
    status: int
    headers: Mapping[str, str]

    def __init__(self, url: URL, seconds: float, untraced: bool = False) -> None:
        # The aiohttp response, status and headers are set by _send once the
        # headers arrive: the object exists before, to carry the deadline.
        self._url = url
        self._seconds = seconds
        self._untraced = untraced  # no trace config: a whole body may skip read()
        # True while the lean pool still waits for a connection (nothing written yet).
        self._unsent = False

    @property
    def _what(self) -> str:
        # Built only for an error message: most responses never need it.
        return f"POST {self._url}"

    def _complete(self) -> bool:
        # A deadline that passes once the whole body is here changes nothing
        # (aiohttp stops its timer at the end of the body).
        try:
            response = self._response
        except AttributeError:  # still waiting for the headers
            return False
        return response.content.is_eof()

    @property
    def complete(self) -> bool:
        """Whether the whole body has already arrived (reading it will not wait)."""
        return self._response.content.is_eof()

    def release(self) -> None:
        """Hand the connection back for reuse (after the body was read whole)."""
        self._end()
        self._response.release()

    def close(self) -> None:
        """Drop the connection: the body was not read to its end (or reading failed)."""
        self._end()
        self._response.close()

    async def json(self, *, expect: str = "a JSON object") -> Any:
        """Read the whole body and decode it.

        Raises:
            RequestTimeout: the body did not arrive in time.
            APIConnectionError: the connection broke (a truncated body).
            InvalidResponseError: the body is not JSON.
        """
        response = self._response
        content = response.content
        try:
            if self._untraced and content.is_eof() and content.exception() is None:
                # The whole body is here: read() would return these very bytes without
                # waiting, through three coroutines (docs/performance.md); there is no
                # trace to send.
                try:
                    if self._state:
                        # The deadline passed before the body ended: read() raises it.
                        raise TimeoutError
                    body = content.read_nowait()
                except BaseException:
                    response.close()  # as read() does
                    raise
            else:
                with self:  # a guarded wait: the deadline's cancel becomes TimeoutError
                    body = await response.read()
        except TRANSPORT_ERRORS as exc:
            raise connection_error(exc, what=self._what, timeout=self._seconds) from exc
        self._end()  # read whole: nothing left to time
        try:
            parsed = loads(body)
        except (ValueError, UnicodeDecodeError):
            # Let decode_json say what was wrong (empty, not JSON) and where.
            return decode_json(body, what=self._what, expect=expect)
        pin_exact_cost(parsed, body)  # usage.cost digit for digit, never through a float
        return parsed

    async def events(self, *, idle_timeout: float | None = None) -> AsyncIterator[str]:
        """Yield the ``data`` of each server-sent event (``"[DONE]"`` included).

        Keep-alive comments are skipped and do not count as activity: with
        ``idle_timeout``, a stream that sends nothing but keep-alives for that
        long raises :class:`RequestTimeout`.

        Raises:
            RequestTimeout: silence (or only keep-alives) for too long, or the
                total deadline passed.
            APIConnectionError: the connection broke mid-stream.
        """
        parser = SSEParser()
        loop = asyncio.get_running_loop()
        last_event = loop.time()
        chunks = self._response.content.iter_any()
        try:
            while True:
                # A guarded wait: a deadline that passed meanwhile raises TimeoutError on
                # entry, the deadline's own cancel becomes TimeoutError on exit.
                with self:
                    try:
                        chunk = await chunks.__anext__()
                    except StopAsyncIteration:
                        break
                events = parser.feed(chunk)
                if events:
                    last_event = loop.time()
                    for data in events:
                        yield data
                elif idle_timeout is not None and loop.time() - last_event > idle_timeout:
                    raise RequestTimeout(
                        f"{self._what}: no stream event within {idle_timeout:g} s "
                        "(only keep-alives)"
                    )
        except RequestTimeout:
            raise
        except TRANSPORT_ERRORS as exc:
            raise connection_error(exc, what=self._what, timeout=self._seconds) from exc
        except SSETooLong as exc:  # cut as a broken connection is: it may have been billed
            raise APIConnectionError(f"{self._what}: {exc}") from exc
        self._end()  # read to its end: nothing left to time
