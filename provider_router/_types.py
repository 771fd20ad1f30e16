"""Type aliases and small protocols shared across the package.

Time and randomness are injected wherever they matter, so tests never really
wait and every scenario is reproducible by seed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

ModelId: TypeAlias = str
"""An OpenRouter model id such as ``"moonshotai/kimi-k2.5"``."""

ProviderSlug: TypeAlias = str
"""A routing slug (an endpoint ``tag`` such as ``"chutes"`` or ``"deepinfra/fp4"``)."""

JSONObject: TypeAlias = dict[str, Any]
"""A decoded JSON object."""

Message: TypeAlias = dict[str, Any]
"""One OpenAI-format chat message (``{"role": ..., "content": ...}``)."""

Clock: TypeAlias = Callable[[], float]
"""Monotonic seconds, like :func:`time.monotonic`."""

Sleep: TypeAlias = Callable[[float], Awaitable[None]]
"""An awaitable sleep, like :func:`asyncio.sleep`."""
