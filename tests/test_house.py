"""House rules the package's text is held to: no issue history, short module docstrings.

History lives in CHANGELOG.md and the figures in docs/performance.md; the code says
what it is and why. So no comment or docstring names an issue (``#22``, ``wave 5``) or
points outside the repository (``../shared/``), and a module docstring says what and
why in a few lines (STYLE.md, "Shaping the house").

A module docstring may hold more than prose: a short usage example, or the error tree
``_exceptions.py`` draws (STYLE.md asks for it). So the rule counts twice:

* at most :data:`MAX_PROSE_LINES` lines outside its literal blocks (an indented block
  after a ``::`` line, or a fenced block): the "few lines" of what and why;
* at most :data:`MAX_LINES` lines in all: room for that example or tree, not for a
  manual, which belongs in docs/.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import provider_router

PACKAGE = Path(provider_router.__file__).parent
MAX_PROSE_LINES = 12
MAX_LINES = 40

# ``#22`` or ``(#13 wave 5)``, not a hex colour (``#111827``), an anchor (``#/$defs``,
# ``page.md#section``) or an HTML entity (``&#10;``): one to four digits after a ``#``
# that follows no word character, ``#``, ``&`` or ``/``, and nothing word-like after.
ISSUE_HISTORY = re.compile(
    r"(?<![\w#&/])#\d{1,4}\b"
    r"|\bwave \d"
    r"|\b(?:issue|PR|pull request)s? #?\d"
    r"|\.\./shared\b|\bshared/reference\b",
    re.IGNORECASE,
)


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _name(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _comments_and_docstrings(source: str) -> Iterator[tuple[int, str]]:
    """Every comment and every docstring (a string statement: module, class, function
    or attribute docstring) of ``source``, with its first line number."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            yield node.lineno, node.value.value


def _history(path: Path) -> list[str]:
    found = []
    for line, text in _comments_and_docstrings(path.read_text(encoding="utf-8")):
        found += [f"{_name(path)}:{line}: {m.group()!r}" for m in ISSUE_HISTORY.finditer(text)]
    return found


def _prose_lines(lines: list[str]) -> int:
    """Lines outside literal blocks: an indented block after a ``::`` line, a fence."""
    count, literal, fenced = 0, False, False
    for line in lines:
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        if literal and (not line.strip() or line.startswith(" ")):
            continue
        literal = line.rstrip().endswith("::")
        count += 1
    return count


def _docstring_excess(path: Path) -> str | None:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    lines = doc.splitlines() if doc else []
    prose = _prose_lines(lines)
    if prose > MAX_PROSE_LINES or len(lines) > MAX_LINES:
        return f"{_name(path)}: {len(lines)} lines, {prose} of prose"
    return None


def test_no_issue_history_in_comments_or_docstrings() -> None:
    found = [hit for path in _modules() for hit in _history(path)]
    assert not found, "say why, not which issue (history lives in CHANGELOG.md):\n" + "\n".join(
        found
    )


def test_module_docstrings_say_what_and_why_in_a_few_lines() -> None:
    long = [excess for path in _modules() if (excess := _docstring_excess(path))]
    assert not long, (
        f"a module docstring has at most {MAX_PROSE_LINES} lines of prose and "
        f"{MAX_LINES} in all; the rest belongs in docs/:\n" + "\n".join(long)
    )


def test_the_history_pattern_tells_issues_from_colours_and_anchors() -> None:
    for text in ("(#22)", "#13 wave 5", "issue 11", "see ../shared/STYLE.md", "wave 4"):
        assert ISSUE_HISTORY.search(text), text
    for text in ("#111827", "#2563eb", "#/$defs", "design.md#money", "&#10;", "# a comment"):
        assert not ISSUE_HISTORY.search(text), text
