"""The README's set-up as a reader lives it: its snippets run, its example files work.

The Python snippets run in order in one namespace with top-level ``await``, as in
``python -m asyncio``, against the local OpenRouter (``OPENROUTER_BASE_URL``). The
whole tour — every command and every snippet, in the README's order — runs twice in
a row in one directory, as a reader who follows it and then follows it again.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import provider_router
from provider_router._constants import DISTRIBUTION
from provider_router.cli import build_parser, main
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
EXAMPLES = ROOT / "examples"
KIMI = "moonshotai/kimi-k2.5"


def python_snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def tour() -> list[tuple[str, str]]:
    """Every Python snippet (``("python", source)``) and every shell command
    (``("sh", line)``, continuation lines joined, comments dropped), in README order."""
    steps = []
    for language, body in re.findall(r"```(\w+)\n(.*?)```", README.read_text(), re.DOTALL):
        if language == "python":
            steps.append(("python", body))
        elif language == "sh":
            for line in body.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                if words:
                    steps.append(("sh", shlex.join(words)))
    return steps


# Commands the tour shows but a test cannot run, and why; every other one runs.
NOT_RUN = {
    "make test": "the test suite itself",
    ". .venv/bin/activate": "the tests already run in .venv",
    "pip install": "installs from the package index (its names: tests/test_distribution.py)",
    "--ray": "needs a Ray cluster and a Redis host (tests/ray)",
    "OPENROUTER_LIVE=1": "the real OpenRouter (tests/live)",
}
# A documented exit other than 0 (docs/batch.md, "Stopping"): the tour's prompts, a
# copy of examples/prompts.jsonl, cannot reach a 7M-token target.
EXPECTED_EXIT = {"provider-router run prompts/b3.jsonl": 6}


@contextlib.contextmanager
def _local_openrouter() -> Iterator[SimulatorServer]:
    """A local OpenRouter on a loop of its own: the tour's commands run their own loops."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="readme-openrouter", daemon=True)
    thread.start()

    async def start() -> SimulatorServer:
        sim = SimulatorServer(api_keys=[DEFAULT_TEST_KEY], speed=math.inf)
        await sim.start()
        return sim

    sim = asyncio.run_coroutine_threadsafe(start(), loop).result(60)
    try:
        yield sim
    finally:
        asyncio.run_coroutine_threadsafe(sim.stop(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(60)
        loop.close()


def _run_simulate(words: list[str]) -> None:
    """``provider-router simulate`` serves until Ctrl-C: start it, ask it, stop it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    args = [
        str(port) if prev == "--port" else w for prev, w in zip(["", *words], words, strict=False)
    ]
    with (
        subprocess.Popen(  # noqa: S603 - our own command line
            [sys.executable, "-m", "provider_router", *args[1:]],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as proc
    ):
        assert proc.stdout is not None
        first = proc.stdout.readline()
        try:
            assert first.startswith("Local OpenRouter at"), first
            url = f"http://127.0.0.1:{port}/api/v1/models"
            with urllib.request.urlopen(url, timeout=30) as response:
                assert response.status == 200
        finally:
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err


def _run_command(words: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    command = shlex.join(words)
    expected = next((code for k, code in EXPECTED_EXIT.items() if command.startswith(k)), 0)
    if words[:2] == ["make", "demo"]:
        code = main(["demo"])
    elif words[:2] == ["provider-router", "simulate"]:
        _run_simulate(words)
        return
    else:
        assert words[0] == "provider-router", f"the tour runs no {words[0]!r}: {command}"
        try:
            code = main(words[1:])
        except SystemExit as exit_:  # --help
            code = int(exit_.code or 0)
    captured = capsys.readouterr()
    assert code == expected, f"{command}: exit {code}\n{captured.out[-1500:]}{captured.err}"


# Money printed as people read it ("$4.54"), not as a Decimal's 26 digits.
LONG_DECIMAL = re.compile(r"\d\.\d{7,}")


def _run_snippet(
    index: int, source: str, namespace: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    code = compile(source, f"README.md step {index}", "exec", ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)

    async def run() -> None:
        result = eval(code, namespace)  # noqa: S307 - our own README
        if inspect.iscoroutine(result):
            await result

    asyncio.run(run())
    printed = capsys.readouterr().out
    assert not LONG_DECIMAL.search(printed), f"README step {index} printed {printed!r}"


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


@pytest.mark.slow
def test_the_readme_tour_runs_top_to_bottom_twice_in_one_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Followed as written, then followed again: nothing the first pass left breaks
    the second (a ledger topped up, a job already run, a demo already kept)."""
    shutil.copytree(EXAMPLES, tmp_path / "examples")
    (tmp_path / "prompts").mkdir()
    shutil.copy(EXAMPLES / "prompts.jsonl", tmp_path / "prompts" / "b3.jsonl")  # the reader's
    monkeypatch.chdir(tmp_path)
    steps = tour()
    commands = [line for kind, line in steps if kind == "sh"]
    assert commands[:2] == ["make demo", "make test"]
    ran: list[str] = []
    with _local_openrouter() as sim:
        monkeypatch.setenv("OPENROUTER_BASE_URL", sim.url)
        namespace: dict[str, Any] = {"__name__": "__readme__"}
        for _ in range(2):
            for index, (kind, text) in enumerate(steps, 1):
                if kind == "python":
                    _run_snippet(index, text, namespace, capsys)
                    ran.append(f"step {index}")
                    continue
                words = shlex.split(text)
                if any(key in text for key in NOT_RUN):
                    continue
                if words[0] == "export":  # the reader's own key: here, the test key
                    name = words[1].partition("=")[0]
                    monkeypatch.setenv(name, DEFAULT_TEST_KEY)
                    continue
                _run_command(words, capsys)
                ran.append(text)
        assert sim.requests
    # Every step but the NOT_RUN commands ran, twice, in the same order.
    assert ran[: len(ran) // 2] == ran[len(ran) // 2 :]
    assert len(ran) // 2 == len(steps) - sum(
        any(key in line for key in NOT_RUN) or line.startswith("export ") for _, line in steps
    )
    assert {"make demo", "provider-router ledger topup run.ledger --add 50"} <= set(ran)
    assert any(line.startswith("provider-router simulate") for line in ran)
    assert (tmp_path / "runs" / "demo" / "report.html").is_file()
    assert namespace["result"].provider


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


async def test_the_package_docstring_says_where_to_start_and_its_first_call_runs(
    monkeypatch: pytest.MonkeyPatch, openrouter_sim: SimulatorServer
) -> None:
    """``help(provider_router)``: what it is, the first call (it runs), the demo, the name."""
    doc = provider_router.__doc__ or ""
    assert "provider-router demo" in doc
    assert DISTRIBUTION in doc
    head, _, rest = doc.partition("::\n")
    assert "First call" in head
    example = []
    for line in rest.splitlines():
        if line.strip() and not line.startswith(" "):
            break
        example.append(line)
    monkeypatch.setenv("OPENROUTER_BASE_URL", openrouter_sim.url)
    monkeypatch.setenv("OPENROUTER_API_KEY", DEFAULT_TEST_KEY)
    source = textwrap.dedent("\n".join(example))
    namespace: dict[str, Any] = {}
    code = compile(source, "provider_router.__doc__", "exec", ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(code, namespace)  # noqa: S307 - our own docstring
    if inspect.iscoroutine(result):
        await result
    assert namespace["result"].provider == "Chutes"


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
