"""Small fidelity facts, each checked against a capture or the description (issue #12).

``system_fingerprint`` in chunks, ``cost_details`` that add up with a request fee, the
402 URL, and a self-consistent ``error_200``.
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from pathlib import Path
from typing import Any

from _sim_client import StartSim, parse_sse
from _sim_contract import contract

from provider_router.testing import Market

FIXTURES = Path(__file__).parents[1] / "data" / "fixtures"
MOONSHOT = {"only": ["moonshotai"]}
CHUTES = {"only": ["chutes"]}


def _captured_stream(name: str) -> list[Any]:
    path = next(FIXTURES.glob(name))
    events, _, _ = parse_sse(path.read_text(encoding="utf-8"))
    return events


async def test_a_provider_with_a_fingerprint_sends_it_in_every_chunk(start_sim: StartSim) -> None:
    captured = _captured_stream("sse_kimi-k2-0905_moonshotai_tool_stream_cached_tokens_*.sse")
    assert all(e["system_fingerprint"].startswith("fpv0_") for e in captured)

    _, client = await start_sim()
    reply = await client.chat(max_tokens=60, stream=True, provider=MOONSHOT)
    assert reply.events
    assert {e["system_fingerprint"] for e in reply.events} == {"fpv0_805d9276"}
    answer = await client.chat(max_tokens=10, provider=MOONSHOT)
    assert answer.json["system_fingerprint"] == "fpv0_805d9276"


async def test_a_provider_without_one_sends_none_like_the_chutes_capture(
    start_sim: StartSim,
) -> None:
    captured = _captured_stream("sse_kimi-k2.5_chutes_tool_stream_*.sse")
    assert not any("system_fingerprint" in e for e in captured)

    _, client = await start_sim()
    reply = await client.chat(max_tokens=60, stream=True, provider=CHUTES)
    assert reply.events
    assert not any("system_fingerprint" in e for e in reply.events)
    # JSON answers: Chutes' leave the key out entirely, as its capture does; an
    # endpoint the market gives no fingerprint sends null (as BaseTen's capture).
    capture = json.loads(next(FIXTURES.glob("chat_kimi-k2-0905_chutes_nonstream_*")).read_text())
    assert "system_fingerprint" not in capture
    answer = await client.chat(max_tokens=10, provider=CHUTES)
    assert "system_fingerprint" not in answer.json
    contract().validate("/chat/completions", "post", 200, answer.json)
    answer = await client.chat(max_tokens=10, provider={"only": ["parasail"]})
    assert answer.json["system_fingerprint"] is None


def _fee_market(tmp_path: Path) -> Market:
    path = tmp_path / "market.yaml"
    path.write_text(
        "models:\n  - id: a/b\n    endpoints:\n      - provider: Fee\n"
        "        pricing: {prompt: '0.5', completion: '2', request: '0.001'}\n"
    )
    return Market.from_file(path)


async def test_cost_details_add_up_to_cost_when_a_request_fee_applies(
    start_sim: StartSim, tmp_path: Path
) -> None:
    _, client = await start_sim(market=_fee_market(tmp_path))
    for stream in (False, True):
        reply = await client.post(
            "/chat/completions",
            {
                "model": "a/b",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 20,
                "stream": stream,
            },
        )
        usage = reply.events[-1]["usage"] if stream else reply.json["usage"]
        details = usage["cost_details"]
        parts = Decimal(str(details["upstream_inference_prompt_cost"])) + Decimal(
            str(details["upstream_inference_completions_cost"])
        )
        cost = Decimal(str(usage["cost"]))
        assert parts == cost == Decimal(str(details["upstream_inference_cost"]))
        fee, prompt_price = Decimal("0.001"), Decimal("0.5") / 1_000_000
        assert Decimal(str(details["upstream_inference_prompt_cost"])) == (
            usage["prompt_tokens"] * prompt_price + fee
        )


async def test_insufficient_credits_names_the_url_the_description_shows(
    start_sim: StartSim,
) -> None:
    example = contract().doc["components"]["schemas"]["PaymentRequiredResponse"]["example"]
    _, client = await start_sim(credits=0)
    reply = await client.chat(max_tokens=10)
    assert reply.status == 402
    assert reply.json["error"]["message"] == example["error"]["message"]
    assert "https://openrouter.ai/credits" in reply.json["error"]["message"]


async def test_error_200_counts_the_words_it_shows_and_charges_nothing(
    start_sim: StartSim,
) -> None:
    fault = {"kind": "error_200", "provider": "chutes", "after_tokens": 5}
    sim, client = await start_sim(faults=[fault], speed=math.inf, generation_404s=0)
    reply = await client.chat(max_tokens=100, provider=CHUTES)
    choice = reply.json["choices"][0]
    usage = reply.json["usage"]
    assert choice["finish_reason"] == "error"
    shown = len((choice["message"]["content"] or "").split()) + len(
        (choice["message"]["reasoning"] or "").split()
    )
    assert shown == 5
    assert usage["completion_tokens"] == shown
    assert usage["total_tokens"] == usage["prompt_tokens"] + shown
    assert usage["cost"] == 0
    assert sim.simulator.balance == Decimal(100)
    generation = await client.get("/generation", id=reply.json["id"])
    assert generation.json["data"]["tokens_completion"] == shown
    assert generation.json["data"]["total_cost"] == 0


async def test_a_stream_error_generation_counts_what_was_streamed(start_sim: StartSim) -> None:
    fault = {"kind": "stream_error", "provider": "chutes", "after_tokens": 30}
    _, client = await start_sim(faults=[fault], completion_tokens=80, generation_404s=0)
    reply = await client.chat(max_tokens=200, stream=True, provider=CHUTES)
    streamed = sum(
        len((e["choices"][0]["delta"].get(k) or "").split())
        for e in reply.events
        for k in ("content", "reasoning")
    )
    assert streamed == 30
    generation = await client.get("/generation", id=reply.events[0]["id"])
    assert generation.json["data"]["tokens_completion"] == streamed
    assert generation.json["data"]["total_cost"] == 0
    assert generation.json["data"]["finish_reason"] == "error"


def _paths(value: Any, prefix: str = "") -> set[str]:
    """Every key path of a JSON value (``choices.[].message.reasoning``)."""
    out: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            out.add(prefix + key)
            out |= _paths(item, f"{prefix}{key}.")
    elif isinstance(value, list):
        for item in value:
            out |= _paths(item, prefix + "[].")
    return out


async def test_a_reasoning_answer_has_exactly_the_fields_of_the_kimi_k2_5_capture(
    start_sim: StartSim,
) -> None:
    path = next(FIXTURES.glob("chat_kimi-k2.5_inceptron_reasoning_nonstream_*.json"))
    captured = json.loads(path.read_text(encoding="utf-8").strip())
    _, client = await start_sim()
    # Parasail: like Inceptron, a provider that sends a null system_fingerprint
    # (Chutes leaves the key out: test_a_provider_without_one_sends_none_...).
    parasail = {"only": ["parasail"]}
    reply = await client.chat(max_tokens=200, reasoning={"effort": "high"}, provider=parasail)
    assert _paths(reply.json) == _paths(captured)
    reply = await client.chat(max_tokens=200, reasoning={"effort": "high"}, provider=CHUTES)
    assert _paths(reply.json) == _paths(captured) - {"system_fingerprint"}


async def test_a_reasoning_stream_has_the_fields_of_the_captured_streams(
    start_sim: StartSim,
) -> None:
    modelrun = _captured_stream("sse_kimi-k2.5_modelrun_reasoning_stream_*.sse")
    chutes_2025 = _captured_stream("sse_kimi-k2-0905_chutes_stream_*.sse")
    captured_2026 = set().union(*(_paths(e) for e in modelrun))
    captured_any = captured_2026.union(*(_paths(e) for e in chutes_2025))
    _, client = await start_sim()
    reply = await client.chat(
        max_tokens=200, stream=True, reasoning={"effort": "high"}, provider=CHUTES
    )
    ours = set().union(*(_paths(e) for e in reply.events))
    assert captured_2026 <= ours, "every field the 2026 capture has"
    assert ours <= captured_any, "nothing no capture has"
