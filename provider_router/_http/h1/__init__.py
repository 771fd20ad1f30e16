"""A lean HTTP/1.1 client for the router's POSTs: keep-alive connections on asyncio protocols.

aiohttp's ``ClientSession.post`` costs ~120 µs of CPU a request (building a
``ClientRequest``, cookie and header merging, the connector's bookkeeping, a
payload writer, a response object with a stream reader); the bare exchange on
an :class:`asyncio.Protocol` costs a third of that (docs/performance.md, "#13
wave 6"). :class:`H1Pool` is that exchange, for the one request shape the
router sends thousands of times: a POST of a JSON body, answered by a whole
body or a stream (``Content-Length``, ``chunked`` or close-delimited). GETs
and any session the caller hands us keep aiohttp (:mod:`provider_router._http.session`).

What it does, and why each rule keeps money safe:

* **Sent or not.** A request counts as sent from the moment its bytes are
  handed to the socket. Only a failure to open the connection (refused, DNS,
  TLS handshake, a proxy's refusal, connect timeout) is :class:`H1ConnectError`,
  the one error that proves nothing reached the server; everything after is
  :class:`H1Error`. A request still waiting for a connection when its deadline
  cancels it is marked so (``exchange._unsent``): never sent either.
* **Reuse only what is known clean.** A connection goes back to the pool only
  when its answer ended cleanly, the server did not ask to close it, and
  nothing arrived after the answer. A cancel, a failure or an answer still
  arriving closes it: a late answer can never be read as the next request's.
* **Idle connections age out** after :data:`KEEPALIVE_SECONDS` (aiohttp's 15 s),
  or a margin before the server's ``Keep-Alive: timeout=N``: a server may close an
  idle connection just as we reuse it. An idle reaper closes them once expired.
* **Connecting**: the origin's addresses (one lookup shared by all) are raced as
  RFC 8305 says (``aiohappyeyeballs``); through the environment's proxy
  (:mod:`.proxy`) an HTTPS origin is reached by a ``CONNECT`` tunnel.
* **Framing is llhttp's** (through ``httptools``), with aiohttp's leniencies;
  everything it does not bound is bounded here (:mod:`.limits`): a hostile answer
  is an error within its deadline, never a stalled loop or gigabytes of memory.
* ``Accept-Encoding: identity`` is sent; a ``gzip``/``deflate`` body is decoded
  anyway, bounded (:mod:`.decoding`); any other coding fails when the body is
  read, so an error status still reaches the caller.
  Redirects are not followed: a 3xx is an error status like any other.

Modules: :mod:`.errors`, :mod:`.limits`, :mod:`.decoding` (gzip/deflate, bounded),
:mod:`.response` (one answer, whole or streamed),
:mod:`.connection` (one connection: writing a request, framing its answer),
:mod:`.resolver` (the origin's addresses, looked up once per 10 s and shared),
:mod:`.proxy` (the environment's proxy, and the ``CONNECT`` tunnel through it),
:mod:`.pool` (connections to one origin, their limit and reuse).
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
