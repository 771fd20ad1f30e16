"""argparse as users expect it: the mistake first and short, in the command's own usage,
with a "did you mean"; no abbreviations; every missing flag named at once; ``run --help``
with the everyday flags first and every default shown."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from provider_router.cli import build_parser, main

SNAPSHOT = Path(__file__).parents[2] / "examples" / "market.json"


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    """stderr of a command argparse refuses (exit 2), as lines."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err.splitlines()


def test_a_mistyped_flag_gets_the_commands_usage_and_a_suggestion(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = refused(["run", "p.jsonl", "--out", "o", "--concurency", "8"], capsys)
    assert err[0] == (
        "provider-router run: error: unrecognized arguments: --concurency 8 "
        "(did you mean --concurrency?)"
    )
    assert err[1].startswith("usage: provider-router run ")  # run's usage, not the top level's
    assert len(err) == 3  # the error, one line of usage, where the rest is


def test_a_flag_like_none_gets_no_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    # Every option starts with "--": only what follows says how close two are.
    err = refused(["merge", "runs/a", "runs/b", "--out", "m", "--bogus"], capsys)
    assert err[0] == "provider-router merge: error: unrecognized arguments: --bogus"
    err = refused(["run", "p.jsonl", "--out", "o", "--max-token", "9"], capsys)
    assert err[0].endswith("--max-token 9 (did you mean --max-tokens?)")


def test_no_abbreviations(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(["run", "p.jsonl", "--out", "o", "--budg", "1"], capsys)
    assert "unrecognized arguments: --budg 1 (did you mean --budget?)" in err[0]


def test_a_bad_value_is_the_first_line_and_the_usage_is_short(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = refused(["run", "p.jsonl", "--out", "o", "--budget", "0"], capsys)
    assert err[0] == (
        "provider-router run: error: argument --budget: a budget must be more than $0, got '0'"
    )
    assert len(err) == 3


def test_a_mistyped_command_or_choice_gets_a_suggestion(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = refused(["endpiont", "moonshotai/kimi-k2.5"], capsys)
    assert err[0] == (
        "provider-router: error: argument COMMAND: invalid choice: 'endpiont' "
        "(did you mean 'endpoints'?)"
    )
    err = refused(["endpoints", "m/x", "--exclude-below", "int3"], capsys)
    assert err[0].endswith("invalid choice: 'int3' (did you mean 'int4'?)")


def test_a_top_level_flag_after_the_command_says_where_it_goes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = refused(["status", "runs/b3", "--log-level", "debug"], capsys)
    assert "--log-level goes before the command: provider-router --log-level ... status" in err[0]


def test_every_missing_flag_of_run_is_named_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--out", "o"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    for missing in ("PROMPTS.jsonl", "--model", "--budget USD"):
        assert missing in err


def test_every_missing_flag_of_project_is_named_at_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["project", "--model", "moonshotai/kimi-k2.5", "--datasets", "6"]
    assert main([*argv, "--snapshot", str(SNAPSHOT)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    for missing in ("--target-output-tokens N", "--prompt-tokens N", "--completion-tokens N"):
        assert missing in err


def _run_help() -> tuple[argparse.ArgumentParser, str]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    run = action.choices["run"]
    return run, run.format_help()


def test_run_help_puts_the_everyday_flags_first_and_the_rest_in_named_groups() -> None:
    _, text = _run_help()
    assert text.startswith(
        "usage: provider-router run [PROMPTS.jsonl ...] --out DIR "
        "(--model M --budget USD | --plan FILE) [options]\n"
    )
    groups = [line for line in text.splitlines() if line and not line.startswith(" ")]
    assert groups[groups.index("options:") :] == [
        "options:",
        "checks before and during the run:",
        "the Batch API route (datasets with route: batch; docs/batch.md):",
        "a key of the job's own, and metrics:",
        "one budget in Redis (docs/workers.md):",
        "beyond one machine on Ray (docs/workers.md):",
    ]
    everyday = text[text.index("options:") : text.index("checks before")]
    for flag in ("--out", "--model", "--budget", "--max-tokens", "--concurrency", "--progress"):
        assert f"  {flag} " in everyday
    for flag in ("--batch-size", "--own-key", "--ledger", "--ray", "--verify"):
        assert f"  {flag} " not in everyday


def test_run_help_shows_every_default() -> None:
    run, _ = _run_help()
    formatter = run._get_formatter()
    missing = []
    for action in run._actions:
        if not action.option_strings or action.nargs == 0 or action.help == argparse.SUPPRESS:
            continue
        shown = formatter._expand_help(action)
        if "default" not in shown and "required" not in shown:
            missing.append(action.option_strings[-1])
    assert missing == []
    text = " ".join(run.format_help().split())
    assert "--exclude-below Q lowest precision allowed" in text
    assert "(default: no floor, or the plan's policy)" in text
    assert "--temperature T sampling temperature (default:" in text
