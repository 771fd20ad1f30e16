"""The proxy a request goes through, chosen from the environment as requests and httpx do.

``HTTPS_PROXY`` / ``HTTP_PROXY`` by the origin's scheme, else ``ALL_PROXY`` (which
aiohttp's ``trust_env`` ignores), and ``NO_PROXY`` to go direct: read by
:mod:`urllib.request`, as requests itself falls back to, plus the CIDR ranges and
``host:port`` entries requests, httpx and curl match. Only ``http://`` proxies are
spoken to: an HTTPS origin through a ``CONNECT`` tunnel (:func:`open_tunnel`), an
HTTP origin by sending the proxy the absolute URL.

A proxy's credentials travel only in the ``Proxy-Authorization`` header: reprs and
errors name its host and port alone, and a server's echo of them is scrubbed.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import urllib.request
from typing import Final

from pydantic import SecretStr
from yarl import URL

from provider_router._exceptions import ConfigurationError
from provider_router._http.h1.errors import H1ConnectError
from provider_router._secrets import remember

__all__ = [
    "MAX_PROXY_REPLY_BYTES",
    "PROXY_GATEWAY_STATUSES",
    "Proxy",
    "open_tunnel",
    "proxy_for",
    "tunnel_reader",
]

MAX_PROXY_REPLY_BYTES: Final = 8190
"""A proxy's answer to ``CONNECT`` longer than this (before its blank line) is refused."""

PROXY_GATEWAY_STATUSES: Final = frozenset({502, 504})
"""Statuses a plain-HTTP proxy gives when its upstream failed or timed out (RFC 9110
§15.6.3, §15.6.5): the request may have reached the origin, which may bill it, so the
lean pool reports them as a transport failure after sending, never as a free error
status. (Through a ``CONNECT`` tunnel the proxy cannot answer for the origin.)"""


class Proxy:
    """An ``http://`` proxy: where it listens and, if any, the credentials it asks for."""

    __slots__ = ("authorization", "host", "port")

    def __init__(self, host: str, port: int, authorization: SecretStr | None = None) -> None:
        self.host = host
        self.port = port
        self.authorization = authorization
        """The ``Proxy-Authorization`` header's value (``Basic ...``), or ``None``."""

    def __repr__(self) -> str:
        auth = ", with credentials" if self.authorization is not None else ""
        return f"Proxy({self.authority}{auth})"

    @property
    def authority(self) -> str:
        """``host:port`` (brackets around an IPv6 address)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def headers(self) -> dict[str, str]:
        """The headers every request through this proxy carries (its credentials)."""
        if self.authorization is None:
            return {}
        return {"Proxy-Authorization": self.authorization.get_secret_value()}


def proxy_for(url: URL) -> Proxy | None:
    """The proxy the environment names for ``url``, or ``None`` to connect directly.

    Raises:
        ConfigurationError: the proxy is not an ``http://`` one (``https://`` and
            ``socks5://`` proxies are not supported); names its host, never its
            credentials.
    """
    if _bypassed(url):
        return None
    proxies = urllib.request.getproxies()
    raw = proxies.get(url.scheme) or proxies.get("all")
    if not raw:
        return None
    if "://" not in raw:
        raw = f"http://{raw}"  # "proxy:3128" means an http:// proxy, as requests reads it
    try:
        proxy_url = URL(raw)
        port = proxy_url.port
    except ValueError:
        raise ConfigurationError(
            f"the proxy the environment names for {url.scheme}:// URLs is not a valid URL"
        ) from None
    if proxy_url.user is not None or proxy_url.password is not None:
        for secret in (proxy_url.password, proxy_url.raw_password):
            if secret:
                remember(secret)  # scrubbed from any message a server echoes it into
    where = f"{proxy_url.raw_host}:{port}"
    if proxy_url.scheme != "http" or not proxy_url.raw_host or port is None:
        raise ConfigurationError(
            f"the proxy for {url.scheme}:// URLs ({proxy_url.scheme}://{where}, from the "
            "environment) is not supported: only http:// proxies are "
            "(docs/client.md, 'Connections')"
        )
    authorization = None
    if proxy_url.user is not None:
        pair = f"{proxy_url.user}:{proxy_url.password or ''}".encode()
        token = base64.b64encode(pair).decode("ascii")
        remember(token)
        authorization = SecretStr(f"Basic {token}")
    return Proxy(proxy_url.raw_host, port, authorization)


def _bypassed(url: URL) -> bool:
    """Whether ``NO_PROXY`` names ``url``'s host: as :func:`urllib.request.proxy_bypass`
    matches it (names, domain suffixes, ``*``), plus what requests, httpx and curl also
    match there: a ``host:port`` entry for that port alone, and an IP address inside a
    CIDR range (``10.0.0.0/8``, ``fd00::/8``)."""
    host = url.raw_host or ""
    if not host:
        return False
    port = url.explicit_port
    # "host:port" lets urllib compare an entry's port too (its plain entries still match);
    # an IPv6 address is passed alone, its colons are not a port.
    if urllib.request.proxy_bypass(host if port is None or ":" in host else f"{host}:{port}"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    entries = urllib.request.getproxies_environment().get("no", "")
    for entry in entries.split(","):
        if "/" in entry:
            try:
                if address in ipaddress.ip_network(entry.strip(), strict=False):
                    return True
            except ValueError:
                continue  # not a range: urllib has already judged it
    return False


class _TunnelReply(asyncio.Protocol):
    """Reads a proxy's answer to ``CONNECT`` (its head only: nothing else is expected)."""

    def __init__(self, done: asyncio.Future[bytes]) -> None:
        self._done = done
        self._buffer = b""

    def data_received(self, data: bytes) -> None:
        if self._done.done():
            return  # answered (or refused): nothing more is read before TLS starts
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end > MAX_PROXY_REPLY_BYTES or (end < 0 and len(self._buffer) > MAX_PROXY_REPLY_BYTES):
            # Whether or not its end came in the same read: the limit is the head's.
            self._done.set_exception(
                H1ConnectError(
                    f"the proxy's answer to CONNECT is too long (over {MAX_PROXY_REPLY_BYTES:,} "
                    "bytes, MAX_PROXY_REPLY_BYTES)"
                )
            )
        elif end >= 0:
            self._done.set_result(self._buffer[:end])

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._done.done():
            self._done.set_exception(H1ConnectError("the proxy closed the connection at CONNECT"))


async def open_tunnel(
    transport: asyncio.Transport, reply: asyncio.Future[bytes], proxy: Proxy, authority: str
) -> None:
    """Ask ``proxy`` (connected on ``transport``, its protocol a :func:`tunnel_reader`)
    for a tunnel to ``authority``; returns once it is open.

    Raises:
        H1ConnectError: the proxy refused (its status says why) or broke the exchange;
            the request was never sent.
    """
    lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
    lines += [f"{name}: {value}" for name, value in proxy.headers().items()]
    transport.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    head = await reply
    status_line = head.split(b"\r\n", 1)[0]
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or parts[1] != b"200":
        said = status_line[:80].decode("latin-1")
        raise H1ConnectError(
            f"the proxy {proxy.authority} refused a tunnel to {authority}: {said!r}"
        )


def tunnel_reader(
    loop: asyncio.AbstractEventLoop,
) -> tuple[asyncio.Protocol, asyncio.Future[bytes]]:
    """A protocol to connect to a proxy with, and the future of its ``CONNECT`` answer's head."""
    reply: asyncio.Future[bytes] = loop.create_future()
    return _TunnelReply(reply), reply
