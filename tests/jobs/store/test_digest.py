"""The request digest: defined once, over what is sent that decides the answer."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from provider_router.jobs.revisions import CHANGED, OTHER_MODEL, RowCheck, RowRequest, _content
from provider_router.jobs.store.digest import RequestDigest, request_digest
from provider_router.planning.prompts import Prompt

MODEL = "moonshotai/kimi-k2.5"
ASK = [{"role": "user", "content": "Écris une fonction…"}]
PARAMS = {"max_tokens": 400, "temperature": 0.7, "tools": [{"type": "function", "function": {}}]}


def test_the_digest_is_the_sha256_of_the_canonical_json_of_what_is_sent() -> None:
    body = {**PARAMS, "model": MODEL, "messages": ASK}
    del body["max_tokens"]  # where an answer is cut, not what it answers
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    expected = hashlib.sha256(canonical.encode()).hexdigest()[:32]
    assert request_digest(MODEL, ASK, PARAMS) == expected
    # Key order and how the messages were written do not matter.
    reordered = [{"content": ASK[0]["content"], "role": "user"}]
    assert request_digest(MODEL, reordered, dict(reversed(PARAMS.items()))) == expected


@pytest.mark.parametrize(
    "change",
    [
        {"model": "moonshotai/kimi-k3"},
        {"messages": [{"role": "user", "content": "Écris une fonction."}]},
        {"temperature": 0.2},
        {"tools": None},
        {"tool_choice": "required"},
        {"response_format": {"type": "json_object"}},
    ],
    ids=lambda change: next(iter(change)),
)
def test_whatever_decides_the_answer_changes_the_digest(change: dict[str, Any]) -> None:
    params = {**PARAMS, **{k: v for k, v in change.items() if k not in ("model", "messages")}}
    params = {k: v for k, v in params.items() if v is not None}
    other = request_digest(change.get("model", MODEL), change.get("messages", ASK), params)
    assert other != request_digest(MODEL, ASK, PARAMS)


def test_how_and_by_whom_it_is_answered_is_not_in_the_digest() -> None:
    routed = {**PARAMS, "stream": True, "provider": {"only": ["chutes"]}, "usage": {}}
    assert request_digest(MODEL, ASK, routed) == request_digest(MODEL, ASK, PARAMS)


def test_the_cap_an_answer_may_be_cut_at_is_not_in_the_digest() -> None:
    # Each row records its own max_tokens and finish_reason; --redo-truncated sends the
    # cut ones again with a larger cap, and the others answer the same request.
    larger = {**PARAMS, "max_tokens": 4096}
    assert request_digest(MODEL, ASK, larger) == request_digest(MODEL, ASK, PARAMS)


def test_a_datasets_digests_equal_the_definition_with_a_lines_own_fields_over_its_own() -> None:
    digest = RequestDigest(MODEL, PARAMS)
    assert digest(ASK) == request_digest(MODEL, ASK, PARAMS)
    own = {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"}
    assert digest(ASK, own) == request_digest(MODEL, ASK, {**PARAMS, **own})
    prompt = Prompt("q1", ASK, {}, Path("p.jsonl"), 1, request_fields=own)
    assert digest.of(prompt) == digest(ASK, own)


def prompt(content: str, **own: Any) -> Prompt:
    return Prompt("q1", [{"role": "user", "content": content}], {}, Path("p.jsonl"), 1, 0, own)


def legacy_row(content: str, model: str = MODEL, tools: Any = None) -> RowRequest:
    return RowRequest(None, model, _content([{"role": "user", "content": content}], tools))


def test_a_row_from_before_digests_is_checked_by_the_model_and_content_it_records() -> None:
    digest = RequestDigest(MODEL, {"max_tokens": 10})
    check = RowCheck({"q1": legacy_row("hi")}, digest)
    assert check.why_not(prompt("hi")) is None
    assert check.why_not(prompt("hello")) == CHANGED
    assert (
        RowCheck({"q1": legacy_row("hi", "moonshotai/kimi-k3")}, digest).why_not(prompt("hi"))
        == OTHER_MODEL
    )
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert check.why_not(prompt("hi", tools=tools)) == CHANGED
    assert (
        RowCheck({"q1": legacy_row("hi", tools=tools)}, digest).why_not(prompt("hi", tools=tools))
        is None
    )


def test_a_row_from_before_digests_with_its_own_tool_choice_needs_the_journal() -> None:
    # Its tool_choice is not in the row: it counts as asked the same only if the journal
    # shows it done under the input files as they are now.
    digest = RequestDigest(MODEL, {"max_tokens": 10})
    asked = prompt("hi", tool_choice="none")
    rows = {"q1": legacy_row("hi")}
    assert RowCheck(rows, digest).why_not(asked) == CHANGED
    assert RowCheck(rows, digest, lambda pid: False).why_not(asked) == CHANGED
    assert RowCheck(rows, digest, lambda pid: True).why_not(asked) is None
