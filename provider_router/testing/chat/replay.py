"""Answering from the response cache (``cache.py``): a hit without a provider, and a
miss's whole answer kept for the requests that send the same body again."""

from __future__ import annotations

import hashlib
import time

from aiohttp import web

from provider_router.testing.billing import KeyState
from provider_router.testing.chat.cache import (
    WHOLE,
    CacheLookup,
    Entry,
    hit_headers,
    kept_stream,
    replay_json,
    replay_stream,
)
from provider_router.testing.introspection import RequestRecord
from provider_router.testing.market.listing import ModelSpec
from provider_router.testing.simulator import Simulator

__all__ = ["answer_hit", "keep_answer"]


def answer_hit(
    sim: Simulator,
    record: RequestRecord,
    key: KeyState,
    model: ModelSpec,
    stream: bool,
    lookup: CacheLookup,
) -> web.Response:
    """Answer from the cache: no provider, no charge, a ``/generation`` record at $0
    whose ``response_cache_source_id`` names the original."""
    entry = lookup.hit
    assert entry is not None
    created = int(time.time())
    # A new id per hit, reproducible by seed like every id the simulator makes.
    salt = f"{sim.seed}:{entry.source_id}:{sim.response_cache.hits}".encode()
    gen_id = f"gen-{created}-{hashlib.sha256(salt).hexdigest()[:20]}"
    headers = hit_headers(lookup, gen_id)
    with_cost = sim.response_cache.hit_cost
    if stream:
        body = replay_stream(entry, gen_id, with_cost)
        headers["Content-Type"] = "text/event-stream"
        headers["Cache-Control"] = "no-cache"
    else:
        body = replay_json(entry, gen_id, with_cost)
        headers["Content-Type"] = "application/json"
    record.outcome = "cache_hit"
    record.generation_id = gen_id
    record.tag, record.provider = entry.tag, entry.provider
    record.cost_units = 0
    generations = sim.generations
    if len(generations) >= sim.log_limit:
        sim.generation_misses.pop(generations.pop_oldest(), None)
    generations.put(
        gen_id, key.label, created, model, stream, entry.provider, 0.0, 0.0,
        entry.finish_reason, 0, 0, 0, 0, 0, [(entry.tag, 200)],
        None, None,
    )  # fmt: skip
    sim.response_cache.replayed(gen_id, entry.source_id)
    return web.Response(body=body, headers=headers)


def keep_answer(
    sim: Simulator,
    record: RequestRecord,
    lookup: CacheLookup,
    tap: list[bytes] | None,
    response: web.StreamResponse,
) -> web.StreamResponse:
    """A miss answered: its JSON answer says ``MISS``; a whole 200 answer is kept."""
    if not response.prepared:
        response.headers.update(lookup.miss_headers())
    if (
        response.status != 200
        or record.outcome not in WHOLE
        or record.generation_id is None
        or record.tag is None
        or record.provider is None
    ):
        return response
    if tap is not None:
        payload = kept_stream(tap)
    else:
        body = response.body if isinstance(response, web.Response) else None
        payload = bytes(body).strip() if isinstance(body, bytes | bytearray) else None
    if payload:
        entry = Entry(
            record.generation_id,
            sim.now(),
            lookup.ttl,
            payload,
            record.provider,
            record.tag,
            record.finish_reason or "stop",
        )
        sim.response_cache.store(lookup, entry)
    return response
