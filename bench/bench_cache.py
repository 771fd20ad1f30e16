"""Cache-aware pinning against today's pinning, on a multi-turn shared-prefix workload.

``python -m bench cache [--conversations 2000] [--turns 6] [--capacity 400] [--speed 100]
[--rate-limit P]``

The workload regenerates conversations turn by turn (as SpecForge's
``regenerate_train_data.py`` does for EAGLE-3 data): every conversation opens with
one long system prompt shared by all, then its own user turns and the dataset's
assistant turns; turn *k* sends the first *k* user turns, and a conversation sends
turn *k + 1* once turn *k* is answered. All conversations run at once, so 2,000
conversations keep 2,000 requests in flight.

Two runs, each against a fresh local OpenRouter in its own process (same seed,
same faults, time compressed ``--speed`` times so that answers take time and
requests pile up at a provider as they do at 2,000 in flight), with the same
policy (``exclude_below="int4"``) and the same workload (the prompt share
:func:`~provider_router.planning.workload_stats.shared_prefix_share` expects from cache):

* **order**: today's routing object (``order`` + ``only`` of every allowed
  endpoint): OpenRouter's sticky routing is off, and a request the first endpoint
  cannot take falls through to the next;
* **pinned**: ``Router(cache_affinity=True)``: each conversation on one endpoint
  (one-tag ``only``, its ``session_id``, no ``order``);
* **pinned+fb**: ``Router(cache_affinity=AffinityOptions(pin_fallbacks=True))``: the pin first
  (``order: [pin]``, every allowed tag in ``only``), so OpenRouter falls back inside.

``--capacity N`` gives every endpoint a ``max_in_flight: N`` rate limit (a
provider's real concurrency limit; 0 for none): realistic, but when it binds depends
on timing, so on a shared machine the figures move from run to run. ``--rate-limit P``
instead makes every attempt anywhere a 429 with probability ``P``, drawn from the
request's seeded stream: the same in every run (use ``--capacity 0`` with it).
Printed: cache hit rate (cached over prompt tokens), prompt cost, total cost, and
the projection of the same workload against the pinned run's actual cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from decimal import Decimal
from typing import Any

from bench.bench_client import KEY, MODEL, Sim, _uvloop

CACHE_CAPACITY = 200_000
"""Prefixes each simulated endpoint keeps: enough for every live conversation here
(the default 10,000 would evict at random and blur what routing does)."""

COMPLETION_TOKENS = 300
SYSTEM = {
    "role": "system",
    "content": "You are writing careful, detailed answers for a training set. " * 95,
}


def conversations(count: int, turns: int) -> list[list[list[dict[str, Any]]]]:
    """Per conversation, the messages of each turn's request."""
    out = []
    for c in range(count):
        messages: list[dict[str, Any]] = [SYSTEM]
        requests = []
        for t in range(turns):
            question = f"Conversation {c}, question {t}: explain step {t} of the method. " * 4
            messages = [*messages, {"role": "user", "content": question}]
            requests.append(messages)
            answer = f"In conversation {c}, step {t} works like this, in detail. " * 18
            messages = [*messages, {"role": "assistant", "content": answer}]
        out.append(requests)
    return out


def _faults(capacity: int, tags: list[str], rate: float) -> list[dict[str, Any]]:
    faults: list[dict[str, Any]] = []
    if capacity > 0:
        faults += [{"kind": "rate_limit", "provider": t, "max_in_flight": capacity} for t in tags]
    if rate > 0:
        faults.append({"kind": "rate_limit", "rate": rate})
    return faults


async def _run(
    url: str, convs: list[list[list[dict[str, Any]]]], workload: Any, mode: str
) -> dict[str, Any]:
    from provider_router import AffinityOptions, ProviderPolicy, Router

    router = Router(
        MODEL,
        base_url=url,
        api_key=KEY,
        policy=ProviderPolicy(exclude_below="int4"),
        workload=workload,
        cache_affinity=(
            AffinityOptions(pin_fallbacks=True) if mode == "pinned+fb" else mode != "order"
        ),
        max_concurrency=len(convs),
    )
    totals = {"requests": 0, "prompt": 0, "cached": 0, "failed": 0}
    prompt_cost = Decimal(0)
    cost = Decimal(0)
    providers: dict[str, int] = {}
    async with router:
        plan = router.plan

        async def converse(requests: list[list[dict[str, Any]]]) -> None:
            nonlocal prompt_cost, cost
            for messages in requests:
                try:
                    result = await router.chat(messages, max_tokens=1024)
                except Exception:
                    totals["failed"] += 1
                    return
                usage = result.usage
                assert usage is not None
                assert result.cost is not None
                totals["requests"] += 1
                totals["prompt"] += usage.prompt_tokens
                totals["cached"] += usage.cached_tokens
                cost += result.cost
                side = plan.estimate(
                    result.provider, usage.prompt_tokens, 0, cached_tokens=usage.cached_tokens
                )
                assert side is not None
                prompt_cost += side
                name = result.provider or "?"
                providers[name] = providers.get(name, 0) + 1

        start = time.perf_counter()
        await asyncio.gather(*(converse(c) for c in convs))
        seconds = time.perf_counter() - start
        moves = router.affinity.moves
    return {
        **totals,
        "hit_rate": totals["cached"] / max(totals["prompt"], 1),
        "prompt_cost": prompt_cost,
        "cost": cost,
        "seconds": seconds,
        "providers": dict(sorted(providers.items(), key=lambda kv: -kv[1])),
        "moves": moves,
    }


async def _project(url: str, convs: list[list[list[dict[str, Any]]]], share: Any) -> Any:
    from provider_router import Catalog, ProviderPolicy
    from provider_router.planning import WorkloadEstimate
    from provider_router.planning.projection import project
    from provider_router.planning.workload import DatasetDemand
    from provider_router.planning.workload_stats import approx_prompt_tokens

    requests = [m for c in convs for m in c]
    mean = Decimal(sum(approx_prompt_tokens(m) for m in requests)) / len(requests)
    estimate = WorkloadEstimate(mean, COMPLETION_TOKENS, cached_prompt_share=share.share)
    async with Catalog(base_url=url, api_key=KEY) as catalog:
        listing = await catalog.endpoints(MODEL)
    return project(
        [DatasetDemand("bench", max_requests=len(requests))],
        listing,
        ProviderPolicy(exclude_below="int4"),
        estimate,
    ), estimate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench cache")
    parser.add_argument("--conversations", type=int, default=2000)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--capacity", type=int, default=400)
    parser.add_argument("--rate-limit", type=float, default=0.0)
    parser.add_argument("--speed", type=float, default=100.0)
    args = parser.parse_args(argv)
    _uvloop()
    from provider_router.planning.workload_stats import shared_prefix_share
    from provider_router.testing import Market

    convs = conversations(args.conversations, args.turns)
    order_of_sending = [c[t] for t in range(args.turns) for c in convs]
    share = shared_prefix_share(order_of_sending, min_tokens=128)
    tags = [e.tag for e in Market.default().models[MODEL].endpoints]
    faults = _faults(args.capacity, tags, args.rate_limit)
    print(
        f"{args.conversations} conversations x {args.turns} turns, capacity {args.capacity} "
        f"per endpoint, 429 rate {args.rate_limit} "
        f"; expected cache share {float(share.share):.4f}"
    )
    results: dict[str, Any] = {}
    projection = estimate = None
    for mode in ("order", "pinned", "pinned+fb"):
        sim = Sim(args.speed, faults, COMPLETION_TOKENS, CACHE_CAPACITY)
        try:
            if projection is None:
                projection, estimate = asyncio.run(_project(sim.url, convs, share))
            assert estimate is not None
            results[mode] = asyncio.run(_run(sim.url, convs, estimate.to_workload(), mode))
        finally:
            sim.stop()
    assert projection is not None
    for mode, r in results.items():
        print(
            f"{mode:>9}: {r['requests']} served ({r['failed']} failed) in {r['seconds']:.1f} s; "
            f"hit rate {r['hit_rate']:.4f}; prompt ${r['prompt_cost']:.4f}; "
            f"total ${r['cost']:.4f}; moves {r['moves']}; {json.dumps(r['providers'])}"
        )
    order = results["order"]
    for mode in ("pinned", "pinned+fb"):
        pinned = results[mode]
        print(
            f"{mode}/order: prompt cost x{pinned['prompt_cost'] / order['prompt_cost']:.3f}, "
            f"total x{pinned['cost'] / order['cost']:.3f}"
        )
        for basis in ("cheapest", "mix"):
            projected = projection.total.cost(basis).expected
            error = (projected - pinned["cost"]) / pinned["cost"]
            print(
                f"  projection ({basis}): ${projected:.4f} against {mode} actual "
                f"${pinned['cost']:.4f} ({float(error) * 100:+.2f} %)"
            )
    return 0
