"""The answer made at once (a JSON answer at infinite speed: plain calls, no coroutine
per layer, a cached byte frame) is the answer that waits: same bytes, same records,
same bill, same ``/generation``."""

from __future__ import annotations

import dataclasses
import gc
import math
import random
import re
from collections.abc import Collection
from typing import Any

import pytest
from _sim_client import StartSim

from provider_router.testing import Market
from provider_router.testing.chat.bodies import Generation
from provider_router.testing.market.provider_routing import (
    RoutingError,
    parse_preferences,
    plan_route,
)

_CREATED = re.compile(r'"created":\d+|gen-\d+-|"created_at":"[^"]*"')
"""The wall-clock second an answer was made: the two runs may straddle one."""

SHAPES: list[tuple[str, dict[str, Any], list[dict[str, Any]]]] = [
    # Faults as mappings: each simulator gets its own (a Fault counts what it saw).
    ("plain", {"max_tokens": 64}, []),
    ("cut at max_tokens", {"max_tokens": 5}, []),
    ("reasoning shown", {"reasoning": {"effort": "high"}}, []),
    ("reasoning hidden", {"reasoning": {"effort": "low", "exclude": True}}, []),
    ("n choices", {"n": 3, "max_tokens": 16}, []),
    ("tool call", {"tools": [{"type": "function", "function": {"name": "f"}}]}, []),
    ("no usage cost", {"max_tokens": 32}, [{"kind": "no_usage_cost"}]),
    ("error 200", {"max_tokens": 32}, [{"kind": "error_200", "after_tokens": 3}]),
    ("a 502 before the answer", {}, [{"kind": "provider_error", "status": 502, "times": 1}]),
]


async def _run(
    start_sim: StartSim, speed: float, body: dict[str, Any], faults: list[dict[str, Any]]
) -> tuple[Any, ...]:
    async def no_sleep(_seconds: float) -> None:
        return None

    sim, client = await start_sim(
        speed=speed, seed=11, generation_404s=0, faults=faults, sleep=no_sleep, clock=lambda: 0.0
    )
    seen: list[Any] = []
    for i in range(4):
        reply = await client.chat(content=f"Question {i}?", **body)
        kind = reply.headers.get("content-type")
        seen.append((reply.status, _CREATED.sub("-", reply.text), kind))
        gen_id = reply.headers.get("x-generation-id")
        if gen_id is not None:
            gen = await client.get("/generation", id=gen_id)
            seen.append((gen.status, _CREATED.sub("-", gen.text)))
    records = [
        {**dataclasses.asdict(r), "generation_id": None} for r in sim.requests
    ]  # the id holds the wall-clock second
    return seen, records, sim.balance, dict(sim.log.counters)


@pytest.mark.parametrize(("name", "body", "faults"), SHAPES, ids=[s[0] for s in SHAPES])
async def test_an_answer_made_at_once_is_the_answer_that_waited(
    start_sim: StartSim, name: str, body: dict[str, Any], faults: list[dict[str, Any]]
) -> None:
    at_once = await _run(start_sim, math.inf, body, faults)
    waited = await _run(start_sim, 1000.0, body, faults)
    assert at_once == waited
    assert at_once[2] < 100 or name == "error 200", "the answers were billed"


async def test_an_answer_made_at_once_releases_what_it_held(start_sim: StartSim) -> None:
    """The hold on the credits and the in-flight counts end with the answer, as when
    the answer was a coroutine awaited inside ``try/finally``."""
    sim, client = await start_sim(speed=math.inf)
    state = sim.simulator
    for i in range(3):
        assert (await client.chat(content=f"q{i}", max_tokens=8)).status == 200
    assert state.account.holds == 0
    assert set(state.key_in_flight.values()) == {0}
    assert set(state.in_flight.values()) == {0}


async def test_a_kept_generation_reads_back_as_the_record_it_was(start_sim: StartSim) -> None:
    """``/generation`` records are kept as flat tuples and read back as the
    :class:`Generation` a dataclass per record held: same fields, the market's own
    model, the attempts as the request log has them (a failed one first here)."""
    sim, client = await start_sim(
        speed=math.inf,
        log_limit=3,
        faults=[{"kind": "provider_error", "status": 502, "times": 2}],
    )
    replies = [
        await client.chat(headers={"User-Agent": f"ua-{i}"}, content=f"q{i}", max_tokens=8)
        for i in range(5)
    ]
    state = sim.simulator
    records = {r.generation_id: r for r in sim.requests}
    kept = [reply.headers["x-generation-id"] for reply in replies[2:]]
    assert list(state.generations) == kept, "the latest three, oldest first"
    assert len(state.generations) == 3
    assert replies[0].headers["x-generation-id"] not in state.generations
    assert state.generations.get(replies[0].headers["x-generation-id"]) is None
    with pytest.raises(KeyError):
        state.generations[replies[1].headers["x-generation-id"]]
    for gen_id in kept:
        generation = state.generations[gen_id]
        record = records[gen_id]
        model = state.market.models[record.model or ""]
        assert generation == Generation(
            gen_id,
            record.key_label or "",
            generation.created,
            model,
            False,
            record.provider or "",
            generation.ttft,
            generation.duration,
            record.finish_reason or "",
            record.prompt_tokens,
            record.completion_tokens,
            record.reasoning_tokens,
            record.cached_tokens,
            record.cost_units,
            record.attempts,
            generation.user_agent,
            None,
        )
        assert generation.model is model
        assert generation.user_agent is not None
        assert generation.user_agent.startswith("ua-")
        assert generation.body()["usage"] == float(record.cost)
    assert [len(state.generations[g].attempts) for g in kept] == [1, 1, 1]
    assert sum(g.cost_units for g in state.generations.values()) == sum(
        records[g].cost_units for g in kept
    )
    gc.collect()
    assert not any(gc.is_tracked(f) for f in state.generations._fields.values()), (
        "a kept record is strings and numbers only: the collector stops looking at it"
    )


async def test_a_generation_after_failed_attempts_keeps_them_in_order(start_sim: StartSim) -> None:
    sim, client = await start_sim(
        speed=math.inf, faults=[{"kind": "provider_error", "status": 502, "times": 1}]
    )
    reply = await client.chat(content="q", max_tokens=8)
    (record,) = sim.requests
    assert len(record.attempts) == 2
    assert record.attempts[0][1] == 502
    generation = sim.simulator.generations[reply.headers["x-generation-id"]]
    assert generation.attempts == record.attempts
    assert [p["status"] for p in generation.body()["provider_responses"]] == [502, 200]


@pytest.mark.parametrize(
    "used",
    [(), ("max_tokens",), ("tools",), ("response_format", "max_tokens"), ("verbosity", "tools")],
)
@pytest.mark.parametrize(
    "provider", [None, {"require_parameters": True}, {"sort": "price"}, {"only": ["chutes"]}]
)
@pytest.mark.parametrize("unstable", [frozenset(), {"chutes"}])
def test_the_parameters_a_request_uses_route_alike_as_a_set(
    used: tuple[str, ...], provider: dict[str, Any] | None, unstable: frozenset[str] | set[str]
) -> None:
    """The chat handler passes the parameters a body uses as a set (one C call, no
    list); routing gives what it gave for the list in body order, seed for seed."""
    model = Market.default().models["moonshotai/kimi-k2.5"]
    prefs = parse_preferences(provider)

    def tags(params: Collection[str], seed: int) -> object:
        try:
            return [e.tag for e in plan_route(model, prefs, params, random.Random(seed), unstable)]
        except RoutingError as exc:  # the same refusal, worded the same
            return (exc.status, exc.message)

    for seed in range(5):
        assert tags(set(used), seed) == tags(list(used), seed)
