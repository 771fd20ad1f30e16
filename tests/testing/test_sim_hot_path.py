"""The answer made at once (a JSON answer at infinite speed: plain calls, no coroutine
per layer, a cached byte frame) is the answer that waits: same bytes, same records,
same bill, same ``/generation``."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import pytest
from _sim_client import StartSim

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
