"""Memory stays flat however many requests the simulator serves: everything it
remembers per request is bounded by ``log_limit``."""

from __future__ import annotations

import math

from _sim_client import StartSim


async def test_everything_remembered_per_request_is_bounded(start_sim: StartSim) -> None:
    sim, client = await start_sim(speed=math.inf, log_limit=5)
    for i in range(12):  # distinct requests: each its own random stream
        reply = await client.chat(content=f"Write sample {i}.", max_tokens=8)
        assert reply.status == 200
    state = sim.simulator
    assert len(state.log) == 5
    assert len(state.generations) == 5
    assert len(state._occurrences) == 5, "one entry per distinct request must not grow forever"
    assert sim.log.counters["requests"] == 12


async def test_a_repeated_request_still_gets_the_next_stream(start_sim: StartSim) -> None:
    sim, client = await start_sim(speed=math.inf, log_limit=5)
    first = await client.chat(content="Same prompt.", max_tokens=64)
    second = await client.chat(content="Same prompt.", max_tokens=64)
    assert first.json["id"] != second.json["id"]
    assert len(sim.simulator._occurrences) == 1
