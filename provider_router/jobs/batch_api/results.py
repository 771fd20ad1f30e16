"""One Batch API result line as the runner's output record.

A result is ``{custom_id, response: {status_code, body} | null, error | null}``; a chat
body is a chat completion (``gen-batch-…`` id, ``usage.cost``). :func:`read_result`
says which prompt it answers, whether it failed (a failed line costs nothing) and what
it cost; :func:`result_record` builds the same output record a sync answer gets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from provider_router._money import to_decimal, to_units
from provider_router._types import JSONObject
from provider_router.client.results import ToolCall
from provider_router.jobs.batch_api.journal import BatchIntent
from provider_router.jobs.store.journal import FileJournal
from provider_router.jobs.store.outputs import TRUNCATED_FINISH, encode_record, make_record
from provider_router.planning.prompts import Prompt

__all__ = [
    "MAX_READ_COST",
    "ResultLine",
    "complete_result",
    "failed_batch_cost",
    "read_cost",
    "read_result",
    "result_record",
]

MAX_READ_COST: Final = Decimal(1_000_000)
"""The largest ``usage.cost`` (USD) read as a figure: a batch of 5,000 lines at any
listed price is far below it; a bigger number from a server (``1e999999999``) is
unreadable (its worst case counts), never a ``decimal.Overflow``."""


@dataclass(frozen=True, slots=True)
class ResultLine:
    """A result line read: its prompt, its chat body (None: the line failed), its cost."""

    prompt_id: str
    body: Mapping[str, Any] | None
    cost: Decimal | None
    """What OpenRouter says the line cost (None: a successful line without a readable,
    non-negative ``usage.cost``: unknown, which is never free)."""

    @property
    def usage(self) -> Mapping[str, Any]:
        return {} if self.body is None else (self.body.get("usage") or {})

    @property
    def prompt_tokens(self) -> int:
        return int(self.usage.get("prompt_tokens", 0))

    @property
    def completion_tokens(self) -> int:
        return int(self.usage.get("completion_tokens", 0))


def read_result(intent: BatchIntent, result: Mapping[str, Any]) -> ResultLine | None:
    """The line's prompt, body and cost (None: its ``custom_id`` is not the intent's)."""
    prompt_id = intent.prompt_for(str(result.get("custom_id", "")))
    if prompt_id is None:
        return None
    response = result.get("response")
    body = response.get("body") if isinstance(response, Mapping) else None
    status = response.get("status_code") if isinstance(response, Mapping) else None
    if (
        result.get("error") is not None
        or not isinstance(body, Mapping)
        or (isinstance(status, int) and not 200 <= status < 300)
    ):
        # A failed line (an error, or a response with an error status): no answer to
        # write, and failed lines cost nothing (the Batch API's docs).
        return ResultLine(prompt_id, None, Decimal(0))
    usage = body.get("usage")
    return ResultLine(
        prompt_id, body, read_cost(usage.get("cost") if isinstance(usage, Mapping) else None)
    )


def read_cost(value: Any) -> Decimal | None:
    """A ``usage.cost`` as exact USD; None when absent, unreadable, negative or beyond
    :data:`MAX_READ_COST` (a hostile exponent is refused before any arithmetic)."""
    if value is None or (isinstance(value, str) and len(value) > 64):
        return None
    try:
        cost = to_decimal(value, what="usage.cost")
    except ValueError:
        return None
    return cost if 0 <= cost <= MAX_READ_COST else None


def failed_batch_cost(batch: Mapping[str, Any], worst: Decimal) -> tuple[Decimal, int]:
    """What a failed batch is booked at, and the lines it says it completed without a cost.

    A failed batch ran nothing and cost nothing (the docs), unless it says otherwise:
    a cost it reports is returned (the caller disputes an absurd one), and lines it
    reports done without one, or a cost that cannot be read, count at the batch's
    ``worst`` case (unknown is not free).
    """
    usage = batch.get("usage")
    said = usage.get("cost") if isinstance(usage, Mapping) else None
    cost = read_cost(said)
    if cost is not None and cost > 0:
        return cost, 0
    if said is not None and cost is None:
        return worst, 0
    counts = batch.get("request_counts")
    done = counts.get("completed") if isinstance(counts, Mapping) else None
    if isinstance(done, int) and not isinstance(done, bool) and done > 0:
        return worst, done
    return Decimal(0), 0


def result_record(
    line: ResultLine,
    prompt: Prompt,
    model: str,
    *,
    dataset: str,
    batch_id: str | None,
    started_at: float,
    finished_at: float,
    cost: Decimal,
    tools: Sequence[JSONObject] | None = None,
    request_digest: str | None = None,
    max_tokens: int | None = None,
) -> bytes:
    """The output line of a successful result (as a sync answer's, plus its batch id),
    with ``cost`` as booked (``started_at``: when its batch was submitted;
    ``request_digest``: the request it answers; ``max_tokens``: the cap its line was sent
    with)."""
    body = line.body or {}
    usage = line.usage
    choice = (body.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    details = usage.get("completion_tokens_details") or {}
    prompt_details = usage.get("prompt_tokens_details") or {}
    # The calls the model asked for are the answer too (paid for): kept as sync keeps them.
    raw_calls = message.get("tool_calls")
    calls = [
        ToolCall.from_json(raw, n)
        for n, raw in enumerate(raw_calls if isinstance(raw_calls, list) else [])
    ]
    record = make_record(
        prompt_id=line.prompt_id,
        dataset=dataset,
        messages=prompt.messages,
        text=message.get("content"),
        reasoning=message.get("reasoning"),
        finish_reason=choice.get("finish_reason"),
        provider=body.get("provider"),
        model=model,
        served_model=body.get("model"),
        generation_id=body.get("id"),
        prompt_tokens=line.prompt_tokens,
        completion_tokens=line.completion_tokens,
        reasoning_tokens=int(details.get("reasoning_tokens") or 0),
        cached_tokens=int(prompt_details.get("cached_tokens") or 0),
        cost=cost,
        metadata={**prompt.metadata, "batch_id": batch_id},
        started_at=started_at,
        finished_at=finished_at,
        tool_calls=[call.message() for call in calls if call is not None],
        tools=tools,
        request_digest=request_digest,
        max_tokens=max_tokens,
    )
    return encode_record(record)


def complete_result(
    journal: FileJournal,
    dataset: str,
    line: ResultLine,
    prompt: Prompt,
    record: bytes,
    cost: Decimal,
) -> None:
    """Commit a successful result's ``record`` (:func:`result_record`) as done through
    ``journal`` (the prompt claimed), at ``cost`` as booked."""
    choices = (line.body or {}).get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    finish = first.get("finish_reason") if isinstance(first, Mapping) else None
    journal.complete(
        dataset,
        line.prompt_id,
        record,
        output_tokens=line.completion_tokens,
        prompt_tokens=line.prompt_tokens,
        cost_units=to_units(cost),
        location=prompt.location,
        truncated=finish == TRUNCATED_FINISH,
    )
