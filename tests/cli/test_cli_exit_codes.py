"""A bad command exits 2, whichever sub-command and whatever is wrong with it,
with one line saying what and where, before anything is sent or written."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from provider_router.cli import EXIT_USAGE, main
from provider_router.testing import DEFAULT_TEST_KEY

Argv = Callable[[Path], list[str]]


def _prompts(tmp: Path) -> str:
    path = tmp / "p.jsonl"
    path.write_text('{"prompt": "hi"}\n')
    return str(path)


def _bad_plan(tmp: Path) -> str:
    path = tmp / "bad.yaml"
    path.write_text("model: m\nbudget: -1\nconcurrency: 0\ndatasets: []\n")
    return str(path)


CASES: dict[str, tuple[Argv, str]] = {
    "run without --budget": (
        lambda t: ["run", _prompts(t), "--model", "m", "--out", str(t / "o")],
        "--budget USD is required",
    ),
    "run with a missing prompts file": (
        lambda t: (
            ["run", str(t / "missing.jsonl"), "--model", "m", "--budget", "1", "--out", "o"]
        ),
        "does not exist",
    ),
    "run with a bad plan": (
        lambda t: ["run", "--plan", _bad_plan(t), "--out", str(t / "o")],
        "invalid plan",
    ),
    "run --exclude-below int3": (
        lambda t: (["run", _prompts(t), "--model", "m", "--exclude-below", "int3", "--out", "o"]),
        "invalid choice: 'int3'",
    ),
    "run without a prompts file or plan": (
        lambda t: ["run", "--model", "m", "--budget", "1", "--out", str(t / "o")],
        "give a prompts file",
    ),
    "project with a bad plan": (lambda t: ["project", _bad_plan(t)], "invalid plan"),
    "project --exclude-below int3": (
        lambda t: ["project", "--model", "m", "--exclude-below", "int3"],
        "invalid choice: 'int3'",
    ),
    "project of a prompts file instead of a plan": (
        lambda t: ["project", _prompts(t)],
        "a plan file must end in .yaml",
    ),
    "endpoints --exclude-below int3": (
        lambda t: ["endpoints", "m", "--exclude-below", "int3"],
        "invalid choice",
    ),
    "report of a directory that is not a run": (lambda t: ["report", str(t)], "no run here"),
    "status of a directory that is not a run": (lambda t: ["status", str(t)], "no run here"),
    "status of a missing directory": (
        lambda t: ["status", str(t / "nope")],
        "no such run directory",
    ),
    "ledger show of a missing file": (
        lambda t: ["ledger", "show", str(t / "ledger.sqlite")],
        "no ledger file",
    ),
    "export of a directory without outputs": (
        lambda t: ["export", str(t), "--to", str(t / "x.jsonl")],
        "holds no output files",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_command_exits_2_with_one_line_naming_the_mistake(
    case: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENROUTER_API_KEY", DEFAULT_TEST_KEY)
    argv, says = CASES[case]
    with pytest.raises(SystemExit) as exited:  # argparse's own usage errors exit here
        raise SystemExit(main(argv(tmp_path)))
    assert exited.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert says in err
    assert "Traceback" not in err
    assert not (tmp_path / "report.html").exists()  # refused, not written empty
