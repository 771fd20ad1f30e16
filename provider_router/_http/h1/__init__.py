"""A lean HTTP/1.1 client for the router's POSTs: keep-alive connections on asyncio protocols.

The router sends one request shape thousands of times (a POST of a JSON body, answered
whole or streamed), and aiohttp's ``ClientSession.post`` does much per request that this
shape does not need (docs/performance.md, "Where a request's CPU goes"). :class:`H1Pool`
is the bare exchange on an :class:`asyncio.Protocol`; GETs, and any session the caller
hands us, keep aiohttp (:mod:`provider_router._http.session`). Its rules keep money
safe: only a failure to connect (:class:`H1ConnectError`) proves a request was never
sent; a connection is reused only after an answer that ended cleanly; the framing is
llhttp's, and whatever llhttp leaves unbounded is bounded here (docs/client.md,
"Connections").
"""

from provider_router._http.h1.errors import H1ConnectError, H1ConnectTimeout, H1Error, H1ReadTimeout
from provider_router._http.h1.pool import KEEPALIVE_SECONDS, H1Pool
from provider_router._http.h1.response import H1Response

__all__ = [
    "KEEPALIVE_SECONDS",
    "H1ConnectError",
    "H1ConnectTimeout",
    "H1Error",
    "H1Pool",
    "H1ReadTimeout",
    "H1Response",
]
