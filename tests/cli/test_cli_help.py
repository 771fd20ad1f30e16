"""``--help`` of every command reads cleanly: each option explained, each default once,
no reStructuredText markup, and ``run`` shows the defaults the README promises."""

from __future__ import annotations

import argparse
import re

import pytest

from provider_router.cli import build_parser


def _commands() -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        found[prefix] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{prefix} {name}".strip())

    walk(build_parser(), "")
    return found


COMMANDS = _commands()


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_option_has_help_and_each_default_is_shown_once(command: str) -> None:
    parser = COMMANDS[command]
    missing = [
        "/".join(a.option_strings) or a.dest
        for a in parser._actions
        if not isinstance(a, argparse._SubParsersAction)
        and a.help != argparse.SUPPRESS
        and not (a.help or "").strip()
    ]
    assert missing == [], f"{command or 'provider-router'}: options without help"
    text = parser.format_help()
    assert "``" not in text, "reStructuredText markup in --help"
    assert not re.search(r"`[^`\n]+`", text), "backticks shown as text"
    assert not re.search(r"\(default:? [^)]*\)[^(\n]*\(default", text), "a default twice"
    for line in text.splitlines():
        assert line.count("default") <= 1 or "(default" not in line, line


def test_run_help_shows_the_defaults_the_plan_applies() -> None:
    text = " ".join(COMMANDS["run"].format_help().split())
    assert "(default: 8192, or the plan" in text  # --max-tokens, as the README says
    assert "(default: 256, or the plan" in text  # --concurrency
