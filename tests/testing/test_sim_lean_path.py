"""#13 wave 5: each shortcut on the simulator's JSON path gives what the code it
replaced gave (the replaced code is kept here as the oracle where it is gone)."""

from __future__ import annotations

import asyncio
import math
import random
from types import SimpleNamespace
from typing import Any

import pytest
from _sim_client import StartSim
from aiohttp import web

from provider_router.testing import Market
from provider_router.testing.chat.bodies import Generations
from provider_router.testing.chat.completions import _SERVED, _made
from provider_router.testing.chat.delivery import _json_body
from provider_router.testing.simulator import Simulator


class _OldGenerations:
    """The eviction the queue replaced: a dict, oldest taken by ``next(iter(...))``."""

    def __init__(self) -> None:
        self.fields: dict[str, int] = {}

    def put(self, gen_id: str, value: int) -> None:
        self.fields[gen_id] = value

    def pop_oldest(self) -> str:
        oldest = next(iter(self.fields))
        del self.fields[oldest]
        return oldest


@pytest.mark.parametrize("seed", range(6))
def test_generations_forget_the_oldest_as_the_dict_did(seed: int) -> None:
    """Same ids, same order, same one forgotten, with ids put again (a replaced record
    keeps its place) and pops from full and nearly empty stores alike."""
    rng = random.Random(seed)
    model = Market.default().models["moonshotai/kimi-k2.5"]
    new, old = Generations({model.id: model}), _OldGenerations()
    for step in range(600):
        if new and rng.random() < 0.4:
            assert new.pop_oldest() == old.pop_oldest()
        else:
            gen_id = f"gen-{rng.randrange(40)}"  # repeats: put again in its place
            new.put(
                gen_id, "key-x", step, model, False, "Chutes", 0.1, 0.2, "stop",
                1, 2, 0, 0, step, [("chutes", 200)], None, None,
            )  # fmt: skip
            old.put(gen_id, step)
        assert list(new) == list(old.fields)
        assert len(new) == len(old.fields)
        assert all(new[g].cost_units == v for g, v in old.fields.items())


def _old_rng_keys(seed: int, log_limit: int, fingerprints: list[int]) -> list[bytes]:
    """The random-stream keys ``rng_for`` gave before its queue (the oracle)."""
    occurrences: dict[int, int] = {}
    keys = []
    for fingerprint in fingerprints:
        occurrence = occurrences.get(fingerprint, 0) + 1
        if occurrence == 1 and len(occurrences) >= log_limit:
            del occurrences[next(iter(occurrences))]
        occurrences[fingerprint] = occurrence
        keys.append(b"%d:%d:%d" % (seed, fingerprint, occurrence))
    return keys


@pytest.mark.parametrize("log_limit", [1, 2, 5, 50])
def test_request_streams_are_the_streams_the_dict_gave(log_limit: int) -> None:
    """Same stream per request (the same repeat count, the same fingerprint forgotten
    first) for repeated and distinct requests, below and beyond ``log_limit``."""
    rng = random.Random(log_limit)
    fingerprints = [rng.randrange(12) for _ in range(400)]
    sim = Simulator(seed=3, log_limit=log_limit)
    keys = [sim.rng_for(f)._key for f in fingerprints]
    assert keys == _old_rng_keys(3, log_limit, fingerprints)
    assert len(sim._occurrences) == len(sim._occurrence_order) <= log_limit
    assert list(sim._occurrences) == list(sim._occurrence_order)


class _OwnResponse(web.Response):
    pass


async def _coroutine() -> web.StreamResponse:
    return web.Response()


async def test_made_tells_a_response_from_an_awaitable_as_isinstance_does() -> None:
    waiting = _coroutine()
    try:
        for answer in (
            web.Response(),
            web.Response(status=402),
            web.StreamResponse(),
            _OwnResponse(),
            waiting,
            asyncio.get_running_loop().create_future(),
        ):
            assert _made(answer) is isinstance(answer, web.StreamResponse), answer
    finally:
        waiting.close()


def test_a_served_attempt_is_the_pair_it_was() -> None:
    assert _SERVED["chutes"] == ("chutes", 200)
    assert _SERVED["deepinfra/fp4"] == ("deepinfra/fp4", 200)
    assert _SERVED["chutes"] is _SERVED["chutes"]


async def test_a_json_answer_has_the_headers_it_had(start_sim: StartSim) -> None:
    """The answer's headers, in order, are those ``content_type="application/json"``
    plus the id gave (built here the old way from the same body and id)."""
    _sim, client = await start_sim(speed=math.inf, seed=4)
    reply = await client.chat(content="q", max_tokens=8)
    assert reply.status == 200
    assert reply.headers["content-type"] == "application/json"
    gen_id = reply.headers["x-generation-id"]
    body = reply.text.encode()
    old = web.Response(
        body=body, content_type="application/json", headers={"X-Generation-Id": gen_id}
    )
    plan: Any = SimpleNamespace(gen_id=gen_id)
    new = _json_body(None, plan, body)  # type: ignore[arg-type]
    assert list(new.headers.items()) == list(old.headers.items())
    assert (new.status, new.content_type, new.charset) == (old.status, "application/json", None)
    assert new.body == old.body == body


@pytest.mark.parametrize("max_tokens", [None, 1, 5, 64, 256, 1024])
def test_a_remembered_shape_is_the_shape_computed(max_tokens: int | None) -> None:
    """Requests without reasoning or tools take their shape from a cache by (total,
    max_tokens): the same shape the split computes, cut at ``max_tokens`` alike;
    with reasoning or tools the split runs as before."""
    from provider_router.testing.chat import synth

    plain: dict[str, Any] = {"messages": []}
    for total in (1, 2, 7, 64, 255, 256, 257, 1500):
        assert synth.shape_completion(plain, total, max_tokens) == synth._shape(
            None, total, max_tokens, None
        )
        assert synth.shape_completion(plain, total, max_tokens) is synth.shape_completion(
            plain, total, max_tokens
        )
        shown = {"reasoning": {"effort": "high"}}
        assert synth.shape_completion(shown, total, max_tokens) == synth._shape(
            synth._reasoning_request(shown), total, max_tokens, None
        )
        assert synth.shape_completion(plain, total, max_tokens, 9).finish_reason in (
            "tool_calls",
            "length",
        )


def test_the_shape_cache_stays_bounded() -> None:
    from provider_router.testing.chat import synth

    for total in range(synth._PLAIN_SHAPES_LIMIT + 10):
        synth.shape_completion({}, total + 1, None)
    assert len(synth._PLAIN_SHAPES) <= synth._PLAIN_SHAPES_LIMIT


def _old_counters(records: list[Any]) -> dict[str, int]:
    """What ``RequestLog.finish`` counted before a lone attempt joined the cached names."""
    counters: dict[str, int] = {}

    def add(name: str) -> None:
        counters[name] = counters.get(name, 0) + 1

    for r in records:
        add("requests")
        add(f"route.{r.route}")
        add(f"status.{r.status}")
        if r.route == "chat":
            add(f"outcome.{r.outcome}")
            if r.tag is not None:
                add(f"served.{r.tag}")
            for tag, _status in r.attempts:
                add("attempt." + tag)
    return counters


async def test_the_log_counts_what_it_counted(start_sim: StartSim) -> None:
    """Served at once, after a failed attempt, refused before any attempt (402, 400),
    other routes: the same counters, in the same order, as counted name by name."""
    sim, client = await start_sim(
        speed=math.inf,
        credits="0.01",
        faults=[{"kind": "provider_error", "status": 502, "times": 2}],
    )
    for i in range(4):
        await client.chat(content=f"q{i}", max_tokens=8)
    await client.chat(content="big", max_tokens=10_000_000)  # 402
    await client.chat(content="bad", max_tokens=-1)  # 400
    await client.get("/credits")
    await client.get("/models")
    counted = {k: v for k, v in sim.log.counters.items() if not k.startswith("fault.")}
    expected = _old_counters(list(sim.log))
    assert counted == expected
    assert list(counted) == list(expected), "the same names, first counted in the same order"
    assert any(len(r.attempts) > 1 for r in sim.requests), "a request that fell back"
    assert any(not r.attempts for r in sim.requests), "a request refused before any attempt"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 0),
        ("max_tokens", -3),
        ("max_tokens", True),
        ("max_tokens", 2.5),
        ("max_tokens", "64"),
        ("max_completion_tokens", False),
        ("max_completion_tokens", 0),
        ("n", 0),
        ("n", True),
        ("n", "2"),
        ("n", 1.0),
    ],
)
async def test_a_bad_cap_or_n_is_still_refused_as_it_was(
    start_sim: StartSim, field: str, value: Any
) -> None:
    """The caps and ``n`` are now told from a 400 by not being ints: every bad value
    is refused with the 400 worded as before, and nothing is billed or attempted."""
    sim, client = await start_sim(speed=math.inf)
    reply = await client.chat(content="q", **{field: value})
    assert reply.status == 400
    assert reply.json["error"]["message"] == f"{field}: expected a positive integer, got {value!r}"
    assert sim.requests[0].attempts == []
    assert sim.requests[0].cost_units == 0


@pytest.mark.parametrize(
    "fields",
    [{}, {"max_tokens": 7}, {"max_completion_tokens": 9, "max_tokens": 3}, {"n": 2}, {"n": None}],
)
async def test_good_caps_and_n_are_honoured_as_they_were(
    start_sim: StartSim, fields: dict[str, Any]
) -> None:
    sim, client = await start_sim(speed=math.inf, completion_tokens=20)
    reply = await client.chat(content="q", **fields)
    assert reply.status == 200
    cap = fields.get("max_completion_tokens") or fields.get("max_tokens")
    n = fields.get("n") or 1
    assert len(reply.json["choices"]) == n
    assert reply.json["usage"]["completion_tokens"] == min(20, cap or 20) * n
    assert sim.requests[0].max_tokens == cap
