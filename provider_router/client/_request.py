"""One chat request, prepared once and shared by its attempts; its JSON encoded cheaply.

The per-request path encodes only what varies: the messages and the per-call
fields. The model prefix is encoded when the router is built, each endpoint's
``provider`` object once per route plan (the attempt admitted there appends it), and
the tail for the common call shape (no extra parameters) once per
``(max_tokens, stream)`` pair.
"""

from __future__ import annotations

import json
import json.encoder
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from provider_router._types import Message
from provider_router.client.results import ChatResult, StreamDelta
from provider_router.routing.route_plan import RoutePlan

__all__ = ["PreparedRequest", "RequestEncoder", "provider_json"]

_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), check_circular=False)
_encode: Final = _ENCODER.encode
"""Compact JSON, with one encoder reused (``json.dumps`` with options builds one per call)."""
_make_c_encoder: Final[Any] = getattr(json.encoder, "c_make_encoder", None)
# What ``JSONEncoder.encode`` builds on every call (a C encoder with these very
# options), built once: the messages are encoded for every request.
_c_encode: Final[Any] = (
    _make_c_encoder(
        None,  # no circular check
        _ENCODER.default,
        json.encoder.encode_basestring_ascii,
        None,  # no indent
        ":",
        ",",
        False,  # sort_keys
        False,  # skipkeys
        True,  # allow_nan
    )
    if _make_c_encoder is not None
    else None
)


def encode_json(value: Any) -> str:
    """Compact JSON text of ``value``: what ``_encode(value)`` returns, sooner."""
    if _c_encode is None or isinstance(value, str):
        return _encode(value)
    return "".join(_c_encode(value, 0))


_TAIL_CACHE_SIZE: Final = 256


def provider_json(
    routing: Mapping[str, Any], fields: Mapping[str, Any], *, strict: bool = False
) -> bytes:
    """A ``provider`` object with the router's own ``fields`` (``enforce_distillable_text``),
    encoded; ``strict`` adds ``require_parameters: true`` (a request whose parameters
    only some endpoints honour, such as ``logprobs``)."""
    if fields or strict:
        routing = {**routing, **fields}
        if strict:
            routing["require_parameters"] = True
    return _encode(routing).encode()


@dataclass(slots=True)
class PreparedRequest:
    """What every attempt of one request shares."""

    payload: bytes
    stream: bool
    key: str
    worst_case: Decimal
    prompt_estimate: int
    plan: RoutePlan
    on_delta: Callable[[StreamDelta], Any] | None
    generation_id: str | None = None
    attempts: int = 0
    deadline: float = 0.0
    """Seconds a whole attempt may take (for a stream: scaled with ``max_tokens``)."""
    sent: bool = False
    """Whether this attempt was handed to the HTTP layer (it may have been billed)."""
    session: str | None = None
    """The cache-affinity session (``session_id``) of a pinned request."""
    pinned: str | None = None
    """The endpoint tag a pinned request is sent to (its one-tag ``only``)."""
    failed_pins: tuple[str, ...] = ()
    """Tags that failed this pinned request: its retries go elsewhere."""
    pin_needs: tuple[tuple[str, ...], int] = ((), 0)
    """What a pinned request needs of its endpoint: the ``supported_parameters`` it uses
    and its completion cap (a re-pin keeps to endpoints that can take it)."""
    on_paid: Callable[[ChatResult], Awaitable[None]] | None = None
    """Awaited with a paid answer before its reservation is settled (``Router.chat``)."""
    head: bytes = b""
    """The body up to its ``provider`` object, which each attempt's admitted endpoint
    completes (``payload`` is ``head`` + that endpoint's object + ``}``)."""
    prompt_tokens: int = 0
    """The prompt's token bound (text, fields and template), images aside."""
    images: int = 0
    """Image parts in the prompt."""
    cap: int = 0
    """The completion cap a provider may honour (0: none given)."""
    endpoint: str | None = None
    """The tag of the endpoint the last attempt was admitted to."""
    seq: int = 0
    """Its place in line for an endpoint (kept across refusals: first in, first out)."""
    refusals: int = 0
    """Refusals (an endpoint's 429) taken back to admission in this attempt."""
    waited: float = 0.0
    """Seconds it waited for an endpoint, over all its attempts."""
    floor_cost: Decimal | None = None
    """Its answer's tokens at the floor's prices (set when answered)."""
    strict: bool = False
    """Sent with ``require_parameters: true`` (it asks for ``logprobs``): every
    endpoint it is admitted to gets the strict ``provider`` object."""


class RequestEncoder:
    """Builds the ``/chat/completions`` body of a router's requests as bytes.

    Args:
        model: the model id (fixed for the router).
        defaults: request fields every call carries unless it overrides them.
    """

    __slots__ = (
        "_defaults",
        "_head",
        "_provider",
        "_provider_fields",
        "_tails",
        "last_fields_bytes",
    )

    def __init__(
        self,
        model: str,
        defaults: Mapping[str, Any],
        provider_fields: Mapping[str, Any] | None = None,
    ) -> None:
        self._head = b'{"model":' + _encode(model).encode() + b',"messages":'
        self._defaults = dict(defaults)
        self._provider_fields = dict(provider_fields or {})
        self._tails: dict[tuple[int | None, bool], bytes] = {}
        self._provider: tuple[RoutePlan | None, frozenset[str] | None, bytes] = (None, None, b"")
        self.last_fields_bytes = 0
        """Bytes of the request fields in the last body :meth:`encode` built (their
        compact JSON: what bounds the prompt tokens tools and schemas add)."""

    def provider_bytes(self, plan: RoutePlan, demoted: frozenset[str]) -> bytes:
        """The encoded ``provider`` object, recomputed only when the plan or demotions change."""
        cached_plan, cached_demoted, encoded = self._provider
        if cached_plan is plan and cached_demoted is demoted:
            return encoded
        encoded = self.provider_json(plan.provider_object(demoted))
        self._provider = (plan, demoted, encoded)
        return encoded

    @property
    def provider_fields(self) -> Mapping[str, Any]:
        """The router's own ``provider`` fields (``enforce_distillable_text``...)."""
        return self._provider_fields

    def provider_json(self, routing: Mapping[str, Any], *, strict: bool = False) -> bytes:
        """``routing`` with the router's own fields, encoded (:func:`provider_json`)."""
        return provider_json(routing, self._provider_fields, strict=strict)

    def encode(
        self,
        messages: Sequence[Message],
        max_tokens: int | None,
        stream: bool,
        params: Mapping[str, Any],
        provider: bytes,
    ) -> bytes:
        """The body: model, messages, defaults under ``params``, then the rest."""
        return b"".join((self.encode_head(messages, max_tokens, stream, params), provider, b"}"))

    def encode_head(
        self,
        messages: Sequence[Message],
        max_tokens: int | None,
        stream: bool,
        params: Mapping[str, Any],
    ) -> bytes:
        """The body up to its ``provider`` object (``..."provider":``), which the
        endpoint an attempt is admitted to completes."""
        if params:
            tail = self._tail_of({**self._defaults, **params}, max_tokens, stream)
        else:
            key = (max_tokens, stream)
            cached = self._tails.get(key)
            if cached is None:
                cached = self._tail_of(self._defaults, max_tokens, stream)
                if len(self._tails) < _TAIL_CACHE_SIZE:
                    self._tails[key] = cached
            tail = cached
        self.last_fields_bytes = len(tail)
        return b"".join((self._head, encode_json(messages).encode(), tail))

    @staticmethod
    def _tail_of(fields: Mapping[str, Any], max_tokens: int | None, stream: bool) -> bytes:
        rest = dict(fields)
        if max_tokens is not None:
            rest["max_tokens"] = max_tokens
        if stream:
            rest["stream"] = True
        inner = _encode(rest)[1:-1]
        return (b"," + inner.encode() if inner else b"") + b',"provider":'


def messages_problem(messages: object) -> str | None:
    """What is wrong with ``messages`` as a chat's messages, or None if nothing is.

    Asked only after encoding failed (``Router.chat``): the per-request path pays
    nothing for a check that good input never needs.
    """
    example = "[{'role': 'user', 'content': 'Hi'}]"
    if isinstance(messages, str | bytes):
        return (
            f"messages must be a list of {{'role': ..., 'content': ...}} dicts, got a "
            f"{type(messages).__name__}: write router.chat({example}, ...)"
        )
    if not isinstance(messages, Sequence):
        return f"messages must be a list of dicts like {example}, got {type(messages).__name__}"
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            return (
                f"messages[{index}] must be a dict like {{'role': 'user', 'content': ...}}, "
                f"got {type(message).__name__}"
            )
    return None
