"""Faults: scheduled, random but reproducible, scoped, and shaped like the real failures."""

from __future__ import annotations

import asyncio
import math
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from _sim_client import SimClient, StartSim, chat_body

from provider_router import ConfigurationError, DataFileError
from provider_router.testing import Fault, load_faults

ONLY_CHUTES = {"only": ["chutes"]}


async def test_429_twice_then_success(start_sim: StartSim) -> None:
    sim, client = await start_sim(
        faults=[{"kind": "rate_limit", "provider": "chutes", "times": 2, "retry_after": 17}]
    )
    statuses = [(await client.chat(max_tokens=5, provider=ONLY_CHUTES)).status for _ in range(4)]
    assert statuses == [429, 429, 200, 200]
    first = sim.requests[0]
    assert first.attempts == [("chutes", 429)]
    assert first.outcome == "rate_limit"


async def test_upstream_429_body_and_retry_after(start_sim: StartSim) -> None:
    _, client = await start_sim(
        faults=[{"kind": "rate_limit", "provider": "chutes", "retry_after": 17}], speed=1
    )
    reply = await client.chat(max_tokens=5, provider=ONLY_CHUTES)
    assert reply.status == 429
    assert reply.headers["retry-after"] == "17"
    error = reply.json["error"]
    assert error["message"] == "Provider returned error"
    assert error["metadata"]["provider_name"] == "Chutes"
    assert error["metadata"]["retry_after_seconds"] == 17
    assert "temporarily rate-limited upstream" in error["metadata"]["raw"]


async def test_retry_after_is_scaled_by_speed(start_sim: StartSim) -> None:
    _, client = await start_sim(
        faults=[{"kind": "rate_limit", "provider": "chutes", "retry_after": 20}], speed=1000
    )
    reply = await client.chat(max_tokens=5, provider=ONLY_CHUTES)
    assert reply.headers["retry-after"] == "0.02"


async def test_platform_rate_limit_has_rate_limit_headers_and_no_fallback(
    start_sim: StartSim,
) -> None:
    sim, client = await start_sim(faults=[{"kind": "rate_limit", "scope": "platform", "times": 1}])
    reply = await client.chat(max_tokens=5)
    assert reply.status == 429
    assert reply.headers["x-ratelimit-remaining"] == "0"
    # The reset is wall-clock epoch milliseconds, not a monotonic reading.
    reset = int(reply.headers["x-ratelimit-reset"])
    assert abs(reset / 1000 - time.time()) < 3600
    assert reply.json["error"]["metadata"]["provider_name"] is None
    assert "headers" not in reply.json["error"]["metadata"], "no capture copies them there"
    assert sim.requests[0].attempts == []
    assert (await client.chat(max_tokens=5)).status == 200


async def test_provider_errors_fall_back_to_the_next_provider(start_sim: StartSim) -> None:
    sim, client = await start_sim(
        faults=[{"kind": "provider_error", "provider": "chutes", "status": 502}]
    )
    reply = await client.chat(max_tokens=5, provider={"order": ["chutes", "novita"]})
    assert reply.status == 200
    assert reply.json["provider"] == "Novita"
    assert sim.requests[-1].attempts == [("chutes", 502), ("novita", 200)]
    reply = await client.chat(
        max_tokens=5, provider={"order": ["chutes"], "allow_fallbacks": False}
    )
    assert reply.status == 502
    assert reply.json["error"]["metadata"]["provider_name"] == "Chutes"


async def test_no_fallback_faults_surface_even_with_fallbacks_on(start_sim: StartSim) -> None:
    fault = {"kind": "rate_limit", "provider": "chutes", "no_fallback": True}
    _, client = await start_sim(faults=[fault])
    reply = await client.chat(max_tokens=5, provider={"order": ["chutes", "novita"]})
    assert reply.status == 429


async def test_a_failed_provider_is_avoided_by_default_routing_for_30_simulated_seconds(
    start_sim: StartSim,
) -> None:
    now = [0.0]
    sim, client = await start_sim(
        clock=lambda: now[0], faults=[{"kind": "down", "provider": "chutes"}]
    )
    await client.chat(max_tokens=5, provider={"order": ["chutes"]})
    firsts = set()
    for i in range(40):
        await client.chat(content=f"p{i}", max_tokens=5)
        firsts.add(sim.requests[-1].attempts[0][0])
    assert "chutes" not in firsts
    now[0] = 31.0
    for i in range(60):
        await client.chat(content=f"q{i}", max_tokens=5)
        firsts.add(sim.requests[-1].attempts[0][0])
    assert "chutes" in firsts


async def test_down_window_in_simulated_time(start_sim: StartSim) -> None:
    now = [0.0]
    fault = {"kind": "down", "provider": "chutes", "window": {"start": 10, "end": 20}}
    _, client = await start_sim(clock=lambda: now[0], speed=2, faults=[fault])
    statuses = []
    for real in (4.0, 6.0, 9.0, 11.0):  # simulated 8, 12, 18, 22
        now[0] = real
        statuses.append(
            (
                await client.chat(
                    max_tokens=1,
                    provider=ONLY_CHUTES,
                    headers={"X-Simulator-Completion-Tokens": "1"},
                )
            ).status
        )
    assert statuses == [200, 503, 503, 200]


async def test_random_faults_are_reproducible_by_seed(start_sim: StartSim) -> None:
    async def run(seed: int) -> list[int]:
        _, client = await start_sim(
            seed=seed, faults=[{"kind": "provider_error", "provider": "chutes", "rate": 0.5}]
        )
        return [
            (await client.chat(content=f"prompt {i}", max_tokens=5, provider=ONLY_CHUTES)).status
            for i in range(30)
        ]

    first, again, other = await run(1), await run(1), await run(2)
    assert first == again
    assert first != other
    assert 5 < first.count(502) < 25


async def test_seeded_runs_reproduce_lengths_and_providers_whatever_the_arrival_order(
    start_sim: StartSim,
) -> None:
    async def run(order: list[int]) -> dict[int, tuple[str, int]]:
        _, client = await start_sim(seed=3)
        replies = await asyncio.gather(
            *(client.chat(content=f"prompt {i}", max_tokens=2000) for i in order)
        )
        return {
            i: (r.json["provider"], r.json["usage"]["completion_tokens"])
            for i, r in zip(order, replies, strict=True)
        }

    assert await run(list(range(20))) == await run(list(reversed(range(20))))


async def test_max_in_flight_rate_limit(start_sim: StartSim) -> None:
    fault = {"kind": "rate_limit", "provider": "chutes", "max_in_flight": 2}
    _, client = await start_sim(faults=[fault], speed=20)
    replies = await asyncio.gather(
        *(client.chat(content=f"c{i}", max_tokens=5, provider=ONLY_CHUTES) for i in range(5))
    )
    statuses = sorted(r.status for r in replies)
    assert statuses == [200, 200, 429, 429, 429]


async def test_per_second_rate_limit_is_a_token_bucket_on_the_sim_clock(
    start_sim: StartSim,
) -> None:
    now = [0.0]
    fault = {"kind": "rate_limit", "scope": "platform", "per_second": 2, "burst": 3}
    sim, client = await start_sim(faults=[fault], speed=math.inf, clock=lambda: now[0])

    async def statuses(n: int) -> list[int]:
        return [(await client.chat(content=f"r{i}", max_tokens=5)).status for i in range(n)]

    assert await statuses(5) == [200, 200, 200, 429, 429]  # the burst, then empty
    now[0] = 1.0  # two tokens came back
    assert await statuses(3) == [200, 200, 429]
    now[0] = 100.0  # refills to the burst, no further
    assert await statuses(4) == [200, 200, 200, 429]
    assert sim.requests[-1].outcome == "rate_limit"


async def test_per_second_buckets_are_per_provider_tag(start_sim: StartSim) -> None:
    now = [0.0]
    fault = {"kind": "rate_limit", "per_second": 1, "no_fallback": True}
    _, client = await start_sim(faults=[fault], speed=math.inf, clock=lambda: now[0])
    first = await client.chat(max_tokens=5, provider=ONLY_CHUTES)
    again = await client.chat(max_tokens=5, provider=ONLY_CHUTES)
    other = await client.chat(max_tokens=5, provider={"only": ["deepinfra"]})
    assert (first.status, again.status, other.status) == (200, 429, 200)


async def test_error_200_is_free_and_says_error(start_sim: StartSim) -> None:
    sim, client = await start_sim(
        faults=[{"kind": "error_200", "provider": "chutes", "after_tokens": 3}]
    )
    reply = await client.chat(max_tokens=50, provider=ONLY_CHUTES)
    choice = reply.json["choices"][0]
    assert reply.status == 200
    assert choice["finish_reason"] == "error"
    assert choice["error"]["code"] == 502
    assert len(choice["message"]["content"].split()) == 3
    assert sim.balance == Decimal(100)


async def test_stream_error_ends_midway_without_done(start_sim: StartSim) -> None:
    fault = {"kind": "stream_error", "provider": "chutes", "after_tokens": 40}
    sim, client = await start_sim(faults=[fault], completion_tokens=100)
    reply = await client.chat(max_tokens=500, stream=True, provider=ONLY_CHUTES)
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in reply.events)
    assert len(text.split()) == 40
    last = reply.events[-1]
    assert last["choices"][0]["finish_reason"] == "error"
    assert last["error"]["code"] == 502
    assert not reply.done
    assert sim.balance == Decimal(100)


async def test_truncated_json_body_is_a_payload_error_and_is_charged(start_sim: StartSim) -> None:
    sim, client = await start_sim(faults=[{"kind": "truncate", "provider": "chutes"}])
    with pytest.raises(aiohttp.ClientPayloadError):
        await client.chat(max_tokens=50, provider=ONLY_CHUTES)
    assert sim.requests[-1].outcome == "truncate"
    assert sim.balance < Decimal(100)


async def test_truncated_stream_has_no_finish_and_no_done(start_sim: StartSim) -> None:
    _, client = await start_sim(
        faults=[{"kind": "truncate", "provider": "chutes"}], completion_tokens=64
    )
    reply = await client.chat(max_tokens=500, stream=True, provider=ONLY_CHUTES)
    assert reply.status == 200
    assert not reply.done
    assert all(e["choices"][0]["finish_reason"] is None for e in reply.events)


async def test_reset_drops_the_connection(start_sim: StartSim) -> None:
    _, client = await start_sim(faults=[{"kind": "reset", "provider": "chutes"}])
    with pytest.raises(aiohttp.ClientError):
        await client.chat(max_tokens=50, provider=ONLY_CHUTES)


async def test_hang_holds_until_the_client_gives_up(start_sim: StartSim) -> None:
    sim, client = await start_sim(
        faults=[{"kind": "hang", "provider": "chutes", "times": 1}], speed=1000
    )
    with pytest.raises(asyncio.TimeoutError):
        await client.session.post(
            sim.url + "/chat/completions",
            json=chat_body(max_tokens=5, provider=ONLY_CHUTES),
            timeout=aiohttp.ClientTimeout(total=0.2),
        )
    assert (await client.chat(max_tokens=5, provider=ONLY_CHUTES)).status == 200


async def test_faults_can_be_scoped_to_a_key_and_added_at_runtime(start_sim: StartSim) -> None:
    sim, client = await start_sim(api_keys=["sk-sim-test-key", "sk-other"])
    other = SimClient(sim.url, "sk-other")
    try:
        fault = sim.add_fault({"kind": "provider_error", "key": "sk-other", "provider": "chutes"})
        assert "sk-other" not in repr(fault)
        assert fault.key is not None
        assert (await other.chat(max_tokens=5, provider=ONLY_CHUTES)).status == 502
        assert (await client.chat(max_tokens=5, provider=ONLY_CHUTES)).status == 200
        label = sim.requests[-1].key_label
        assert label is not None
        sim.simulator.faults.clear()
        fault = sim.add_fault(Fault(kind="provider_error", key=label, provider="chutes", times=1))
        assert (await client.chat(max_tokens=5, provider=ONLY_CHUTES)).status == 502
        assert (await other.chat(max_tokens=5, provider=ONLY_CHUTES)).status == 200
        assert fault.fired == 1
    finally:
        await other.close()


FAULT_FILE = """\
faults:
  - kind: rate_limit
    provider: chutes
    times: 2
  - kind: provider_error
    status: 418
"""


def test_fault_file_errors_name_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "faults.yaml"
    path.write_text(FAULT_FILE)
    with pytest.raises(DataFileError) as caught:
        load_faults(path)
    assert caught.value.line == 5
    assert "faults[1]" in str(caught.value)
    assert "418" in str(caught.value)
    path.write_text("faults:\n  - kind: meltdown\n")
    with pytest.raises(DataFileError, match=r"faults\.yaml:2: .*meltdown"):
        load_faults(path)
    path.write_text("faults:\n  - kind: hang\n    rate: 2\n")
    with pytest.raises(DataFileError, match=r":3: faults\[0\]\.rate: must be at most 1"):
        load_faults(path)
    json_path = tmp_path / "faults.json"
    json_path.write_text('{"faults": [\n {"kind": "hang",}\n]}')
    with pytest.raises(DataFileError, match=r"faults\.json:2: invalid JSON"):
        load_faults(json_path)


def test_fault_files_load(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    path.write_text(
        '[{"kind": "rate_limit", "provider": "Chutes", "times": 2, "window": {"start": 5}}]'
    )
    (fault,) = load_faults(path)
    assert fault.provider == "chutes"
    assert fault.times == 2
    assert fault.window == (5.0, float("inf"))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"kind": "nope"},
        {"kind": "hang", "scope": "platform"},
        {"kind": "rate_limit", "rate": 1.5},
        {"kind": "rate_limit", "per_second": 0},
        {"kind": "provider_error", "per_second": 5},
        {"kind": "rate_limit", "per_second": 5, "max_in_flight": 3},
        {"kind": "rate_limit", "per_second": 5, "burst": 0.5},
    ],
)
def test_bad_faults_are_configuration_errors(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        Fault(**kwargs)
