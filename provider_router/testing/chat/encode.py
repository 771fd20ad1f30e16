"""The hot answers as JSON text directly: byte for byte what :func:`bodies.dumps` makes
of the dicts :mod:`~provider_router.testing.chat.bodies` builds, at a fraction of the cost.

Encoding the nested dicts of every answer with :mod:`json` is a large share of the
simulator's own CPU (docs/performance.md). These functions write the same text from
templates: the fixed parts are literals, strings go through the C string encoder
:mod:`json` itself uses, numbers through ``repr``. Only the common shapes are here; every
other shape is built as a dict and encoded by :func:`bodies.dumps`.
``tests/testing/test_sim_encode.py`` checks each function against the dict path.
"""

from __future__ import annotations

import functools
from json.encoder import encode_basestring_ascii

from provider_router.testing.billing import Cost
from provider_router.testing.chat.bodies import usd
from provider_router.testing.chat.synth import filler

__all__ = [
    "ChunkFrame",
    "chat_result_bytes",
    "chat_result_json",
    "choices_json",
    "content_delta_json",
    "filler_choices_json",
    "filler_delta_json",
    "usage_json",
]


def _text(value: str | None) -> str:
    return "null" if value is None else encode_basestring_ascii(value)


@functools.lru_cache(maxsize=1024)
def usage_json(
    prompt_tokens: int,
    cached_tokens: int,
    completion_tokens: int,
    reasoning_tokens: int,
    cost: Cost,
    cache_write_tokens: int = 0,
) -> str:
    """``bodies.usage_body(...)`` encoded; the latest 1,024 shapes are remembered (a
    workload that repeats its requests, as benchmarks and tests do, repeats its usage;
    the three costs' float reprs are the expensive part)."""
    total = repr(usd(cost.total))
    prompt_cost = repr(usd(cost.prompt + cost.request))
    completion_cost = repr(usd(cost.completion))
    return (
        f'{{"prompt_tokens":{prompt_tokens},"completion_tokens":{completion_tokens},'
        f'"total_tokens":{prompt_tokens + completion_tokens},"cost":{total},"is_byok":false,'
        f'"prompt_tokens_details":{{"cached_tokens":{cached_tokens},'
        f'"cache_write_tokens":{cache_write_tokens},"audio_tokens":0,"video_tokens":0}},'
        f'"cost_details":{{"upstream_inference_cost":{total},'
        f'"upstream_inference_prompt_cost":{prompt_cost},'
        f'"upstream_inference_completions_cost":{completion_cost}}},'
        f'"completion_tokens_details":{{"reasoning_tokens":{reasoning_tokens},'
        f'"image_tokens":0,"audio_tokens":0}}}}'
    )


def choices_json(content: str | None, reasoning: str | None, finish_reason: str) -> str:
    """The ``choices`` array of ``bodies.chat_result(...)`` without ``error`` or
    ``tool_calls``, encoded."""
    reasoning_text = _text(reasoning)
    message = (
        f'{{"role":"assistant","content":{_text(content)},"refusal":null,'
        f'"reasoning":{reasoning_text}'
    )
    if reasoning:
        message += (
            f',"reasoning_details":[{{"type":"reasoning.text","text":{reasoning_text},'
            '"format":"unknown","index":0}]'
        )
    finish = encode_basestring_ascii(finish_reason)
    return (
        f'[{{"logprobs":null,"finish_reason":{finish},"native_finish_reason":{finish},'
        f'"index":0,"message":{message}}}}}]'
    )


_CACHED_TOKENS = 4096
"""Answers up to this many tokens have their ``choices`` cached (at most ~27 kB each)."""


@functools.lru_cache(maxsize=256)
def _filler_choices(content_tokens: int, reasoning_tokens: int, finish_reason: str) -> str:
    reasoning = filler(0, reasoning_tokens, reasoning=True) if reasoning_tokens else None
    return choices_json(filler(0, content_tokens), reasoning, finish_reason)


def filler_choices_json(content_tokens: int, reasoning_tokens: int, finish_reason: str) -> str:
    """:func:`choices_json` of the filler text: ``content_tokens`` of content and
    ``reasoning_tokens`` of shown reasoning (0: ``null``). The text depends only on
    the counts, so it is encoded once per shape, not escaped again on every answer."""
    if content_tokens + reasoning_tokens > _CACHED_TOKENS:
        return _filler_choices.__wrapped__(content_tokens, reasoning_tokens, finish_reason)
    return _filler_choices(content_tokens, reasoning_tokens, finish_reason)


def chat_result_json(
    gen_id: str,
    created: int,
    model: str,
    provider: str | None,
    choices: str,
    usage: str,
    fingerprint: str | None = None,
    omit_fingerprint: bool = False,
) -> str:
    """``bodies.chat_result(...)`` without ``error`` or ``tool_calls``, encoded;
    ``choices`` (:func:`choices_json`) and ``usage`` (:func:`usage_json`) are already JSON."""
    shown = "" if provider is None else f'"provider":{encode_basestring_ascii(provider)},'
    return (
        f'{{"id":{encode_basestring_ascii(gen_id)},{shown}"model":{encode_basestring_ascii(model)},'
        f'"object":"chat.completion","created":{created},"choices":{choices},'
        f"{_fingerprint(fingerprint, omit_fingerprint)}"
        f'"usage":{usage}}}'
    )


def _fingerprint(fingerprint: str | None, omit: bool) -> str:
    """The ``system_fingerprint`` member and its comma (nothing when omitted)."""
    return "" if omit else f'"system_fingerprint":{_text(fingerprint)},'


@functools.lru_cache(maxsize=1024)
def _answer_frame(
    model: str,
    provider: str | None,
    choices: str,
    usage: str,
    fingerprint: str | None,
    omit_fingerprint: bool,
) -> tuple[bytes, bytes]:
    """What :func:`chat_result_json` writes between the id and ``created``, and after
    ``created``, as bytes: everything but those two is the same for every answer of
    one model, endpoint and shape (``choices`` and ``usage`` come from caches, so
    their hashes are remembered too)."""
    shown = "" if provider is None else f'"provider":{encode_basestring_ascii(provider)},'
    middle = (
        f',{shown}"model":{encode_basestring_ascii(model)},"object":"chat.completion","created":'
    )
    fp = _fingerprint(fingerprint, omit_fingerprint)
    tail = f',"choices":{choices},{fp}"usage":{usage}}}'
    return middle.encode(), tail.encode()


def chat_result_bytes(
    prefix: bytes,
    gen_id: str,
    created: int,
    model: str,
    provider: str | None,
    choices: str,
    usage: str,
    fingerprint: str | None = None,
    omit_fingerprint: bool = False,
) -> bytes:
    """``prefix`` and :func:`chat_result_json` (same arguments) encoded as UTF-8 (it is
    ASCII): only the id and ``created`` are written per answer, the rest is one
    cached frame per model, endpoint and shape, not built and encoded on every
    answer."""
    middle, tail = _answer_frame(model, provider, choices, usage, fingerprint, omit_fingerprint)
    gen = encode_basestring_ascii(gen_id).encode()
    return b"".join((prefix, b'{"id":', gen, middle, b"%d" % created, tail))


def content_delta_json(text: str) -> str:
    """The delta ``{"role": "assistant", "content": text}`` encoded."""
    return f'{{"role":"assistant","content":{encode_basestring_ascii(text)}}}'


@functools.lru_cache(maxsize=4096)
def filler_delta_json(start: int, stop: int) -> str:
    """:func:`content_delta_json` of the filler tokens ``start`` to ``stop``: every
    stream's chunks cover the same few token ranges, so each is escaped once."""
    return content_delta_json(filler(start, stop))


class ChunkFrame:
    """What every mid-stream chunk of one answer shares: ``bodies.chunk(...)`` with
    no finish reason, usage or error is ``head + delta + tail``."""

    __slots__ = ("_head", "_tail")

    def __init__(
        self, gen_id: str, created: int, model: str, provider: str | None, fingerprint: str | None
    ) -> None:
        shown = "" if provider is None else f'"provider":{encode_basestring_ascii(provider)},'
        self._head = (
            f'data: {{"id":{encode_basestring_ascii(gen_id)},{shown}'
            f'"model":{encode_basestring_ascii(model)},"object":"chat.completion.chunk",'
            f'"created":{created},"choices":[{{"index":0,"delta":'
        )
        fp = "" if fingerprint is None else f',"system_fingerprint":{_text(fingerprint)}'
        self._tail = (
            f',"finish_reason":null,"native_finish_reason":null,"logprobs":null}}]{fp}}}\n\n'
        )

    def sse(self, delta: str) -> bytes:
        """The SSE event (``data: ...`` and the blank line) of a chunk carrying ``delta`` (JSON)."""
        return (self._head + delta + self._tail).encode()
