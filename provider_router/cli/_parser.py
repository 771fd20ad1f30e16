"""argparse as users expect it: the mistake first, in one line, with a suggestion.

:class:`Parser` takes no abbreviation (``--budg 1`` is an error, not ``--budget``),
and a mistake reads::

    provider-router run: error: unrecognized arguments: --concurency 8 (did you mean --concurrency?)
    usage: provider-router run [PROMPTS.jsonl ...] --out DIR ... [options]
    provider-router run --help shows every option

the command's own usage (not the top level's), one line, after the error. The
suggestion is difflib's closest option or choice (argparse has its own only from
Python 3.14). The help shows every default once (:class:`HelpFormatter`).
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

__all__ = ["HelpFormatter", "Parser", "RawTextHelpFormatter", "finish_parsers", "suggestion"]


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default once, except where there is none to show, and
    the docstrings' reStructuredText as plain text (``x`` and `x` read as x)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False, argparse.SUPPRESS) or action.default == []:
            return action.help
        if action.help and "default" in action.help:  # it says its default itself
            return action.help
        return super()._get_help_string(action)

    def format_help(self) -> str:
        return _RST_LITERAL.sub(r"\1", super().format_help())


_RST_LITERAL = re.compile(r"``?([^`\n]+?)``?")


class RawTextHelpFormatter(argparse.RawDescriptionHelpFormatter, HelpFormatter):
    """:class:`HelpFormatter` that keeps a command's own line breaks in its description
    and epilog (``simulate`` lists its routes as a table)."""


def suggestion(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate ``word`` most likely meant: the only one it abbreviates, else the
    closest by difflib's ratio, the first of equals (None: nothing close)."""
    options = list(dict.fromkeys(candidates))
    prefixed = [c for c in options if c.startswith(word) and c != word]
    if len(prefixed) == 1:
        return prefixed[0]
    best, best_ratio = None, _CUTOFF
    for option in options:
        # Compared without their dashes: every option shares "--", which would make
        # any word look close to a short one (--bogus to --out).
        ratio = difflib.SequenceMatcher(None, word.lstrip("-"), option.lstrip("-")).ratio()
        if ratio > best_ratio or (best is None and ratio == best_ratio):
            best, best_ratio = option, ratio
    return best


_CUTOFF = 0.6
"""difflib's own default: below this, a word is not taken for a mistyped option."""


_INVALID_CHOICE = re.compile(r"^argument (?P<name>.+?): invalid choice: (?P<value>'[^']*'|\S+)")


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` without abbreviations, whose errors come first, short,
    with the command's own usage and a "did you mean" (see the module docstring)."""

    outer_options: frozenset[str] = frozenset()
    """The top level's options: given after the command, they are said to go before it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.suggest_on_error = False  # Python 3.14's own would say it twice

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        # A command's parser sees its own unknown arguments first: it says so itself,
        # with its usage, instead of the top level after the fact.
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(self._unrecognized(extras))
        return parsed, extras

    def _unrecognized(self, extras: list[str]) -> str:
        hints = []
        for word in extras:
            if not word.startswith("--"):
                continue
            flag = word.split("=", 1)[0]
            if flag in self.outer_options:
                root, _, command = self.prog.partition(" ")
                hints.append(f"{flag} goes before the command: {root} {flag} ... {command} ...")
                continue
            known = [o for o in self._option_string_actions if o.startswith("--")]
            near = suggestion(flag, known)
            if near is not None:
                hints.append(f"did you mean {near}?")
        said = f"unrecognized arguments: {' '.join(extras)}"
        return f"{said} ({'; '.join(hints)})" if hints else said

    def _choice_hint(self, message: str) -> str:
        match = _INVALID_CHOICE.match(message)
        if match is None:
            return message
        value = match["value"].strip("'")
        for action in self._actions:
            if action.choices is None or _action_name(action) != match["name"]:
                continue
            near = suggestion(value, (str(c) for c in action.choices))
            if near is not None:
                # The suggestion instead of the list of every choice (--help has it).
                return f"{match[0]} (did you mean {near!r}?)"
        return message

    def format_usage(self) -> str:
        return f"usage: {self.usage_line()}\n"

    def usage_line(self) -> str:
        """The command, its positionals and required options, and ``[options]``: one line."""
        if self.usage is not None:
            return self.usage % {"prog": self.prog}
        formatter = self._get_formatter()
        parts = [self.prog]
        grouped = {
            a
            for group in self._mutually_exclusive_groups
            if group.required
            for a in group._group_actions
        }
        optional = False
        for action in self._actions:
            if action.help == argparse.SUPPRESS or action in grouped:
                continue
            if not action.option_strings:
                parts.append(formatter._format_args(action, action.dest.upper()))
            elif action.required:
                parts.append(_option_usage(formatter, action))
            elif not isinstance(action, argparse._HelpAction):
                optional = True
        for group in self._mutually_exclusive_groups:
            if group.required:
                choices = " | ".join(_option_usage(formatter, a) for a in group._group_actions)
                parts.append(f"({choices})")
        if optional:
            parts.insert(1, "[options]")
        return " ".join(parts)

    def format_help(self) -> str:
        # The help's usage is the same one line an error shows (every option follows).
        usage, self.usage = self.usage, self.usage_line()
        try:
            return super().format_help()
        finally:
            self.usage = usage

    def error(self, message: str) -> NoReturn:
        message = self._choice_hint(message)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.stderr.write(self.format_usage())
        sys.stderr.write(f"{self.prog} --help shows every option\n")
        self.exit(2)


def _action_name(action: argparse.Action) -> str | None:
    if action.option_strings:
        return "/".join(action.option_strings)
    if action.metavar not in (None, argparse.SUPPRESS):
        return str(action.metavar)
    return action.dest if action.dest is not argparse.SUPPRESS else None


def _option_usage(formatter: argparse.HelpFormatter, action: argparse.Action) -> str:
    flag = action.option_strings[-1]
    if action.nargs == 0:
        return flag
    return f"{flag} {formatter._format_args(action, action.dest.upper())}"


def finish_parsers(parser: argparse.ArgumentParser) -> None:
    """Every command shows its defaults, has a description (its one-line help at least)
    and knows the top level's options (to say they go before it)."""
    outer = frozenset(o for a in parser._actions for o in a.option_strings) - {"-h", "--help"}
    _finish(parser, outer)


def _finish(parser: argparse.ArgumentParser, outer: frozenset[str]) -> None:
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {choice.dest: choice.help for choice in action._choices_actions}
        for name, sub in action.choices.items():
            raw = issubclass(sub.formatter_class, argparse.RawDescriptionHelpFormatter)
            sub.formatter_class = RawTextHelpFormatter if raw else HelpFormatter
            if not sub.description and helps.get(name):
                text = str(helps[name])
                sub.description = text[0].upper() + text[1:] + "."
            if isinstance(sub, Parser):
                sub.outer_options = outer
            _finish(sub, outer)
