"""Waiting in tests for a condition another task brings about (no fixed sleeps)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def until(condition: Callable[[], bool]) -> None:
    """Return once ``condition()`` holds; fail after 30 s."""
    for _ in range(6000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition never became true")


def wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    """Block (in a thread with no loop of its own) until ``condition()`` holds, or
    ``timeout`` seconds have passed: whether it held. For another process or thread's
    progress (the simulator's requests, a CLI in a subprocess), not a clock."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True
