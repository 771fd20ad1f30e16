"""The reference ``provider-router project`` call, shared by the CLI and planning tests."""

from __future__ import annotations

import asyncio

from provider_router.cli import main

MODEL = "moonshotai/kimi-k2.5"
REFERENCE = [
    "project",
    "--model",
    MODEL,
    "--datasets",
    "6",
    "--target-output-tokens",
    "10M",
    "--prompt-tokens",
    "200",
    "--completion-tokens",
    "2000",
    "--budget",
    "100",
    "--exclude-below",
    "int4",
]


async def run_cli(argv: list[str]) -> int:
    # main() runs its own event loop; the simulator serves on this test's loop.
    return await asyncio.to_thread(main, argv)
