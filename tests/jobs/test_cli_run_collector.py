"""`provider-router run` sets its own process's garbage collector; `main()` in a host does not.

A run keeps thousands of requests in flight for hours: the command's own process
freezes its start-up heap and collects the young generation ten times less often
(provider_router/_collector.py). A program that calls ``provider_router.cli.main``
keeps its collector as it set it. Each case runs in a fresh interpreter: the
collector's settings are process-wide.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from _job_helpers import DEFAULT_TEST_KEY, write_prompts

from provider_router._collector import GEN0_THRESHOLD
from provider_router.testing import SimulatorServer

Factory = Callable[..., Awaitable[SimulatorServer]]
MODEL = "moonshotai/kimi-k2.5"

# Reports the collector as the process ends (after `run()`'s sys.exit too).
_REPORT = """
import atexit, gc, json, sys
atexit.register(lambda: print("GC " + json.dumps({
    "threshold": gc.get_threshold(), "frozen": gc.get_freeze_count()}), file=sys.stderr))
"""


async def _python(code: str) -> tuple[int, dict[str, object], str]:
    env = dict(os.environ, OPENROUTER_API_KEY=DEFAULT_TEST_KEY)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        textwrap.dedent(_REPORT) + textwrap.dedent(code),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    _, err = await proc.communicate()
    assert proc.returncode is not None
    text = err.decode()
    line = next(x for x in reversed(text.splitlines()) if x.startswith("GC "))
    return proc.returncode, json.loads(line.removeprefix("GC ")), text


def _argv(tmp_path: Path, url: str) -> list[str]:
    prompts = write_prompts(tmp_path / "p.jsonl", 20)
    return [
        "run", str(prompts), "--out", str(tmp_path / "out"), "--model", MODEL,
        "--budget", "1", "--max-tokens", "16", "--base-url", url, "--progress", "off",
    ]  # fmt: skip


async def test_the_console_command_tunes_its_own_collector(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=3)
    argv = ["provider-router", *_argv(tmp_path, sim.url)]
    code, state, err = await _python(
        f"""
        sys.argv = {argv!r}
        from provider_router.cli import run
        run()
        """
    )
    assert code == 0, err[-2000:]
    assert state["threshold"] == [GEN0_THRESHOLD, 10, 10]
    assert isinstance(state["frozen"], int)
    assert state["frozen"] > 1000


@pytest.mark.parametrize("own_process", [False, True])
async def test_main_in_a_host_leaves_its_collector_alone(
    tmp_path: Path, openrouter_sim_factory: Factory, own_process: bool
) -> None:
    sim = await openrouter_sim_factory(seed=3)
    code, state, err = await _python(
        f"""
        import gc
        gc.set_threshold(900, 11, 12)  # the host's own choice
        from provider_router.cli import main
        sys.exit(main({_argv(tmp_path, sim.url)!r}, own_process={own_process}))
        """
    )
    assert code == 0, err[-2000:]
    if own_process:
        assert state["threshold"] == [GEN0_THRESHOLD, 11, 12]
        assert isinstance(state["frozen"], int)
        assert state["frozen"] > 1000
    else:
        assert state == {"threshold": [900, 11, 12], "frozen": 0}
