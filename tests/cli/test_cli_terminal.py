"""The command line's tables as a person reads them: in a real terminal (tmux) 80, 100
and 120 columns wide, every table line fits the screen (the terminal wraps none), no
name or number is cut, and each row's figures are on the row's own line."""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from _job_helpers import write_prompts
from _terminal import Screen, in_terminal

from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

ROOT = Path(__file__).parents[2]
SNAPSHOT = str(ROOT / "examples" / "market.json")
MODEL = "moonshotai/kimi-k2.5"
BOX = set("┏┳┓┃┡╇┩│├┼┤└┴┘━─")
COMMAND = [sys.executable, "-m", "provider_router"]
Factory = Callable[..., Awaitable[SimulatorServer]]

pytestmark = pytest.mark.slow


def read(screen: Screen, columns: int, *, paths: bool = False) -> str:
    """The screen's text, after checking what a person would notice first: nothing cut,
    nothing the terminal had to wrap (with ``paths``: but a line naming a long path)."""
    text = "\n".join(screen.lines)
    assert "…" not in text, f"a cell was cut:\n{text}"
    for line in screen.printed:
        if len(line) > columns:
            assert paths, f"wrapped at {columns} columns:\n{text}"
            assert not BOX & set(line), f"a table line wrapped at {columns} columns:\n{text}"
    return text


def row(text: str, name: str) -> str:
    """The screen line of the table row named ``name``."""
    for line in text.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃]", line) if c.strip()]
        if name in cells[:2]:
            return line
    raise AssertionError(f"no row for {name!r} in:\n{text}")


@pytest.mark.parametrize("columns", [80, 100, 120])
def test_endpoints_and_project(columns: int) -> None:
    endpoints = [*COMMAND, "endpoints", MODEL, "--exclude-below", "int4", "--snapshot", SNAPSHOT]
    text = read(in_terminal(endpoints, columns=columns), columns)
    assert len(text.splitlines()) <= 45  # eleven endpoints and their reasons
    for name in ("Chutes", "DeepInfra", "Moonshot AI", "SiliconFlow", "Fireworks", "BaseTen"):
        assert "$0." in row(text, name)  # whole, with its price on its line
    assert "nvfp4 is below the int4 floor" in text
    project = [*COMMAND, "project", "--model", MODEL, "--datasets", "6"]
    project += ["--target-output-tokens", "10M", "--prompt-tokens", "200"]
    project += ["--completion-tokens", "2000", "--budget", "100", "--snapshot", SNAPSHOT]
    text = read(in_terminal(project, columns=columns), columns)
    assert "$134.70" in row(text, "total")
    assert "EXCEEDS the $100.00 budget" in text


async def test_a_run_its_status_its_ledger_and_verify(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=3, speed=1000)
    env = {"OPENROUTER_API_KEY": DEFAULT_TEST_KEY}
    prompts = write_prompts(tmp_path / "p.jsonl", 150)
    for columns in (80, 100, 120):
        out = tmp_path / f"run-{columns}"
        run = [*COMMAND, "run", str(prompts), "--out", str(out), "--model", MODEL]
        run += ["--budget", "1", "--max-tokens", "200", "--name", "conversations-long-name"]
        run += ["--base-url", sim.url, "--exclude-below", "int4"]
        screen = await asyncio.to_thread(in_terminal, run, columns=columns, env=env)
        text = read(screen, columns, paths=True)  # "Summary: <its path>"
        assert "150/150" in row(text, "conversations-long-name")
        status = [*COMMAND, "status", str(out)]
        screen = await asyncio.to_thread(in_terminal, status, columns=columns)
        text = read(screen, columns, paths=True)  # "<its path>: finished"
        assert "150/150" in row(text, "conversations-long-name")
        ledger = [*COMMAND, "ledger", "show", str(out)]
        text = read(await asyncio.to_thread(in_terminal, ledger, columns=columns), columns)
        assert text.startswith("limit      $1\n")
        verify = [*COMMAND, "verify", MODEL, "--exclude-below", "int4", "--base-url", sim.url]
        verify += ["--tool-samples", "0"]
        screen = await asyncio.to_thread(in_terminal, verify, columns=columns, env=env)
        text = read(screen, columns)
        assert "pass" in row(text, "chutes")


async def test_project_with_its_routes_against_the_simulator(
    openrouter_sim_factory: Factory,
) -> None:
    # The routes' sentences (a Batch API route or none) come from the market's
    # listings; a snapshot has none, so the terminal reads them from the simulator.
    sim = await openrouter_sim_factory(seed=3)
    for columns in (80, 100, 120):
        for model, said in (("moonshotai/kimi-k3", "Batch saves $"), (MODEL, "Batch route: ")):
            project = [*COMMAND, "project", "--model", model, "--datasets", "6"]
            project += ["--target-output-tokens", "10M", "--prompt-tokens", "200"]
            project += ["--completion-tokens", "2000", "--budget", "100", "--base-url", sim.url]
            screen = await asyncio.to_thread(in_terminal, project, columns=columns)
            text = read(screen, columns)
            assert said in text
            assert "dataset-6 sync" in " ".join(text.split())  # a name broken at no hyphen
