"""Time: provider latency and throughput from the market, compressed by the speed factor."""

from __future__ import annotations

import asyncio
import math
import re

from _sim_client import StartSim

FIXED = {"X-Simulator-Completion-Tokens": "100"}
ONLY_CHUTES = {"only": ["chutes"]}  # p50: 1.85 s to first token, 31 tokens/s


class RecordingSleep:
    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)
        await asyncio.sleep(0)


async def test_json_waits_ttft_plus_generation_divided_by_speed(start_sim: StartSim) -> None:
    sleep = RecordingSleep()
    _, client = await start_sim(speed=100, sleep=sleep)
    reply = await client.chat(max_tokens=500, provider=ONLY_CHUTES, headers=FIXED)
    assert reply.status == 200
    (waited,) = sleep.calls
    # (1.85 s + 100 / 31 s) / 100 ≈ 0.051 s, give or take the per-request jitter.
    assert 0.03 < waited < 0.08


async def test_stream_sends_keepalives_then_paced_chunks(start_sim: StartSim) -> None:
    sleep = RecordingSleep()
    _, client = await start_sim(
        speed=10, sleep=sleep, keepalive_seconds=0.5, stream_chunk_tokens=10
    )
    reply = await client.chat(max_tokens=500, stream=True, provider=ONLY_CHUTES, headers=FIXED)
    assert reply.done
    assert reply.comments >= 3, "': OPENROUTER PROCESSING' while waiting for the first token"
    chunk_waits = sleep.calls[-10:]
    assert len(chunk_waits) == 10
    assert all(0.02 < w < 0.05 for w in chunk_waits)  # 10 tokens at ~31/s ÷ 10
    # In all, (1.85 s + 100 / 31 s) / 10 ≈ 0.51 s, give or take the jitter.
    assert 0.3 < sum(sleep.calls) < 0.8


async def test_infinite_speed_never_sleeps(start_sim: StartSim) -> None:
    sleep = RecordingSleep()
    _, client = await start_sim(speed=math.inf, sleep=sleep)
    await client.chat(max_tokens=500, stream=True)
    await client.chat(max_tokens=500)
    assert sleep.calls == []


async def test_max_tokens_caps_the_completion_with_finish_reason_length(
    start_sim: StartSim,
) -> None:
    _, client = await start_sim(completion_tokens=300)
    reply = await client.chat(max_tokens=120)
    assert reply.json["usage"]["completion_tokens"] == 120
    assert reply.json["choices"][0]["finish_reason"] == "length"
    reply = await client.chat(max_tokens=400)
    assert reply.json["usage"]["completion_tokens"] == 300
    assert reply.json["choices"][0]["finish_reason"] == "stop"


class InstantSleep:
    """A finite speed whose sleeps take no time: the stream is written event by event."""

    async def __call__(self, seconds: float) -> None:
        await asyncio.sleep(0)


def _normalised(text: str) -> str:
    """The stream with its ``created`` second blanked (two runs may straddle a second)."""
    return re.sub(r'"created":\d+', '"created":0', text)


async def test_a_stream_at_infinite_speed_is_the_same_bytes_as_one_written_event_by_event(
    start_sim: StartSim,
) -> None:
    """At infinite speed the events are gathered into few writes; what the client reads
    is exactly what it reads when each event is written when due."""
    body = {"stream": True, "reasoning": {"effort": "high"}}
    options = {"seed": 3, "keepalive_seconds": 0.5, "completion_tokens": 600}
    _, gathered = await start_sim(speed=math.inf, **options)
    _, paced = await start_sim(speed=1e9, sleep=InstantSleep(), **options)
    first = await gathered.chat(**body)
    second = await paced.chat(**body)
    assert first.done
    assert first.comments > 1, "keep-alives while the first token is awaited"
    assert len(first.events) > 30
    assert _normalised(first.text) == _normalised(second.text)


async def test_a_long_stream_at_infinite_speed_arrives_whole(start_sim: StartSim) -> None:
    """More than one gathered write (64 KiB each): every chunk, the usage, then [DONE]."""
    sim, client = await start_sim(speed=math.inf, completion_tokens=20_000)
    reply = await client.chat(stream=True)
    assert len(reply.text.encode()) > 3 * 64 * 1024
    assert reply.done
    content = "".join(e["choices"][0]["delta"].get("content") or "" for e in reply.events)
    assert len(content.split()) == 20_000
    assert reply.events[-1]["usage"]["completion_tokens"] == 20_000
    (record,) = sim.requests
    assert record.completion_tokens == 20_000
