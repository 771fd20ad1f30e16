"""The stage's per-row functions keep no cell variables, as the Router's do (#13 wave 5).

Every row of a Ray job runs these; with 500 rows in flight per actor a closure per
row (its cells, the function object) stays alive for the whole request through
``on_paid``. See tests/client/test_hot_path_cells.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from provider_router.ray._stage import PromptStage, _params
from provider_router.ray._store import AnswerStore
from tests.client.test_hot_path_cells import _code

HOT_PATH: list[Callable[..., Any]] = [
    PromptStage.__call__,
    PromptStage._answer,
    PromptStage._wait_for_holder,
    PromptStage._spills_here,
    PromptStage._send,
    PromptStage._keep_into,
    PromptStage._keep,
    PromptStage._put,
    _params,
    AnswerStore.lookup,
    AnswerStore._start_lookup,
    AnswerStore._read,
    AnswerStore._lookup,
    AnswerStore.put,
    AnswerStore._write_answer,
    AnswerStore._note,
    AnswerStore._write_note,
    AnswerStore.hold,
    AnswerStore._take,
    AnswerStore.release,
]


@pytest.mark.parametrize("fn", HOT_PATH, ids=lambda fn: fn.__qualname__)
def test_a_per_row_function_of_the_stage_keeps_no_cells(fn: Callable[..., Any]) -> None:
    assert _code(fn).co_cellvars == (), (
        f"{fn.__qualname__} makes {_code(fn).co_cellvars} cells on every row: build the "
        "closure with functools.partial of a method"
    )
