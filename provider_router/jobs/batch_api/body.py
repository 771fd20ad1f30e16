"""What the batch route sends: each line's body, its worst case, and batches within limits.

A batch holds at most 5,000 requests and 200 MB (the Batch API guide), measured as its
lines are sent. A line's worst case (its prompt bound plus ``max_tokens``, at the pinned
``:batch`` endpoint's price) is what the ledger reserves for it; ``max_tokens`` also
bounds the bytes its result may take when it is read back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, Final, NamedTuple

from provider_router._exceptions import ConfigurationError
from provider_router.catalog.records import Endpoint
from provider_router.jobs.batch_api.journal import BatchIntent
from provider_router.jobs.store.digest import RequestDigest, request_fields
from provider_router.planning.prompts import Prompt
from provider_router.routing.batch_endpoints import BatchRoute
from provider_router.routing.route_plan import estimate_prompt_tokens

__all__ = [
    "MAX_BATCH_BYTES",
    "MAX_BATCH_REQUESTS",
    "PARAM_RANGES",
    "RESULTS_PAGE_BYTES",
    "BatchBody",
    "LineFit",
    "params_problem",
]

MAX_BATCH_REQUESTS: Final = 5_000
MAX_BATCH_BYTES = 200 * 1024 * 1024
_PROMPT_FIELDS: Final = frozenset(["tools", "tool_choice", "response_format"])
BODY_MARGIN = 1024 * 1024
"""Bytes kept free of the 200 MB limit for the body's head."""
_BYTES_PER_TOKEN: Final = 48
"""A bound on one output token as a results line carries it (content and reasoning,
JSON-escaped), for the most a results body may be."""
_LINE_HEAD_BYTES: Final = 64 * 1024
"""A results line's envelope (ids, usage, provider) around its text, at most."""
RESULTS_PAGE_BYTES: Final = 256 * 1024 * 1024
"""The most of one results page held at once (pages get fewer lines when answers are long)."""
_INTENT_PLACEHOLDER: Final = "b" + "0" * 12
"""An intent id of the real length, for measuring a line before its intent exists."""
PARAM_RANGES: Final = {"temperature": (0.0, 2.0), "top_p": (0.0, 1.0)}
"""OpenRouter's documented ranges (``api-reference/parameters``): a line outside one
fails its whole batch after the 202."""
_BYTES_PER_TOKEN_TYPICAL: Final = 4
"""About four bytes a token in ordinary text: the prompt bound (a byte a token) over
this is the estimate a line is refused on (it surely overflows the context)."""
MAX_CUSTOM_ID_CHARS: Final = 64
"""Some upstreams cap ``custom_id`` at 64 characters (Anthropic, Together: a 422)."""


def _range_problem(params: Mapping[str, Any]) -> str | None:
    for name, (low, high) in PARAM_RANGES.items():
        value = params.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if not low <= value <= high:
            return f"{name} {value} is outside {low:g} to {high:g}"
    return None


def params_problem(endpoint: Endpoint, params: Mapping[str, Any]) -> str | None:
    """Why every line with these generation fields would fail a batch on ``endpoint``
    (a parameter out of its range, ``max_tokens`` above the endpoint's caps), or None."""
    out_of_range = _range_problem(params)
    if out_of_range is not None:
        return out_of_range
    max_tokens = params.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        return None
    cap = endpoint.max_completion_tokens
    if cap is not None and max_tokens > cap:
        return f"max_tokens {max_tokens} is above {endpoint.provider_name}'s batch cap {cap}"
    context = endpoint.context_length
    if context is not None and max_tokens >= context:
        return (
            f"max_tokens {max_tokens} leaves no room for a prompt in {endpoint.provider_name}'s "
            f"context length {context}"
        )
    return None


class LineFit(NamedTuple):
    """Whether a line fits the pinned endpoint's limits, as far as can be told here."""

    sure: bool
    """Its prompt bound plus ``max_tokens`` fits the context: it cannot fail its batch."""
    refused: str | None
    """Why it surely would fail its whole batch (None: it may go)."""


def _checked_params(params: Mapping[str, Any]) -> dict[str, Any]:
    max_tokens = params.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ConfigurationError("the batch route needs max_tokens (its worst case) >= 1")
    if params.get("stream"):
        raise ConfigurationError("stream: true fails a whole batch; the batch route never streams")
    out_of_range = _range_problem(params)
    if out_of_range is not None:
        raise ConfigurationError(f"{out_of_range}: it would fail every batch")
    return dict(params)


class BatchBody:
    """The lines of the batch route's submits, per dataset.

    Raises:
        ConfigurationError: no batch endpoint, or one without a fixed price (nothing
            could be reserved for it); ``max_tokens`` missing or below 1; ``stream``;
            ``max_batch_requests`` outside 1..5,000.
    """

    def __init__(
        self,
        route: BatchRoute,
        params: Mapping[str, Any],
        dataset_params: Mapping[str, Mapping[str, Any]],
        max_batch_requests: int = MAX_BATCH_REQUESTS,
    ) -> None:
        route.prices()  # refuse what cannot be priced: no endpoint, or no fixed price
        assert route.endpoint is not None  # prices() raised otherwise (for mypy)
        self.endpoint: Endpoint = route.endpoint
        self.model = route.model_id
        self._digests: dict[str, RequestDigest] = {}
        self.dataset_params = {
            name: _checked_params({**params, **own}) for name, own in dataset_params.items()
        }
        self.default = _checked_params(params)
        if not 1 <= max_batch_requests <= MAX_BATCH_REQUESTS:
            raise ConfigurationError(f"max_batch_requests must be 1..{MAX_BATCH_REQUESTS}")
        self.max_batch_requests = max_batch_requests

    def params(self, dataset: str) -> dict[str, Any]:
        """The generation fields of ``dataset``'s lines."""
        return self.dataset_params.get(dataset, self.default)

    def digest(self, dataset: str) -> RequestDigest:
        """The request digests of ``dataset``'s lines (what their output rows carry)."""
        digest = self._digests.get(dataset)
        if digest is None:
            digest = self._digests[dataset] = RequestDigest(self.model, self.params(dataset))
        return digest

    def line(self, dataset: str, intent: str, line: int, prompt: Prompt) -> dict[str, Any]:
        """One request of a submit: ``custom_id`` ``<intent>-<line>``, and its body (a
        prompt line's own ``tools`` / ``tool_choice`` over its dataset's, as on the sync
        route).

        The ``custom_id`` is short whatever the prompt's id (at most 18 characters, within
        the 64 some upstreams allow): the intent, journaled and fsynced before the submit,
        maps each line number back to its prompt id. A body never names a ``model`` (the
        batch's is the one that serves it: a differing one is a 400)."""
        body = request_fields(self.params(dataset), prompt.request_fields)
        body["messages"] = prompt.messages
        body.pop("model", None)
        body.pop("stream", None)
        custom_id = f"{intent}-{line}"
        assert len(custom_id) <= MAX_CUSTOM_ID_CHARS
        return {"custom_id": custom_id, "body": body}

    def _prompt_bound(self, dataset: str, prompt: Prompt) -> int:
        """An upper bound on the line's prompt tokens (a byte a token)."""
        params = self.params(dataset)
        # Tools and response_format are rendered into the prompt: a byte a token bounds them.
        extra = {
            k: v
            for k, v in request_fields(params, prompt.request_fields).items()
            if k in _PROMPT_FIELDS
        }
        return estimate_prompt_tokens(prompt.messages) + len(json.dumps(extra).encode())

    def worst(self, dataset: str, prompt: Prompt) -> Decimal:
        """The most the line may cost (what is reserved for it)."""
        bound = self._prompt_bound(dataset, prompt)
        return self.endpoint.pricing.cost(bound, self.params(dataset)["max_tokens"])

    def fit(self, dataset: str, prompt: Prompt) -> LineFit:
        """Whether the line fits the pinned endpoint's context with its ``max_tokens``:
        surely (its bound fits), surely not (even at about four bytes a token it
        overflows: it would fail its whole batch), or perhaps."""
        params = self.params(dataset)
        problem = params_problem(self.endpoint, params)
        if problem is not None:
            return LineFit(False, problem)
        context = self.endpoint.context_length
        if context is None:
            return LineFit(True, None)
        max_tokens = int(params["max_tokens"])
        bound = self._prompt_bound(dataset, prompt)
        if bound + max_tokens <= context:
            return LineFit(True, None)
        estimate = bound // _BYTES_PER_TOKEN_TYPICAL
        if estimate + max_tokens > context:
            return LineFit(
                False,
                f"its prompt (about {estimate:,} tokens) and max_tokens ({max_tokens:,}) "
                f"exceed {self.endpoint.provider_name}'s context length ({context:,})",
            )
        return LineFit(False, None)

    def line_bytes(self, dataset: str) -> int:
        """The most one results line of ``dataset`` may be (from its ``max_tokens``)."""
        return int(self.params(dataset)["max_tokens"]) * _BYTES_PER_TOKEN + _LINE_HEAD_BYTES

    def batch_bytes(self, intent: BatchIntent) -> int:
        """The most a GET of the batch may be: a terminal one carries every result."""
        return len(intent.prompt_ids) * self.line_bytes(intent.dataset) + _LINE_HEAD_BYTES

    def chunk(self, dataset: str, todo: Sequence[Prompt]) -> list[Prompt]:
        """The first of ``todo`` that fit one batch (requests and bytes as sent).

        Raises:
            ConfigurationError: the first prompt alone is larger than a batch may be.
        """
        chunk: list[Prompt] = []
        size = 0
        for prompt in todo:
            # Measured as sent (JSON, non-ASCII \u-escaped, tools and params included),
            # with an intent id of the real length: the limit is on the body's bytes.
            line = self.line(dataset, _INTENT_PLACEHOLDER, len(chunk), prompt)
            length = len(json.dumps(line, separators=(",", ":")).encode()) + 1
            if (
                len(chunk) >= self.max_batch_requests
                or size + length > MAX_BATCH_BYTES - BODY_MARGIN
            ):
                if not chunk:
                    raise ConfigurationError(
                        f"prompt {prompt.id!r} of dataset {dataset!r} ({prompt.source}:"
                        f"{prompt.line}) is {length:,} bytes as a batch line, more than a "
                        "batch may hold"
                    )
                break
            chunk.append(prompt)
            size += length
        return chunk
