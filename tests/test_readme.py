"""The README's set-up as a reader lives it: its snippets run, its example files work.

The Python snippets run in order in one namespace with top-level ``await``, as in
``python -m asyncio``, against the local OpenRouter (``OPENROUTER_BASE_URL``).
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

import provider_router
from provider_router.cli import build_parser, main
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
EXAMPLES = ROOT / "examples"
KIMI = "moonshotai/kimi-k2.5"


def python_snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_keeps_its_first_two_set_up_commands() -> None:
    first = re.search(r"```sh\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert first is not None
    assert first.group(1).splitlines() == [
        "make demo   # the main job on the embedded local OpenRouter: no network, no key",
        "make test   # lint, type-check and the whole test suite",
    ]


def test_readme_says_where_the_key_goes_and_how_to_run_snippets() -> None:
    text = README.read_text()
    assert "export OPENROUTER_API_KEY=" in text
    assert ". .venv/bin/activate" in text
    assert "python -m asyncio" in text
    assert "asyncio.run(main())" in text


async def test_every_readme_python_snippet_runs_against_the_local_openrouter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, openrouter_sim: SimulatorServer
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENROUTER_BASE_URL", openrouter_sim.url)
    monkeypatch.setenv("OPENROUTER_API_KEY", DEFAULT_TEST_KEY)
    snippets = python_snippets()
    assert len(snippets) >= 4
    namespace: dict[str, Any] = {"__name__": "__readme__"}
    for index, source in enumerate(snippets):
        code = compile(
            source, f"README.md snippet {index + 1}", "exec", ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        )
        result = eval(code, namespace)  # noqa: S307 - our own README
        if inspect.iscoroutine(result):
            await result
    # What the snippets did happened on the local OpenRouter.
    assert openrouter_sim.requests
    assert namespace["result"].provider
    assert namespace["ranked"][0].endpoint.slug


async def test_the_readme_snippets_paste_cleanly_into_python_m_asyncio(
    tmp_path: Path, openrouter_sim: SimulatorServer
) -> None:
    """Pasted as a reader pastes them: into the REPL, line by line, through a pipe.

    The REPL ends a block only at a blank line: a top-level line right after an
    indented one is a SyntaxError there, though ``exec`` would take it.
    """
    env = {
        **os.environ,
        "OPENROUTER_BASE_URL": openrouter_sim.url,
        "OPENROUTER_API_KEY": DEFAULT_TEST_KEY,
    }
    pasted = "".join(python_snippets()) + "print('README-DONE', result.provider)\n"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "asyncio",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, cwd=tmp_path, env=env,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(pasted.encode()), 120)
    text = out.decode() + err.decode()
    assert "Traceback" not in text, text[-3000:]
    assert "SyntaxError" not in text, text[-3000:]
    assert "README-DONE Chutes" in text, text[-3000:]


def test_examples_ship_what_the_readme_uses() -> None:
    text = README.read_text()
    for name in ("plan.yaml", "faults.yaml", "market.json"):
        assert (EXAMPLES / name).is_file()
        assert f"examples/{name}" in text
    assert (EXAMPLES / "prompts.jsonl").read_text().count("\n") >= 10


def test_the_example_market_and_plan_work_offline(capsys: pytest.CaptureFixture[str]) -> None:
    market = str(EXAMPLES / "market.json")
    assert main(["endpoints", KIMI, "--snapshot", market, "--exclude-below", "int4"]) == 0
    assert "Fireworks" in capsys.readouterr().out
    plan = str(EXAMPLES / "plan.yaml")
    assert main(["project", plan, "--snapshot", market, "--completion-tokens", "600"]) == 0
    out = capsys.readouterr().out
    assert "code" in out
    assert "chat" in out


async def test_the_example_plan_runs_on_the_local_openrouter_with_the_example_faults(
    tmp_path: Path, openrouter_sim_factory: Any
) -> None:
    sim = await openrouter_sim_factory(seed=11, faults=str(EXAMPLES / "faults.yaml"))
    out = tmp_path / "run"
    env = {**os.environ, "OPENROUTER_API_KEY": DEFAULT_TEST_KEY}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "provider_router", "run", "--plan", str(EXAMPLES / "plan.yaml"),
        "--out", str(out), "--base-url", sim.url, "--progress", "off",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    _, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reason"] == "complete"
    assert {name: d["completed"] for name, d in summary["datasets"].items()} == {
        "code": 12,
        "chat": 4,
    }
    assert any(k.startswith("fault.") for k in sim.log.counters), sim.log.counters


def test_save_snapshot_writes_what_snapshot_reads_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "market.json"
    source = str(EXAMPLES / "market.json")
    assert (
        main(["endpoints", KIMI, "--snapshot", source, "--json", "--save-snapshot", str(saved)])
        == 0
    )
    first = json.loads(capsys.readouterr().out)
    assert main(["endpoints", KIMI, "--snapshot", str(saved), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == first


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"provider-router {provider_router.__version__}\n"


def _commands(parser: Any, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    found = []
    for action in parser._actions:
        if hasattr(action, "choices") and isinstance(action.choices, dict):
            for name, sub in action.choices.items():
                found.append(((*prefix, name), sub))
                found += _commands(sub, (*prefix, name))
    return found


def test_every_command_has_a_description_and_shows_its_defaults() -> None:
    commands = dict(_commands(build_parser()))
    assert {("demo",), ("ledger",), ("run",), ("ledger", "show")} <= set(commands)
    for name, parser in commands.items():
        assert parser.description, f"{' '.join(name)} has no description"
    run_help = commands[("run",)].format_help()
    assert re.search(r"--progress .*\(default: auto\)", " ".join(run_help.split()))
    top = build_parser().format_help()
    assert "(default: warning)" in " ".join(top.split())
