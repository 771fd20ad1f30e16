"""The stage's rows: the input as Python, the answer's columns, the row key.

Ray hands nested columns as numpy arrays and gives every row every column (absent
keys as nulls); :func:`plain` and :func:`clean_messages` undo both before a row is
parsed as a prompt line. :func:`answer_fields` is what an answer adds to its row,
stored as it is so a replayed row is the very same.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Final

from provider_router._format import decimal_str
from provider_router.client.results import ChatResult

__all__ = [
    "DIGEST_COLUMN",
    "EMPTY_ANSWER",
    "REQUEST_COLUMN",
    "answer_fields",
    "clean_messages",
    "plain",
    "request_fields",
    "row_key",
]

REQUEST_COLUMN: Final = "request_json"
"""A column holding a prompt's request fields (``tools``, ``tool_choice``) as one JSON
object text: as a nested column Arrow would unify every row's tool schemas into one
type (adding null keys to the schemas sent), so ``run --ray`` passes them as text."""

DIGEST_COLUMN: Final = "request_digest"
"""A column holding the digest of the request a row is sent as
(:mod:`provider_router.jobs.store.digest`), as the driver of ``run --ray`` computed it:
a stored answer to another request (the prompt changed under its id) is not the row's."""

_MAX_REQUEST_JSON: Final = 8 * 1024 * 1024  # as one prompt line's bound (prompts.py)


def row_key(dataset: str, prompt_id: str) -> str:
    """The store's and the ledger's label of one prompt (as the batch runner's)."""
    return f"{dataset}/{prompt_id}"


def request_fields(raw: Any) -> dict[str, Any]:
    """The request fields of a :data:`REQUEST_COLUMN` value.

    Raises:
        ValueError: not a JSON object text, or longer than a prompt line may be.
    """
    if not isinstance(raw, str) or len(raw) > _MAX_REQUEST_JSON:
        raise ValueError(f"{REQUEST_COLUMN} must be a JSON object text of at most 8 MiB")
    fields = json.loads(raw)
    if not isinstance(fields, dict):
        raise ValueError(f"{REQUEST_COLUMN} must be a JSON object, got {type(fields).__name__}")
    return fields


def plain(value: Any) -> Any:
    """``value`` with numpy arrays and scalars (how Ray hands nested columns) as Python."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    tolist = getattr(value, "tolist", None)
    if tolist is not None and not isinstance(value, str | bytes):
        return plain(tolist())
    return value


def clean_messages(messages: Any) -> Any:
    """Messages as sent: without the ``None`` fields Arrow adds when it unifies the
    keys of different messages into one struct (``content`` stays: it may be null)."""
    if not isinstance(messages, list):
        return messages
    return [
        {k: v for k, v in m.items() if v is not None or k == "content"}
        if isinstance(m, dict)
        else m
        for m in messages
    ]


def answer_fields(
    result: ChatResult, started: float, finished: float, request_digest: str | None = None
) -> dict[str, Any]:
    """The columns an answer adds to its row (stored as they are: a replay is identical);
    ``request_digest``: the request it answers."""
    usage = result.usage
    cost = result.cost if result.cost is not None else Decimal(0)
    return {
        "answer": result.text,
        "reasoning": result.reasoning or None,
        "finish_reason": result.finish_reason,
        "provider": result.provider,
        "served_model": result.model,
        "generation_id": result.generation_id,
        "cost": decimal_str(cost),
        "prompt_tokens": usage.prompt_tokens if usage else 0,
        "completion_tokens": usage.completion_tokens if usage else 0,
        "reasoning_tokens": usage.reasoning_tokens if usage else 0,
        "cached_tokens": usage.cached_tokens if usage else 0,
        "tool_calls": (
            json.dumps([call.message() for call in result.tool_calls])
            if result.tool_calls
            else None
        ),
        "attempts": result.attempts,
        "started_at": started,
        "finished_at": finished,
        "request_digest": request_digest,
    }


EMPTY_ANSWER: Final[dict[str, Any]] = {
    "answer": None,
    "reasoning": None,
    "finish_reason": None,
    "provider": None,
    "served_model": None,
    "generation_id": None,
    "cost": "0",
    "prompt_tokens": 0,
    "completion_tokens": 0,
    "reasoning_tokens": 0,
    "cached_tokens": 0,
    "tool_calls": None,
    "attempts": 0,
    "started_at": None,
    "finished_at": None,
    "request_digest": None,
}
