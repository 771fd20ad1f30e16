"""The counts a run prints at the end are sentences a person can act on, on any stderr."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import provider_router
from provider_router._log import get_logger
from provider_router.cli import main
from provider_router.cli._event_phrases import describe_kind
from provider_router.cli._logging import configure_logging, report_events

_COUNTED = {"warning", "error", "exception", "critical"}
_JARGON = re.compile(r"×|\b[a-z]+\.[a-z_]+\b|Error\b|\{|\}")


def _counted_events() -> dict[str, set[str | None]]:
    """Every event the package logs at a counted level, with the error types it may carry."""
    found: dict[str, set[str | None]] = {}
    package = Path(provider_router.__file__).parent
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _COUNTED
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "log"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                continue
            found.setdefault(str(node.args[0].value), {None})
    return found


_ERROR_TYPES = [
    "APIConnectionError",
    "RequestTimeout",
    "RateLimitError",
    "ProviderUnavailableError",
    "BadRequestError",
    "NotFoundError",
    "AuthenticationError",
    "AllAttemptsFailed",
    "BudgetExhausted",
    "CreditsExhausted",
]


def test_every_counted_event_of_the_package_reads_as_a_sentence() -> None:
    events = _counted_events()
    assert "route.unresolved" in events  # the scan sees multi-line calls too
    bad = []
    for event in sorted(events):
        for kind in [None, *_ERROR_TYPES]:
            for count in (1, 5):
                text = describe_kind(event, kind, count)
                # File names a person opens are words here, not jargon.
                for name in ("summary.json", "timeline.ndjson", "report.html"):
                    text = text.replace(name, "")
                if _JARGON.search(text):
                    bad.append(text)
    assert bad == []


@pytest.mark.parametrize(
    ("event", "kind", "count", "says"),
    [
        (
            "route.unresolved",
            "APIConnectionError",
            5,
            "5 requests sent but cut off before their cost was known (could not reach "
            "OpenRouter (connection failed): check the network or --base-url)",
        ),
        (
            "route.failed",
            "APIConnectionError",
            5,
            "5 requests could not reach OpenRouter (connection failed): check the network or "
            "--base-url",
        ),
        ("route.failed", "BudgetExhausted", 1, "1 prompt not sent: budget exhausted"),
        ("ledger.recover", None, 1, "open reservations of an earlier run were recovered 1 time"),
        ("some.new_thing", "OddKind", 2, "New thing 2 times (odd kind)"),
    ],
)
def test_a_count_says_what_happened_in_words(
    event: str, kind: str | None, count: int, says: str
) -> None:
    assert describe_kind(event, kind, count).startswith(says)


def test_on_a_non_terminal_stderr_the_counts_are_plain_lines_not_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging(level="warning", fmt="auto")  # capsys: stderr is not a terminal
    log = get_logger("provider_router.client._billing")
    for _ in range(5):
        log.warning("route.unresolved", key="k", error_type="APIConnectionError")
    log.warning("ledger.recover", orphans=3)
    lines = report_events()
    err = capsys.readouterr().err
    assert lines == [
        "provider-router: 5 requests sent but cut off before their cost was known (could not "
        "reach OpenRouter (connection failed): check the network or --base-url): their worst "
        "case stays held until OpenRouter's records say what they cost",
        "provider-router: open reservations of an earlier run were recovered 1 time",
    ]
    assert err.splitlines() == lines
    assert "{" not in err
    configure_logging(level="warning", fmt="json")  # JSON when asked: the same sentence
    log.warning("ledger.recover", orphans=3)
    assert (
        '"message": "open reservations of an earlier run were recovered 1 time"'
        in (report_events()[0])
    )


def test_the_help_says_auto_is_console(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "auto is console" in capsys.readouterr().out
