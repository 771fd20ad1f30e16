"""The template encoders write exactly what ``bodies.dumps`` makes of the dict builders."""

from __future__ import annotations

import pytest

from provider_router.testing.billing import Cost
from provider_router.testing.chat import bodies
from provider_router.testing.chat.encode import (
    ChunkFrame,
    chat_result_bytes,
    chat_result_json,
    choices_json,
    content_delta_json,
    filler_choices_json,
    filler_delta_json,
    usage_json,
)
from provider_router.testing.chat.synth import filler

COSTS = [Cost(0, 0, 0), Cost(123_456_789, 987_654_321, 0), Cost(1, 2, 3, 4), Cost(10**15, 7, 10**9)]
TEXTS = [None, "", "plain words", 'quote " back \\ slash\nnewline', "ünïcödé ✓ 😀", "\x00\x1f"]


@pytest.mark.parametrize("cost", COSTS)
@pytest.mark.parametrize("write", [0, 1024])
def test_usage_json_is_the_usage_body(cost: Cost, write: int) -> None:
    expected = bodies.dumps(bodies.usage_body(17, 5, 256, 31, cost, write)).decode()
    assert usage_json(17, 5, 256, 31, cost, write) == expected


@pytest.mark.parametrize("content", TEXTS)
@pytest.mark.parametrize("reasoning", [None, "", 'thinking ✓ "hard"'])
@pytest.mark.parametrize("provider", [None, "Moonshot AI", 'Odd "name"'])
@pytest.mark.parametrize(("fingerprint", "omit"), [(None, False), ("fpv0_1", False), (None, True)])
@pytest.mark.parametrize("finish", ["stop", "length"])
def test_chat_result_json_is_the_chat_result(
    content: str | None,
    reasoning: str | None,
    provider: str | None,
    fingerprint: str | None,
    omit: bool,
    finish: str,
) -> None:
    usage = bodies.usage_body(3, 0, 4, 1, Cost(5, 6, 7))
    expected = bodies.chat_result(
        "gen-1-abc", 1_700_000_000, "moonshotai/kimi-k2.5", provider, content, reasoning,
        finish, usage, fingerprint=fingerprint, omit_fingerprint=omit,
    )  # fmt: skip
    assert ("system_fingerprint" in expected) is not omit
    text = chat_result_json(
        "gen-1-abc", 1_700_000_000, "moonshotai/kimi-k2.5", provider,
        choices_json(content, reasoning, finish), usage_json(3, 0, 4, 1, Cost(5, 6, 7)),
        fingerprint, omit,
    )  # fmt: skip
    assert text == bodies.dumps(expected).decode()


@pytest.mark.parametrize("content_tokens", [0, 1, 256, 4096, 5000])
@pytest.mark.parametrize("reasoning_tokens", [0, 3, 700])
@pytest.mark.parametrize("finish", ["stop", "length"])
def test_filler_choices_are_the_filler_text_encoded(
    content_tokens: int, reasoning_tokens: int, finish: str
) -> None:
    """Cached up to 4,096 tokens, computed beyond: the same text either way, every time."""
    reasoning = filler(0, reasoning_tokens, reasoning=True) if reasoning_tokens else None
    expected = choices_json(filler(0, content_tokens), reasoning, finish)
    assert filler_choices_json(content_tokens, reasoning_tokens, finish) == expected
    assert filler_choices_json(content_tokens, reasoning_tokens, finish) == expected


@pytest.mark.parametrize("text", [t for t in TEXTS if t])
@pytest.mark.parametrize("provider", [None, "Chutes"])
@pytest.mark.parametrize("fingerprint", [None, "fp_x"])
def test_chunk_frame_is_the_chunk(text: str, provider: str | None, fingerprint: str | None) -> None:
    frame = ChunkFrame("gen-2-xyz", 1_700_000_001, "m/x", provider, fingerprint)
    delta = {"role": "assistant", "content": text}
    expected = bodies.chunk(
        "gen-2-xyz", 1_700_000_001, "m/x", provider, delta, fingerprint=fingerprint
    )
    assert frame.sse(content_delta_json(text)) == b"data: " + bodies.dumps(expected) + b"\n\n"
    reasoning = {**delta, "reasoning": text, "reasoning_details": bodies.reasoning_details(text)}
    expected = bodies.chunk(
        "gen-2-xyz", 1_700_000_001, "m/x", provider, reasoning, fingerprint=fingerprint
    )
    assert (
        frame.sse(bodies.dumps(reasoning).decode()) == b"data: " + bodies.dumps(expected) + b"\n\n"
    )


@pytest.mark.parametrize(("start", "stop"), [(0, 16), (16, 32), (4090, 4100), (5, 5), (0, 1)])
def test_filler_deltas_are_the_filler_text_encoded(start: int, stop: int) -> None:
    expected = content_delta_json(filler(start, stop))
    assert filler_delta_json(start, stop) == expected
    assert filler_delta_json(start, stop) == expected


@pytest.mark.parametrize("gen_id", ["gen-1700000000-AbCdEfGhIjKlMnOpQrSt", 'odd "id" ✓'])
@pytest.mark.parametrize("created", [0, 1_700_000_000, -1])
@pytest.mark.parametrize("provider", [None, "Moonshot AI", 'Odd "name" ✓'])
@pytest.mark.parametrize(("fingerprint", "omit"), [(None, False), ("fpv0_1", False), (None, True)])
@pytest.mark.parametrize("prefix", [b"", b"\n         \n\n"])
def test_chat_result_bytes_are_the_chat_result_json(
    gen_id: str,
    created: int,
    provider: str | None,
    fingerprint: str | None,
    omit: bool,
    prefix: bytes,
) -> None:
    """The cached frame is keyed by everything but the id and ``created``: two answers
    that differ only in those share it, and each is still its own text."""
    choices = filler_choices_json(256, 31, "stop")
    for cost in COSTS[:2]:
        usage = usage_json(3, 0, 287, 31, cost)
        for model in ("moonshotai/kimi-k2.5", 'odd/"model"'):
            args = (gen_id, created, model, provider, choices, usage, fingerprint, omit)
            expected = prefix + chat_result_json(*args).encode()
            assert chat_result_bytes(prefix, *args) == expected
            assert chat_result_bytes(prefix, *args) == expected  # from the cache
