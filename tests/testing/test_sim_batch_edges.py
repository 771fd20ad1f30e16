"""The simulated Batch API's sharp edges, each a switch a test can turn on: a line that
fails its whole batch after the 202, the 64-character ``custom_id`` cap, a fresh id's
404, a Batch API unreachable for the key, and a batch served against its pin."""

from __future__ import annotations

import math
from typing import Any

import pytest
from _sim_client import StartSim

K3 = "moonshotai/kimi-k3"


def body(*, custom_id: str = "p-0", content: str = "hello", **fields: Any) -> dict[str, Any]:
    line = {
        "custom_id": custom_id,
        "body": {"messages": [{"role": "user", "content": content}], "max_tokens": 50, **fields},
    }
    ok = {
        "custom_id": "ok",
        "body": {"messages": [{"role": "user", "content": "fine"}], "max_tokens": 50},
    }
    return {"endpoint": "/v1/chat/completions", "model": K3, "requests": [ok, line]}


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"temperature": 2.5}, "Request at line 2: temperature 2.5 is outside 0 to 2."),
        ({"top_p": 1.5}, "Request at line 2: top_p 1.5 is outside 0 to 1."),
        ({"max_tokens": 40_000}, "Request at line 2: max_tokens 40000 is above the endpoint's"),
        ({"content": "word " * 185_000, "max_tokens": 32_000}, "exceed the context length"),
    ],
)
async def test_one_bad_line_fails_the_whole_batch_after_its_202(
    start_sim: StartSim, fields: dict[str, Any], why: str
) -> None:
    sim, client = await start_sim(speed=math.inf)
    reply = await client.post("/batches", body(**fields))
    assert reply.status == 202
    got = await client.get(f"/batches/{reply.json['id']}")
    assert got.json["status"] == "failed"
    assert why in got.json["error"]["message"]
    assert got.json["results"] == [], "the good line fails with it"
    assert sim.simulator.usage == 0


async def test_a_custom_id_over_64_characters_is_a_422(start_sim: StartSim) -> None:
    _, client = await start_sim(speed=math.inf)
    reply = await client.post("/batches", body(custom_id="x" * 65))
    assert reply.status == 422
    assert "line 2 has an invalid custom_id: 1 to 64 characters" in reply.json["error"]["message"]
    assert (await client.post("/batches", body(custom_id="x" * 64))).status == 202


async def test_an_unreachable_batch_api_answers_404_on_every_route(start_sim: StartSim) -> None:
    sim, client = await start_sim(speed=math.inf)
    reply = await client.post("/batches", body())
    sim.simulator.batches.faults.unreachable = True
    for path in (
        "/batches",
        f"/batches/{reply.json['id']}",
        f"/batches/{reply.json['id']}/results",
    ):
        assert (await client.get(path)).status == 404
    assert (await client.post("/batches", body())).status == 404
    assert len(sim.simulator.batches) == 1, "nothing was made"
    listing = await client.get(f"/models/{K3}:batch/endpoints")
    assert listing.json["data"]["endpoints"], "the :batch listing still shows it"


async def test_a_batch_served_against_its_pin_says_its_provider_on_each_line(
    start_sim: StartSim,
) -> None:
    sim, client = await start_sim(speed=math.inf)
    sim.simulator.batches.faults.served_by = "Shady Cloud"
    reply = await client.post("/batches", {**body(), "provider": {"only": ["together"]}})
    got = await client.get(f"/batches/{reply.json['id']}")
    assert got.json["provider"] == "Shady Cloud"
    assert {r["response"]["body"]["provider"] for r in got.json["results"]} == {"Shady Cloud"}
    assert sim.simulator.usage > 0, "billed at the pinned endpoint's prices"
