from __future__ import annotations

import builtins
import re
from decimal import Decimal
from pathlib import Path

import pytest

import provider_router as pr
from provider_router import _exceptions
from provider_router._exceptions import error_for_status


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, pr.BadRequestError),
        (401, pr.AuthenticationError),
        (402, pr.PaymentRequiredError),
        (403, pr.PermissionDeniedError),
        (404, pr.NotFoundError),
        (422, pr.BadRequestError),
        (429, pr.RateLimitError),
        (500, pr.ProviderUnavailableError),
        (502, pr.ProviderUnavailableError),
        (529, pr.ProviderUnavailableError),
        (418, pr.APIStatusError),
    ],
)
def test_error_for_status(status: int, cls: type[pr.APIStatusError]) -> None:
    assert error_for_status(status) is cls


def test_every_error_has_one_root() -> None:
    for name in pr.__all__:
        obj = getattr(pr, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            assert issubclass(obj, pr.ProviderRouterError), name


def test_builtin_mixins_match_meaning() -> None:
    assert issubclass(pr.ConfigurationError, ValueError)
    assert issubclass(pr.RequestTimeout, TimeoutError)
    assert issubclass(pr.APIConnectionError, ConnectionError)
    assert issubclass(pr.MissingDependencyError, ImportError)


def test_payment_required_reads_limit_source() -> None:
    body = {
        "error": {
            "code": 402,
            "message": "Insufficient credits",
            "metadata": {"limit_source": "key"},
        }
    }
    err = pr.PaymentRequiredError(402, "Insufficient credits", body=body)
    assert err.limit_source == "key"
    assert pr.PaymentRequiredError(402, "x", body={"error": "weird"}).limit_source is None


def test_status_error_lowercases_headers_and_names_provider() -> None:
    err = pr.RateLimitError(429, "slow down", headers={"Retry-After": "3"}, provider_name="Chutes")
    assert err.headers == {"retry-after": "3"}
    assert str(err) == "HTTP 429 from Chutes: slow down"


def test_data_file_error_names_file_and_line() -> None:
    err = pr.DataFileError("prompts.jsonl", "not JSON", line=7)
    assert str(err) == "prompts.jsonl:7: not JSON"
    assert err.line == 7


def test_budget_exhausted_says_what_is_left() -> None:
    err = pr.BudgetExhausted(
        requested=Decimal("0.5"),
        spent=Decimal("99.7"),
        reserved=Decimal("0.1"),
        limit=Decimal("100"),
    )
    assert "available $0.2" in str(err)


def test_all_attempts_failed_is_a_group_and_ours() -> None:
    group = pr.AllAttemptsFailed("all 2 attempts failed", [pr.RequestTimeout("t"), ValueError("v")])
    assert isinstance(group, ExceptionGroup)
    assert isinstance(group, pr.ProviderRouterError)
    assert len(group.exceptions) == 2


_ERRORS_PAGE = Path(__file__).parents[1] / "docs" / "errors.md"
_BRANCH = re.compile(r"^(?P<indent>(?:[│ ]   )*)(?:[├└]── )?(?P<name>\w+)(?: \((?P<mixin>\w+)\))?")


def _tree_in(text: str) -> list[str]:
    """The drawn tree in ``text``: from its root line to the first blank line or fence."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "ProviderRouterError")
    indent = len(lines[start]) - len(lines[start].lstrip())
    tree: list[str] = []
    for line in lines[start:]:
        if not line.strip() or line.startswith("```"):
            break
        tree.append(line[indent:].rstrip())
    return tree


def test_the_errors_page_draws_the_module_docstrings_tree() -> None:
    assert _exceptions.__doc__ is not None
    assert _tree_in(_ERRORS_PAGE.read_text()) == _tree_in(_exceptions.__doc__)


def test_the_drawn_tree_is_the_class_tree() -> None:
    # Every public exception is drawn once, under the class it derives from, with the
    # builtin it mixes in.
    assert _exceptions.__doc__ is not None
    parents: list[str] = []
    drawn: set[str] = set()
    for line in _tree_in(_exceptions.__doc__):
        if "──" not in line and line != "ProviderRouterError":
            continue  # a description too long for its line
        match = _BRANCH.match(line)
        assert match is not None, line
        depth = len(match["indent"]) // 4 + (1 if "──" in line else 0)
        name, cls = match["name"], getattr(_exceptions, match["name"])
        del parents[depth:]
        if parents:
            assert getattr(_exceptions, parents[-1]) in cls.__bases__, line
        if match["mixin"]:
            assert getattr(builtins, match["mixin"]) in cls.__bases__, line
        parents.append(name)
        drawn.add(name)
    public = {
        name
        for name in _exceptions.__all__
        if isinstance(getattr(_exceptions, name), type)
        and issubclass(getattr(_exceptions, name), BaseException)
    }
    assert drawn == public
    assert public <= set(pr.__all__)
