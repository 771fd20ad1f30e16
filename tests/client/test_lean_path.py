"""The router's per-request shortcuts (#13 wave 3) build and read exactly what the plain code does.

Each shortcut skips work the general code does on every request (a frozen
``__init__``, ``json.loads``' encoding detection, an encoder built per call, a
coroutine layer); these tests hold each one equal to the code it stands in for,
on real answers of the local OpenRouter and on the odd inputs the general code
handles.
"""

from __future__ import annotations

import codecs
import copy
import dataclasses
import json
import pickle
from decimal import Decimal
from typing import Any

import pytest
from _router_helpers import MESSAGES, MakeRouter

from provider_router import ChatResult, ConfigurationError, MemoryLedger, Router, Usage
from provider_router._json import loads as _loads
from provider_router.catalog._billable import measure
from provider_router.client._completion import parse_completion
from provider_router.client._request import PreparedRequest, _encode, encode_json
from provider_router.client.results import TokenLogprob, ToolCall, chat_result
from provider_router.client.router_metadata import RouteAttempt, RouterMetadata
from provider_router.ledger import Reservation
from provider_router.ledger._base import RESERVATION_FIELDS
from provider_router.testing import SimulatorServer

FIELDS = {
    "text": "hi",
    "reasoning": None,
    "provider": "Chutes",
    "model": "moonshotai/kimi-k2.5",
    "generation_id": "gen-1",
    "finish_reason": "stop",
    "usage": Usage(3, 4, 7, cost=Decimal("0.000012")),
    "cost": Decimal("0.000012"),
    "estimate": Decimal("0.000011"),
    "reserved": Decimal("0.0002"),
    "quarantined": False,
    "quarantine_reason": None,
    "attempts": 2,
    "latency": 0.25,
    "message": {"role": "assistant", "content": "hi"},
    "native_finish_reason": "end_turn",
    "tool_calls": (ToolCall("call_1", "f", "{}"),),
    "disputed_cost": Decimal("5"),
    "logprobs": (TokenLogprob("hi", -0.1, (("hi", -0.1), ("ho", -2.5))),),
    "floor_cost": Decimal("0.000010"),
    "waited": 0.5,
    "refusals": 1,
    "endpoint": "chutes",
    "cache_status": "HIT",
    "router_metadata": RouterMetadata(1, (RouteAttempt("Chutes", "a/b", 200),)),
}


def test_chat_result_builds_the_same_object_as_the_constructor() -> None:
    # Every field, in the dataclass's order: a field added to ChatResult and not
    # to chat_result fails here.
    assert list(FIELDS) == [f.name for f in dataclasses.fields(ChatResult)]
    fast = chat_result(*FIELDS.values())
    plain = ChatResult(**FIELDS)
    assert type(fast) is ChatResult
    assert fast == plain
    assert repr(fast) == repr(plain)
    assert dataclasses.asdict(fast) == dataclasses.asdict(plain)
    assert dataclasses.replace(fast, attempts=3) == dataclasses.replace(plain, attempts=3)
    assert fast.drift == Decimal("0.000001")


def test_results_survive_pickle_and_copy() -> None:
    """No longer slotted: pickling and copying go through ``__dict__`` and still work."""
    import copy
    import pickle

    usage = Usage.from_json({"prompt_tokens": 3, "completion_tokens": 2, "cost": Decimal("0.1")})
    result = chat_result(*{**FIELDS, "usage": usage}.values())
    for obj in (usage, result):
        assert pickle.loads(pickle.dumps(obj)) == obj  # noqa: S301 (our own bytes)
        assert copy.copy(obj) == obj
        assert copy.deepcopy(obj) == obj
    assert hash(usage) == hash(Usage(3, 2, 5, cost=Decimal("0.1")))


def test_results_stay_immutable() -> None:
    result = chat_result(*FIELDS.values())
    usage = Usage.from_json({"prompt_tokens": 1, "completion_tokens": 2})
    assert usage is not None
    for obj, name in ((result, "cost"), (result, "anything"), (usage, "cost")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        del result.text


@pytest.mark.parametrize(
    "raw",
    [
        {
            "prompt_tokens": 10,
            "completion_tokens": 5,
            "total_tokens": 15,
            "cost": Decimal("0.00001234567890123"),
            "prompt_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 2},
            "completion_tokens_details": {"reasoning_tokens": 3},
        },
        {"prompt_tokens": True, "completion_tokens": "5", "cost": 0.5},
        {"prompt_tokens": 2, "cost": "-1", "prompt_tokens_details": None},
        {"cost": Decimal("NaN")},
        {"cost": Decimal("-0.1")},
        {"cost": "junk", "completion_tokens_details": []},
        {},
    ],
)
def test_usage_from_json_equals_the_constructor(raw: dict[str, Any]) -> None:
    usage = Usage.from_json(raw)
    assert type(usage) is Usage
    details = raw.get("prompt_tokens_details") or {}
    reasoning = (
        (raw.get("completion_tokens_details") or {})
        if isinstance(raw.get("completion_tokens_details"), dict)
        else {}
    )

    def count(value: object) -> int:
        return value if type(value) is int else 0

    cost = raw.get("cost")
    if isinstance(cost, Decimal):
        # A negative one is kept as reported: the router disputes it (#21).
        expected_cost = cost if cost.is_finite() else None
    elif cost == 0.5:
        expected_cost = Decimal("0.5")
    else:
        expected_cost = None
    prompt, completion = count(raw.get("prompt_tokens")), count(raw.get("completion_tokens"))
    assert usage == Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=count(raw.get("total_tokens")) or prompt + completion,
        cached_tokens=count(details.get("cached_tokens")),
        cache_write_tokens=count(details.get("cache_write_tokens")),
        reasoning_tokens=count(reasoning.get("reasoning_tokens")),
        cost=expected_cost,
    )


def test_usage_from_json_of_a_subclass_goes_through_its_init() -> None:
    @dataclasses.dataclass(frozen=True)
    class Checked(Usage):
        def __post_init__(self) -> None:
            if self.prompt_tokens > 100:
                raise ValueError("too many")

    assert type(Checked.from_json({"prompt_tokens": 1})) is Checked
    with pytest.raises(ValueError, match="too many"):
        Checked.from_json({"prompt_tokens": 101})


def test_parse_completion_reads_every_field() -> None:
    body = {
        "id": "gen-1",
        "provider": "Chutes",
        "model": "moonshotai/kimi-k2.5",
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": "",
                    "reasoning": "because",
                    "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}],
                },
                "finish_reason": "tool_calls",
                "native_finish_reason": 7,
            }
        ],
    }
    completion = parse_completion(body)
    assert (completion.text, completion.reasoning) == ("", "because")
    assert (completion.provider, completion.model, completion.generation_id) == (
        "Chutes",
        "moonshotai/kimi-k2.5",
        "gen-1",
    )
    assert (completion.finish_reason, completion.native_finish_reason) == ("tool_calls", None)
    assert completion.tool_calls == (ToolCall("c", "f", "{}"),)
    assert completion.message is body["choices"][0]["message"]  # type: ignore[index]
    assert completion.error is None
    assert completion.usage == Usage(3, 2, 5)
    bare = parse_completion({"choices": [{"message": None, "finish_reason": None}]})
    assert (bare.text, bare.reasoning, bare.message, bare.tool_calls) == ("", None, {}, ())
    errored = parse_completion({"choices": [{"finish_reason": "error"}], "provider": "X"})
    assert errored.error is not None
    assert errored.error.provider_name == "X"
    only_error = parse_completion({"error": {"code": 502, "message": "upstream"}})
    assert only_error.error is not None
    assert only_error.message == {}


@pytest.mark.parametrize(
    "body",
    [
        b'{"a": 1, "usage": {"cost": 0.5}}',
        b'\n\n  {"a": "\xc3\xa9"}  \n',
        b"[1, 2]",
        b"\t{}",
        codecs.BOM_UTF8 + b'{"a": 1}',
        '{"a": "é"}'.encode("utf-16-le"),
        '{"a": "é"}'.encode("utf-16"),
        '{"a": 1}'.encode("utf-32"),
        b'{"a": "\xed\xa0\x80"}',  # a lone surrogate: json.loads' surrogatepass keeps it
        b"1",
    ],
)
def test_loads_decodes_what_json_loads_decodes(body: bytes) -> None:
    assert _loads(body) == json.loads(body)


@pytest.mark.parametrize("body", [b"", b"{", b'{"a": 1} x', b"\xff\xfe", b'{"a": "\xff"}', b" "])
def test_loads_refuses_what_json_loads_refuses(body: bytes) -> None:
    with pytest.raises((json.JSONDecodeError, UnicodeDecodeError)) as expected:
        json.loads(body)
    with pytest.raises(type(expected.value)) as got:
        _loads(body)
    assert str(got.value) == str(expected.value)


@pytest.mark.parametrize(
    "value",
    [
        [{"role": "user", "content": 'h\u00e9llo \u2028 "quoted" \\ \n'}],
        [{"role": "user", "content": [{"type": "text", "text": "x"}]}, {"role": "assistant"}],
        "a string",
        [1.5, float("nan"), float("inf"), None, True, 10**30],
        {"nested": {"list": [1, 2, {"k": ()}]}},
    ],
)
def test_encode_json_equals_the_compact_encoder(value: Any) -> None:
    assert encode_json(value) == _encode(value)


def test_encode_json_refuses_what_the_encoder_refuses() -> None:
    for bad in ([object()], {1j: 2}, [{"content": Decimal(1)}]):
        with pytest.raises(TypeError) as expected:
            _encode(bad)
        with pytest.raises(TypeError) as got:
            encode_json(bad)
        assert str(got.value) == str(expected.value)


@pytest.mark.parametrize(("stream", "key"), [(False, None), (True, "prompt-7")])
async def test_the_prepared_request_has_each_field_in_place(
    openrouter_sim: SimulatorServer, make_router: MakeRouter, stream: bool, key: str | None
) -> None:
    """The router builds its PreparedRequest positionally (cheaper than keywords):
    every field must land where the keyword construction puts it."""
    router = await make_router(openrouter_sim, ledger=MemoryLedger(Decimal(1)))
    on_delta = print  # any callable: only its identity is checked
    request = router._build_request(MESSAGES, 64, stream, key, on_delta, {})
    plan = router.plan
    prompt_tokens, images = measure(MESSAGES)
    encoder = router._encoder
    # The payload and the worst case are the admitted endpoint's, set per attempt.
    expected = PreparedRequest(
        payload=b"",
        stream=stream,
        key=key if key is not None else request.key,
        worst_case=Decimal(0),
        prompt_estimate=prompt_tokens,
        plan=plan,
        on_delta=on_delta,
        deadline=request.deadline,
        pin_needs=((), prompt_tokens + 64),
        head=encoder.encode_head(MESSAGES, 64, stream, {}),
        prompt_tokens=prompt_tokens,
        images=images,
        cap=64,
    )
    assert request == expected
    route = plan.route("chutes")
    assert route.worst_case(request.prompt_tokens, request.cap, request.images) == (
        prompt_tokens * route.prompt_price + 64 * route.completion_price + route.request_price
    )
    assert request.key.startswith("req-") if key is None else request.key == key
    assert request.deadline == (router.timeouts.request if not stream else 120 + 64 / 10)
    assert (request.generation_id, request.attempts, request.sent) == (None, 0, False)
    unopened = Router(router.model, base_url=router.base_url, api_key="k")
    with pytest.raises(ConfigurationError, match="not open"):
        unopened._plans.current()


async def test_a_routed_answer_matches_the_plain_objects(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    """A real answer through the lean path: the result equals one built the plain way."""
    ledger = MemoryLedger(Decimal(1))
    router = await make_router(openrouter_sim, ledger=ledger)
    result = await router.chat(MESSAGES, max_tokens=50)
    plain = ChatResult(**{f.name: getattr(result, f.name) for f in dataclasses.fields(result)})
    assert result == plain
    assert result.usage is not None
    assert result.usage == Usage(**dataclasses.asdict(result.usage))
    assert result.cost == result.usage.cost == openrouter_sim.simulator.usage
    state = await ledger.snapshot()
    assert (state.spent, state.reserved, state.open) == (result.cost, 0, 0)


async def test_the_memory_ledgers_reservation_is_a_plain_reservation() -> None:
    """MemoryLedger sets the frozen Reservation's slots directly: every field, in order."""
    assert tuple(f.name for f in dataclasses.fields(Reservation)) == RESERVATION_FIELDS
    ledger = MemoryLedger(Decimal(1))
    held = await ledger.reserve(Decimal("0.25"), key="k-1")
    assert type(held) is Reservation
    assert held == Reservation(held.id, 250_000_000_000, "k-1", None, held.owner)
    assert held.owner
    assert held.amount == Decimal("0.25")
    assert hash(held) == hash(Reservation(held.id, held.units, "k-1", None, held.owner))
    with pytest.raises(dataclasses.FrozenInstanceError):
        held.units = 1  # type: ignore[misc]
    plain = Reservation(held.id, held.units, "k-1", None, held.owner)
    assert repr(held) == repr(plain)
    assert pickle.loads(pickle.dumps(held)) == held  # noqa: S301 (our own bytes)
    assert copy.copy(held) == held
    replaced = dataclasses.replace(held, generation_id="g")
    assert replaced == dataclasses.replace(plain, generation_id="g")
    assert not hasattr(held, "__dict__")
    await ledger.settle(held, Decimal("0.1"))
    assert (await ledger.snapshot()).spent == Decimal("0.1")


def test_a_reservation_layout_change_fails_every_reserve_loudly() -> None:
    """The memory ledger builds a Reservation by ``__class__`` assignment from a
    writable twin with the same slots: Python refuses it when the layouts differ,
    so a field added to one and not the other cannot go unnoticed."""
    from provider_router.ledger import _base

    class Other:
        __slots__ = (*RESERVATION_FIELDS, "extra")

    twin = _base._Building()
    with pytest.raises(TypeError, match="layout"):
        twin.__class__ = Other  # type: ignore[assignment]
