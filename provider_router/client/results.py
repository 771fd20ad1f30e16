"""What a finished chat request returns: plain frozen dataclasses, cheap to build.

The per-request path builds these, so they are dataclasses parsed by hand from the
decoded JSON, not pydantic models. :class:`ChatResult` and :class:`Usage` are built
once per request: the router fills their ``__dict__`` in one step
(:func:`chat_result`, :meth:`Usage.from_json`), cheaper than the frozen
``__init__`` (docs/performance.md). They stay frozen dataclasses for their users:
same fields, equality, ``repr``, ``dataclasses.replace``, and assigning an attribute
raises.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from types import MappingProxyType
from typing import Any, Final

from provider_router._exceptions import InvalidResponseError
from provider_router._format import readable_repr, tidy
from provider_router._money import reported_cost
from provider_router.client.router_metadata import RouterMetadata

__all__ = ["ChatResult", "StreamDelta", "TokenLogprob", "ToolCall", "ToolCallDelta", "Usage"]

_new: Final = object.__new__
_set: Final = object.__setattr__  # the frozen __setattr__ refuses even __dict__
_EMPTY: Final[Mapping[str, Any]] = MappingProxyType({})


def _int(value: object) -> int:
    # type() first: decoded JSON counts are exact ints (bool is an int subclass).
    if type(value) is int:
        return value
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


# Not slots: a dict-backed instance can be filled in one step (see the module doc).
@dataclass(frozen=True)
class Usage:
    """Token counts and cost of one request, as OpenRouter reported them.

    ``cached_tokens`` and ``cache_write_tokens`` are part of ``prompt_tokens``;
    ``reasoning_tokens`` are part of ``completion_tokens`` (and billed at the
    completion rate). ``cost`` is the USD charge the answer reported, ``None`` when
    it did not say or said something that is not a JSON number (a string, a
    boolean, NaN). It is kept as reported, even negative or absurd: the router
    checks it against its reservation before booking it (docs/ledger.md).
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    cost: Decimal | None = None

    __repr__ = readable_repr

    @classmethod
    def from_json(cls, raw: object) -> Usage | None:
        """Parse a response's ``usage`` object; ``None`` when there is none.

        Tolerant: missing or malformed counts read as 0, a cost that is not a JSON
        number as ``None`` (unknown, never 0).
        """
        # type() first: decoded JSON is dicts, and an ABC check costs far more.
        if type(raw) is not dict and not isinstance(raw, Mapping):
            return None
        get = raw.get
        prompt_details = get("prompt_tokens_details")
        completion_details = get("completion_tokens_details")
        if type(prompt_details) is not dict and not isinstance(prompt_details, Mapping):
            prompt_details = _EMPTY
        if type(completion_details) is not dict and not isinstance(completion_details, Mapping):
            completion_details = _EMPTY
        cost_raw = get("cost")
        cost: Decimal | None
        if type(cost_raw) is Decimal and cost_raw.is_finite():
            cost = cost_raw  # pinned from the wire's digits (pin_exact_cost)
        else:
            # Only a JSON number is a cost: a string, a boolean, NaN is missing. A
            # negative one is kept as reported: the router disputes it (_billing).
            cost = reported_cost(cost_raw)
        # _int inlined for the usual exact int (a call each costs more than the test).
        prompt = get("prompt_tokens")
        if type(prompt) is not int:
            prompt = _int(prompt)
        completion = get("completion_tokens")
        if type(completion) is not int:
            completion = _int(completion)
        total = get("total_tokens")
        if type(total) is not int:
            total = _int(total)
        cached = prompt_details.get("cached_tokens")
        if type(cached) is not int:
            cached = _int(cached)
        written = prompt_details.get("cache_write_tokens")
        if type(written) is not int:
            written = _int(written)
        reasoning = completion_details.get("reasoning_tokens")
        if type(reasoning) is not int:
            reasoning = _int(reasoning)
        fields: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": total or prompt + completion,
            "cached_tokens": cached,
            "cache_write_tokens": written,
            "reasoning_tokens": reasoning,
            "cost": cost,
        }
        if cls is not Usage:
            return cls(**fields)  # a subclass may check its fields in __init__
        usage = _new(cls)
        _set(usage, "__dict__", fields)
        return usage


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A function call the model asked for (``message.tool_calls[i]``).

    Attributes:
        id: the call's id; a ``role: "tool"`` reply names it in ``tool_call_id``.
        name: the function's name.
        arguments: the arguments exactly as the model wrote them: a JSON text,
            which may be cut short (``finish_reason: "length"``) or malformed.
        index: position among the message's calls.
    """

    id: str
    name: str
    arguments: str
    index: int = 0

    def parsed_arguments(self) -> dict[str, Any]:
        """The arguments as a JSON object (``{}`` for empty arguments).

        Raises:
            InvalidResponseError: the arguments are not a JSON object; the message
                names the call and shows the start of the text.
        """
        if not self.arguments.strip():
            return {}
        try:
            value = json.loads(self.arguments)
        except ValueError as exc:
            raise InvalidResponseError(
                f"tool call {self.id!r} ({self.name}): arguments are not valid JSON "
                f"({exc}): {self.arguments[:200]!r}"
            ) from exc
        if not isinstance(value, dict):
            raise InvalidResponseError(
                f"tool call {self.id!r} ({self.name}): arguments are JSON "
                f"{type(value).__name__}, not an object: {self.arguments[:200]!r}"
            )
        return value

    def message(self) -> dict[str, Any]:
        """The call as an assistant message's ``tool_calls`` entry, to send it back."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }

    @classmethod
    def from_json(cls, raw: object, position: int) -> ToolCall | None:
        """Read one ``tool_calls`` entry; ``None`` when it is not an object. Tolerant:
        missing strings read as ``""``, an arguments object is re-encoded as JSON."""
        if not isinstance(raw, Mapping):
            return None
        function = raw.get("function")
        function = function if isinstance(function, Mapping) else {}
        arguments = function.get("arguments")
        if isinstance(arguments, Mapping):
            arguments = json.dumps(arguments)
        index = raw.get("index")
        return cls(
            id=raw["id"] if isinstance(raw.get("id"), str) else "",
            name=function["name"] if isinstance(function.get("name"), str) else "",
            arguments=arguments if isinstance(arguments, str) else "",
            index=index if isinstance(index, int) and not isinstance(index, bool) else position,
        )


def _finite(value: object) -> float | None:
    if type(value) is float or (isinstance(value, int | float) and not isinstance(value, bool)):
        number = float(value)
        return number if math.isfinite(number) and number <= 0.0 else None
    return None


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token with its log probability and the most likely alternatives
    (``choices[0].logprobs.content[i]``, asked for with ``logprobs=True,
    top_logprobs=K``).

    Attributes:
        token: the token as text.
        logprob: its natural-log probability (≤ 0).
        top: the ``K`` most likely tokens at this position as ``(token, logprob)``
            pairs, most likely first (empty when ``top_logprobs`` was 0).
    """

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()

    @classmethod
    def from_json(cls, raw: object) -> TokenLogprob | None:
        """Read one ``content`` entry; ``None`` when it is not a token with a finite
        log probability ≤ 0. Malformed alternatives are left out."""
        if not isinstance(raw, Mapping):
            return None
        token, logprob = raw.get("token"), _finite(raw.get("logprob"))
        if not isinstance(token, str) or logprob is None:
            return None
        top: list[tuple[str, float]] = []
        alternatives = raw.get("top_logprobs")
        for entry in alternatives if isinstance(alternatives, list) else ():
            if isinstance(entry, Mapping):
                alt, alt_logprob = entry.get("token"), _finite(entry.get("logprob"))
                if isinstance(alt, str) and alt_logprob is not None:
                    top.append((alt, alt_logprob))
        top.sort(key=lambda pair: -pair[1])
        return cls(token, logprob, tuple(top))


def parse_logprobs(raw: object) -> tuple[TokenLogprob, ...] | None:
    """A choice's (or stream chunk's) ``logprobs`` object: its ``content`` tokens, or
    ``None`` when it has none (``logprobs: null``: not asked for, or not supported)."""
    if not isinstance(raw, Mapping):
        return None
    content = raw.get("content")
    if not isinstance(content, list):
        return None
    parsed = (TokenLogprob.from_json(entry) for entry in content)
    return tuple(entry for entry in parsed if entry is not None)


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of a streamed tool call: the first piece of a call carries its
    ``id`` and ``name``; later pieces only ``index`` and more ``arguments`` text.
    :attr:`ChatResult.tool_calls` holds the calls put together."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None


# Not slots: a dict-backed instance can be filled in one step (see the module doc).
@dataclass(frozen=True)
class ChatResult:
    """One completed chat request.

    Attributes:
        text: the assistant's reply (``message.content``; ``""`` when none).
        reasoning: the reasoning text, when the model produced one.
        provider: display name of the provider that served it (e.g. ``"Chutes"``).
        model: the model (permaslug) that served it.
        generation_id: OpenRouter's ``gen-...`` id, for ``/generation``.
        finish_reason: normalised finish reason (``stop``, ``length``, ``tool_calls``...).
            ``tool_calls`` means the model wants :attr:`tool_calls` run.
        usage: token counts and cost, when reported.
        cost: the USD charged to the ledger: ``usage.cost``, else what
            ``/generation`` said, else the reserved worst case.
        estimate: our own price of it from the catalog listing, when computable.
        reserved: the worst case that was reserved for it.
        quarantined: ``True`` when a provider the policy does not allow served
            it: the output must not be used as if it were compliant.
        quarantine_reason: why, when quarantined.
        attempts: attempts it took (1 = first try).
        latency: seconds from the first attempt to the result.
        message: the raw assistant message (``reasoning_details``, ``tool_calls``...).
        native_finish_reason: the provider's own finish reason.
        tool_calls: the function calls the model asked for, in order (empty when none).
        disputed_cost: the ``usage.cost`` the answer reported when the router did
            not book it (negative, or far above its reservation and not confirmed
            by OpenRouter's ``/generation`` record): :attr:`cost` is then what was
            booked instead, the reservation's worst case (docs/ledger.md, "Disputed").
        logprobs: the content tokens with their log probabilities, when asked for
            (``logprobs=True``) and the provider returned them; ``None`` otherwise.
        floor_cost: the answer's tokens at the floor's prices (the cheapest allowed
            endpoint for the router's workload): what :attr:`cost` is compared with.
        waited: seconds the request waited for an endpoint with room (admission).
        refusals: 429s of full endpoints it went back to admission after.
        endpoint: the tag of the endpoint its answer was admitted to (a response
            names only the provider, and two endpoints of one provider share it).
        cache_status: OpenRouter's ``X-OpenRouter-Cache-Status`` with response
            caching on (``"HIT"``: a free replay of an earlier answer; ``"MISS"``);
            ``None`` when caching is off or the answer did not say.
        router_metadata: OpenRouter's routing trace (attempts, pipeline stages such as
            context compression), when asked for (``Router(router_metadata=True)``)
            and sent; ``None`` otherwise.
    """

    text: str
    reasoning: str | None
    provider: str | None
    model: str | None
    generation_id: str | None
    finish_reason: str | None
    usage: Usage | None
    cost: Decimal | None
    estimate: Decimal | None = None
    reserved: Decimal | None = None
    quarantined: bool = False
    quarantine_reason: str | None = None
    attempts: int = 1
    latency: float = 0.0
    message: Mapping[str, Any] = field(default_factory=dict, repr=False)
    native_finish_reason: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    disputed_cost: Decimal | None = None
    logprobs: tuple[TokenLogprob, ...] | None = field(default=None, repr=False)
    floor_cost: Decimal | None = None
    waited: float = 0.0
    refusals: int = 0
    endpoint: str | None = None
    cache_status: str | None = None
    router_metadata: RouterMetadata | None = field(default=None, repr=False)

    __repr__ = readable_repr

    @property
    def price_vs_floor(self) -> Decimal | None:
        """``cost / floor_cost``: 1 when the floor served it (``None``: unknown)."""
        if self.cost is None or not self.floor_cost:
            return None
        return self.cost / self.floor_cost

    @property
    def drift(self) -> Decimal | None:
        """``cost - estimate``: how far our own price was from OpenRouter's (``0``, never
        ``0E-8``)."""
        if self.cost is None or self.estimate is None:
            return None
        return tidy(self.cost - self.estimate)


def chat_result(
    text: str,
    reasoning: str | None,
    provider: str | None,
    model: str | None,
    generation_id: str | None,
    finish_reason: str | None,
    usage: Usage | None,
    cost: Decimal | None,
    estimate: Decimal | None,
    reserved: Decimal | None,
    quarantined: bool,
    quarantine_reason: str | None,
    attempts: int,
    latency: float,
    message: Mapping[str, Any],
    native_finish_reason: str | None,
    tool_calls: tuple[ToolCall, ...],
    disputed_cost: Decimal | None = None,
    logprobs: tuple[TokenLogprob, ...] | None = None,
    floor_cost: Decimal | None = None,
    waited: float = 0.0,
    refusals: int = 0,
    endpoint: str | None = None,
    cache_status: str | None = None,
    router_metadata: RouterMetadata | None = None,
) -> ChatResult:
    """A :class:`ChatResult` with every field given, its ``__dict__`` filled in one step.

    The same object ``ChatResult(...)`` builds, at a quarter of the cost (the
    router builds one per request; see the module doc).
    """
    result = _new(ChatResult)
    _set(
        result,
        "__dict__",
        {
            "text": text,
            "reasoning": reasoning,
            "provider": provider,
            "model": model,
            "generation_id": generation_id,
            "finish_reason": finish_reason,
            "usage": usage,
            "cost": cost,
            "estimate": estimate,
            "reserved": reserved,
            "quarantined": quarantined,
            "quarantine_reason": quarantine_reason,
            "attempts": attempts,
            "latency": latency,
            "message": message,
            "native_finish_reason": native_finish_reason,
            "tool_calls": tool_calls,
            "disputed_cost": disputed_cost,
            "logprobs": logprobs,
            "floor_cost": floor_cost,
            "waited": waited,
            "refusals": refusals,
            "endpoint": endpoint,
            "cache_status": cache_status,
            "router_metadata": router_metadata,
        },
    )
    return result


def routed(
    result: ChatResult,
    floor_cost: Decimal | None,
    waited: float,
    refusals: int,
    endpoint: str | None,
) -> None:
    """Fill the admission fields of a result :func:`chat_result` just built (before
    anyone else sees it: the result is frozen for its users)."""
    fields = result.__dict__
    fields["floor_cost"] = floor_cost
    fields["waited"] = waited
    fields["refusals"] = refusals
    fields["endpoint"] = endpoint


@dataclass(frozen=True, slots=True)
class StreamDelta:
    """A piece of a streamed reply.

    ``tool_calls`` carries pieces of tool calls (see :class:`ToolCallDelta`).
    When an attempt fails mid-stream and is retried, deltas of the new attempt
    carry a higher ``attempt``: a consumer that shows text as it arrives should
    discard what it showed for the earlier attempt.
    """

    text: str = ""
    reasoning: str = ""
    attempt: int = 1
    tool_calls: tuple[ToolCallDelta, ...] = ()
