"""Scrubbing API keys out of everything we store, print or raise.

A server can echo the key back anywhere (an error's message or metadata, a relayed
upstream body, a header), and the key must reach no exception, log line or file.
Every HTTP client registers its key here (:func:`remember`); the exceptions of talking
to OpenRouter pass their text, body and headers through :func:`scrub` /
:func:`scrub_json` when they are built, so whatever derives from them is clean too.
Keys that look like OpenRouter's (``sk-or-...``) are scrubbed even when never seen.
The registry is process-wide on purpose: an exception does not know which client
raised it, and a key known to any client of this process is a secret everywhere.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["REDACTED", "remember", "scrub", "scrub_json"]

REDACTED: Final = "***"
_KEY_PATTERN: Final = re.compile(r"sk-or-[A-Za-z0-9_-]{8,}")
_MIN_SECRET: Final = 6
"""Shorter strings are not scrubbed: replacing them would mangle ordinary text."""

_secrets: set[str] = set()


def remember(secret: str) -> None:
    """Scrub ``secret`` from every message and body built from now on."""
    if len(secret) >= _MIN_SECRET:
        _secrets.add(secret)


def scrub(text: str) -> str:
    """``text`` with every known secret (and anything shaped like an OpenRouter key)
    replaced by ``***``."""
    if "sk-or-" in text:
        text = _KEY_PATTERN.sub("sk-or-" + REDACTED, text)
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def scrub_json(value: Any) -> Any:
    """A copy of a decoded JSON value with :func:`scrub` applied to every string,
    keys included (mappings become dicts)."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, Mapping):
        return {scrub(str(k)): scrub_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub_json(v) for v in value]
    return value
