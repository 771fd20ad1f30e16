"""The per-request random streams (hash-keyed, not a seeded Mersenne Twister), what
depends on them, and the cheaper request parsing: same behaviour, over real sockets."""

from __future__ import annotations

import json
import math
import statistics
import string

import aiohttp
import pytest
from _sim_client import MODEL, StartSim, chat_body

from provider_router.testing.draws import Draws


def test_the_same_key_gives_the_same_stream_and_another_key_another() -> None:
    def draws(key: bytes) -> list[object]:
        rng = Draws(key)
        return [
            rng.random(),
            rng.gauss(0.0, 1.0),
            rng.alnum(20),
            rng.randint(1, 6),
            rng.choice("abcdef"),
            rng.uniform(2.0, 3.0),
            rng.choices("xyz", k=5),
            rng.getrandbits(77),
            rng.randrange(4096),
        ]

    assert draws(b"0:1:1") == draws(b"0:1:1")
    assert draws(b"0:1:1") != draws(b"0:1:2")
    assert draws(b"0:1:1") != draws(b"1:1:1")


def test_a_stream_reads_the_same_across_block_boundaries() -> None:
    """64 bytes per hash block: bytes taken in pieces are the bytes taken at once."""
    whole = Draws(b"k")._take(300)
    pieces = Draws(b"k")
    assert b"".join(pieces._take(n) for n in (7, 7, 50, 1, 100, 135)) == whole
    assert len(set(whole[i : i + 64] for i in range(0, 256, 64))) == 4, "blocks differ"


def test_draws_have_the_ranges_and_shapes_random_promises() -> None:
    rng = Draws(b"shape")
    uniforms = [rng.random() for _ in range(20_000)]
    assert all(0.0 <= u < 1.0 for u in uniforms)
    assert abs(statistics.fmean(uniforms) - 0.5) < 0.01
    normals = [rng.gauss(10.0, 2.0) for _ in range(20_000)]
    assert abs(statistics.fmean(normals) - 10.0) < 0.05
    assert abs(statistics.stdev(normals) - 2.0) < 0.05
    assert {rng.randint(1, 3) for _ in range(200)} == {1, 2, 3}
    ids = {rng.alnum(20) for _ in range(1000)}
    assert len(ids) == 1000
    assert all(len(i) == 20 and set(i) <= set(string.ascii_letters + string.digits) for i in ids)
    assert rng.getrandbits(0) == 0
    assert 0 <= rng.getrandbits(5) < 32
    with pytest.raises(ValueError, match="non-negative"):
        rng.getrandbits(-1)


def test_reseeding_restarts_the_stream() -> None:
    rng = Draws(b"a")
    rng.seed("b")
    assert rng.random() == Draws(b"b").random()
    state = rng.getstate()
    first = [rng.random() for _ in range(20)]
    rng.setstate(state)
    assert [rng.random() for _ in range(20)] == first


async def test_the_same_seed_and_requests_give_the_same_answers(start_sim: StartSim) -> None:
    """Ids, lengths, routing and latencies come from the request's stream: two
    simulators with one seed answer the same requests identically; another seed not."""

    async def run(seed: int) -> list[tuple[object, ...]]:
        _, client = await start_sim(speed=math.inf, seed=seed, generation_404s=0)
        seen = []
        for i in range(6):
            reply = await client.chat(content=f"Question {i}?")
            gen = (await client.get("/generation", id=reply.json["id"])).json["data"]
            seen.append(
                (
                    reply.json["id"].split("-", 2)[2],
                    reply.json["provider"],
                    reply.json["usage"]["completion_tokens"],
                    gen["latency"],
                    gen["generation_time"],
                )
            )
        return seen

    first, again, other = await run(7), await run(7), await run(8)
    assert first == again
    assert first != other
    assert len({row[0] for row in first}) == 6, "each request its own id"


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (json.dumps(chat_body(max_tokens=4)).encode(), 200),
        (b"  " + json.dumps(chat_body(max_tokens=4)).encode() + b"\n", 200),
        (b"\xef\xbb\xbf" + json.dumps(chat_body(max_tokens=4)).encode(), 200),  # UTF-8 BOM
        (json.dumps(chat_body(max_tokens=4)).encode("utf-16"), 200),
        (json.dumps(chat_body(max_tokens=4)).encode() + b" x", 400),  # extra data
        (b"", 400),
        (b"\xff\xfe\xfd", 400),
        (b'{"model": "' + MODEL.encode() + b'", "messages": [', 400),
    ],
)
async def test_request_bodies_parse_as_json_loads_would(
    start_sim: StartSim, raw: bytes, status: int
) -> None:
    sim, client = await start_sim(speed=math.inf)
    async with client.session.post(sim.url + "/chat/completions", data=raw) as response:
        body = await response.json(content_type=None)
    assert response.status == status
    if status == 400:
        assert body["error"]["message"] == "Invalid JSON in request body"


async def test_a_key_is_recognised_again_and_an_unknown_one_refused_again(
    start_sim: StartSim,
) -> None:
    """Authorization headers seen before are remembered: the same key, the same 401s."""
    sim, _ = await start_sim(speed=math.inf, api_keys={"sk-a": "1", "sk-b": None})
    async with aiohttp.ClientSession() as session:

        async def ask(header: str) -> int:
            async with session.post(
                sim.url + "/chat/completions",
                json=chat_body(max_tokens=4),
                headers={"Authorization": header},
            ) as response:
                return response.status

        for _ in range(2):
            assert await ask("Bearer sk-a") == 200
            assert await ask("Bearer sk-b") == 200
            assert await ask("Bearer sk-c") == 401
            assert await ask("Basic sk-a") == 401
    labels = [r.key_label for r in sim.requests if r.status == 200]
    assert len(labels) == 4
    assert len(set(labels)) == 2
    keys = sim.simulator.account.keys
    assert keys["sk-a"].usage > 0
    assert keys["sk-b"].usage > 0
    assert keys["sk-a"].usage + keys["sk-b"].usage == sim.simulator.account.usage
