"""Waiting in tests for a condition another task brings about (no fixed sleeps)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(condition: Callable[[], bool]) -> None:
    """Return once ``condition()`` holds; fail after 30 s."""
    for _ in range(6000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition never became true")
