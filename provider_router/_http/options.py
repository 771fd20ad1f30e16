"""What a caller may give the HTTP client beyond its URL and key: extra headers, TLS settings.

``Router``, ``Catalog`` and ``HttpClient`` check them when they are built, so a bad
option fails at once with an error naming it (never its value: a header may carry a
key), not at the first request.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from ssl import SSLContext
from typing import Final

from provider_router._exceptions import ConfigurationError

__all__ = ["OWNED_HEADERS", "check_headers", "check_ssl"]


OWNED_HEADERS: Final = frozenset(
    {
        "accept",
        "accept-encoding",
        "authorization",
        "connection",
        "content-encoding",
        "content-length",
        "content-type",
        "expect",
        "host",
        "keep-alive",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
"""Headers the client sets (or that frame the request): refused in ``headers=``."""


_TOKEN: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""A header name: RFC 9110's ``token``."""

_CONTROL: Final = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
"""What a header value cannot hold (RFC 9110 ``field-value``: a tab is allowed)."""


def check_headers(headers: Mapping[str, str], where: str) -> dict[str, str]:
    """``headers`` as a dict, once none of them is one the client sets itself.

    Raises:
        ConfigurationError: a name in :data:`OWNED_HEADERS`, a name or value that is
            not a string or holds a line break; names the header, never its value
            (it may be a key).
    """
    checked: dict[str, str] = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise ConfigurationError(f"{where}: header names and values must be strings")
        if name.strip().lower() in OWNED_HEADERS:
            raise ConfigurationError(
                f"{where}: {name.strip()!r} is set by provider_router itself and cannot be given"
            )
        if not _TOKEN.fullmatch(name):
            # A space, a colon or a line break would smuggle another header into the head
            # (" X: 1" continues the line before; "Host:x" is a Host header).
            raise ConfigurationError(f"{where}: {_not_a_token(name)}")
        if _CONTROL.search(value):
            raise ConfigurationError(
                f"{where}: the {name!r} header holds a line break or another control "
                "character, which HTTP cannot carry"
            )
        if any(name.lower() == seen.lower() for seen in checked):
            raise ConfigurationError(
                f"{where}: the {name!r} header is given twice (names are case-insensitive)"
            )
        checked[name] = value
    return checked


def check_ssl(context: SSLContext | None) -> SSLContext | None:
    """``context`` once it is an :class:`ssl.SSLContext` (or ``None``: the system's CAs).

    Raises:
        ConfigurationError: anything else (``ssl=False`` does not turn verification off).
    """
    if context is not None and not isinstance(context, SSLContext):
        raise ConfigurationError(f"ssl must be an ssl.SSLContext, got {type(context).__name__}")
    return context


def _not_a_token(name: str) -> str:
    """Why ``name`` is no header name, shown up to its first wrong character only: what
    follows may be a value pasted in with it (``"Authorization: Bearer sk-..."``)."""
    if not name:
        return "an empty header name"
    found = _TOKEN.match(name)
    start = found.end() if found else 0
    where = (
        f"the header name {name[:start][:40]!r} is followed by"
        if start
        else "a header name starts with"
    )
    return (
        f"{where} {name[start]!r}, which no header name can hold "
        "(letters, digits and !#$%&'*+-.^_`|~ only, RFC 9110)"
    )
