"""Paying the floor under load: our cost-first admission against OpenRouter's own routing.

Run: ``python -m bench admission`` (``--rounds N``, ``--prompts N``, ``--concurrency N``,
``--speed X``, ``--capacity N``, ``--premiums 0,0.02,0.05,none``, ``--markets
limited,roomy``, ``--lengths fixed|sim``, ``--completion-tokens N``, ``--json FILE``).

Two markets, the local OpenRouter's default Kimi K2.5 market at ``--speed``:
``limited``, where the three cheapest allowed endpoints (Chutes, Novita, DeepInfra)
each take ``--capacity`` requests in flight and answer 429 beyond
(``{kind: rate_limit, max_in_flight: N}``), and ``roomy``, with no limit. Clients:

* ``ours:P``: ``Router(policy=ProviderPolicy(exclude_below="int4"),
  max_concurrency=C, max_premium=P)``, no ledger, every prompt gathered at once;
* ``sort_price``: an aiohttp loop of C workers sending ``provider: {ignore: [the
  policy's rejected tags], sort: "price"}``, as a bare SDK call does (a 429 that reaches
  it is retried after its ``Retry-After``);
* ``default``: the same loop with ``provider: {ignore: [...]}``: OpenRouter's default
  routing.

Each client runs in a process of its own against a simulator process started for that
run alone, with the same seed and faults (a simulator keeps prefix caches, sticky
sessions and its breaker between requests: a shared one would hand one client's state
to the next); clients never run at once (they would share the capacity). Rounds rotate
the clients' order. Every prompt is distinct and the same for every client; with
``--lengths fixed`` every answer has ``--completion-tokens`` tokens, so wall times
compare like with like. The floor is every answer's tokens at the cheapest allowed
endpoint's prices (the route plan's floor). Reported per client: paid ÷ floor
(exact sums of ``usage.cost``), wall time, requests per serving provider, POSTs and
429s, CPU per 1,000 answers, requests served outside the allowed set (must be 0), and
for ours each endpoint's refusals, learned capacity and waits. Then the issue's
targets, checked on the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import resource
import statistics
import sys
import time
from collections import Counter
from decimal import Decimal
from typing import Any

from bench.bench_client import KEY, MODEL, Sim, _uvloop

CAPPED = ("chutes", "novita", "deepinfra")
DEFAULT_PREMIUMS = "0,0.02,0.05,none"


def _plan(url: str) -> Any:
    from provider_router import Catalog, ProviderPolicy, build_route_plan
    from provider_router.client._config import DEFAULT_WORKLOAD

    async def fetch() -> Any:
        async with Catalog(url) as catalog:
            listing = await catalog.endpoints(MODEL)
        decisions = ProviderPolicy(exclude_below="int4").evaluate(listing, model_id=MODEL)
        return build_route_plan(MODEL, decisions, workload=DEFAULT_WORKLOAD)

    return asyncio.run(fetch())


def _prompt(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Write one paragraph about routing, number {i}."}]


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _ours(url: str, args: argparse.Namespace, premium: str, plan: Any) -> dict[str, Any]:
    from provider_router import ProviderPolicy, Router

    served: Counter[str] = Counter()
    paid = floor = Decimal(0)
    outside = elsewhere = 0
    async with Router(
        MODEL,
        policy=ProviderPolicy(exclude_below="int4"),
        max_concurrency=args.concurrency,
        max_premium=None if premium == "none" else Decimal(premium),
        base_url=url,
        api_key=KEY,
    ) as router:
        names = {route.tag: route.provider_name for route in router.plan.routes}

        async def one(i: int) -> None:
            nonlocal paid, floor, outside, elsewhere
            result = await router.chat(_prompt(i), max_tokens=args.max_tokens)
            served[result.provider or "?"] += 1
            assert result.cost is not None
            assert result.floor_cost is not None
            paid += result.cost
            floor += result.floor_cost
            outside += result.provider not in plan.allowed_providers
            elsewhere += names.get(result.endpoint or "") != result.provider

        cpu, start = _cpu(), time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(args.prompts)))
        wall, cpu = time.perf_counter() - start, _cpu() - cpu
        lanes = router.admission.snapshot()
    return {
        "paid": str(paid),
        "floor": str(floor),
        "wall": wall,
        "cpu_per_1k": cpu / args.prompts * 1000,
        "served": dict(served),
        "posts": sum(lane.admitted for lane in lanes.values()),
        "429s": sum(lane.refused for lane in lanes.values()),
        "outside": outside,
        "elsewhere": elsewhere,
        "lanes": {
            tag: {
                "refused": lane.refused,
                "capacity": lane.capacity,
                "waited": lane.waited_requests,
                "wait_mean": round(lane.wait_s_mean, 3),
                "wait_p95": lane.wait_s_p95,
                "wait_max": round(lane.wait_s_max, 3),
            }
            for tag, lane in lanes.items()
            if lane.admitted
        },
    }


async def _loop(url: str, args: argparse.Namespace, provider: dict[str, Any], plan: Any) -> Any:
    """A bare aiohttp loop, as an SDK user writes it: a 429 that reaches it is retried."""
    import aiohttp

    served: Counter[str] = Counter()
    paid = floor = Decimal(0)
    posts = limited = outside = 0
    pricing = plan.floor.endpoint.pricing
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    bodies = [
        json.dumps(
            {
                "model": MODEL,
                "messages": _prompt(i),
                "max_tokens": args.max_tokens,
                "provider": provider,
            }
        ).encode()
        for i in range(args.prompts)
    ]
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), headers=headers
    ) as session:
        cursor = iter(range(args.prompts))

        async def worker() -> None:
            nonlocal paid, floor, posts, limited, outside
            for i in cursor:
                while True:
                    posts += 1
                    async with session.post(f"{url}/chat/completions", data=bodies[i]) as r:
                        text = await r.read()
                        wait = r.headers.get("Retry-After")
                    if r.status == 429:
                        limited += 1
                        await asyncio.sleep(float(wait) if wait else 0.5)
                        continue
                    if r.status != 200:
                        raise RuntimeError(f"HTTP {r.status}: {text[:200]!r}")
                    break
                data = json.loads(text, parse_float=Decimal)
                usage = data["usage"]
                served[data["provider"]] += 1
                outside += data["provider"] not in plan.allowed_providers
                paid += Decimal(usage["cost"])
                floor += pricing.cost(usage["prompt_tokens"], usage["completion_tokens"])

        cpu, start = _cpu(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        wall, cpu = time.perf_counter() - start, _cpu() - cpu
    return {
        "paid": str(paid),
        "floor": str(floor),
        "wall": wall,
        "cpu_per_1k": cpu / args.prompts * 1000,
        "served": dict(served),
        "posts": posts,
        "429s": limited,
        "outside": outside,
        "elsewhere": 0,
    }


def _client(kind: str, url: str, args: argparse.Namespace, out: Any) -> None:
    import faulthandler

    faulthandler.dump_traceback_later(args.timeout, exit=True)
    from provider_router._collector import tune_for_process

    _uvloop()
    tune_for_process()
    plan = _plan(url)
    if kind.startswith("ours:"):
        result = asyncio.run(_ours(url, args, kind.removeprefix("ours:"), plan))
    else:
        provider: dict[str, Any] = {"ignore": list(plan.ignore)}
        if kind == "sort_price":
            provider["sort"] = "price"
        result = asyncio.run(_loop(url, args, provider, plan))
    out.send(result)


def _run(kind: str, faults: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    completion = args.completion_tokens if args.lengths == "fixed" else None
    sim = Sim(args.speed, faults, completion_tokens=completion)
    try:
        parent, child = mp.Pipe()
        process = mp.get_context("fork").Process(target=_client, args=(kind, sim.url, args, child))
        process.start()
        result: dict[str, Any] = parent.recv()
        process.join()
    finally:
        sim.stop()
    result["ratio"] = float(Decimal(result["paid"]) / Decimal(result["floor"]))
    return result


def _range(values: list[float], fmt: str) -> str:
    middle = statistics.median(values)
    if len(values) == 1:
        return format(middle, fmt)
    return f"{format(middle, fmt)} ({format(min(values), fmt)}–{format(max(values), fmt)})"


def _table(market: str, runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    lines = [
        f"\n{market} market",
        "| client | paid ÷ floor | wall s | where it went (median run) | POSTs | 429s "
        "| CPU s/1k | outside |",
        "|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for kind, results in runs.items():
        ratios = [r["ratio"] for r in results]
        walls = [r["wall"] for r in results]
        median_run = sorted(results, key=lambda r: r["ratio"])[len(results) // 2]
        spread = ", ".join(
            f"{name} {n}" for name, n in sorted(median_run["served"].items(), key=lambda x: -x[1])
        )
        lines.append(
            f"| {kind} | {_range(ratios, '.4f')}× | {_range(walls, '.2f')} | {spread} "
            f"| {round(statistics.median(r['posts'] for r in results))} "
            f"| {round(statistics.median(r['429s'] for r in results))} "
            f"| {statistics.median(r['cpu_per_1k'] for r in results):.2f} "
            f"| {sum(r['outside'] + r['elsewhere'] for r in results)} |"
        )
    for kind, results in runs.items():
        if kind.startswith("ours:"):
            median_run = sorted(results, key=lambda r: r["ratio"])[len(results) // 2]
            parts = [
                f"{tag}: refused {lane['refused']}, capacity {lane['capacity']}, "
                f"waited {lane['waited']} (mean {lane['wait_mean']} s, p95 ≤ "
                f"{lane['wait_p95']} s, max {lane['wait_max']} s)"
                for tag, lane in median_run["lanes"].items()
            ]
            lines.append(f"  {kind}: " + "; ".join(parts))
    return lines


def _checks(limited: dict[str, list[Any]], roomy: dict[str, list[Any]], default: str) -> list[str]:
    out = ["\ntargets (on medians)"]
    ours = f"ours:{default}"

    def med(runs: dict[str, list[Any]], kind: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[kind])

    if ours in limited and "sort_price" in limited:
        ratio, wall = med(limited, ours, "ratio"), med(limited, ours, "wall")
        sort_ratio, sort_wall = (
            med(limited, "sort_price", "ratio"),
            med(limited, "sort_price", "wall"),
        )
        for ok, what in (
            (ratio <= 1.02, f"limited: {ours} {ratio:.4f}× ≤ 1.02× the floor"),
            (ratio <= sort_ratio, f"limited: {ours} {ratio:.4f}× ≤ sort_price {sort_ratio:.4f}×"),
            (
                wall <= 1.5 * sort_wall,
                f"limited: {ours} wall {wall:.2f} s ≤ 1.5 × sort_price's {sort_wall:.2f} s "
                f"({wall / sort_wall:.2f}×)",
            ),
        ):
            out.append(f"  {'PASS' if ok else 'FAIL'}  {what}")
    for kind, results in roomy.items():
        if kind.startswith("ours:"):
            exact = all(Decimal(r["paid"]) == Decimal(r["floor"]) for r in results)
            out.append(f"  {'PASS' if exact else 'FAIL'}  roomy: {kind} paid == floor exactly")
    every = [r for runs in (limited, roomy) for results in runs.values() for r in results]
    wrong = sum(r["outside"] + r["elsewhere"] for r in every)
    out.append(f"  {'PASS' if wrong == 0 else 'FAIL'}  no answer outside the allowed set: {wrong}")
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench admission")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--speed", type=float, default=200.0)
    parser.add_argument("--capacity", type=int, default=60)
    parser.add_argument("--premiums", default=DEFAULT_PREMIUMS)
    parser.add_argument("--roomy-premiums", default="0.02,none")
    parser.add_argument("--markets", default="limited,roomy")
    parser.add_argument("--lengths", choices=("fixed", "sim"), default="fixed")
    parser.add_argument("--completion-tokens", type=int, default=400)
    parser.add_argument("--max-tokens", type=int, default=2000)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per client run")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    markets = [m.strip() for m in args.markets.split(",") if m.strip()]
    print(
        f"bench admission: {args.prompts} prompts, {args.concurrency} in flight, speed "
        f"{args.speed:g}, capacity {args.capacity} at {', '.join(CAPPED)}, lengths "
        f"{args.lengths}, {args.rounds} round(s); {platform.machine()}, {os.cpu_count()} "
        f"cores, Python {platform.python_version()}, load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for market in markets:
        premiums = args.premiums if market == "limited" else args.roomy_premiums
        kinds = [f"ours:{p.strip()}" for p in premiums.split(",") if p.strip()]
        kinds += ["sort_price", "default"]
        faults = (
            [{"kind": "rate_limit", "provider": t, "max_in_flight": args.capacity} for t in CAPPED]
            if market == "limited"
            else []
        )
        runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
        for round_ in range(args.rounds):
            order = kinds[round_ % len(kinds) :] + kinds[: round_ % len(kinds)]
            for kind in order:
                result = _run(kind, faults, args)
                runs[kind].append(result)
                print(
                    f"  {market} round {round_ + 1} {kind}: {result['ratio']:.4f}× "
                    f"{result['wall']:.2f} s {result['served']}",
                    flush=True,
                )
        results[market] = runs
        print("\n".join(_table(market, runs)), flush=True)
    print(
        "\n".join(_checks(results.get("limited", {}), results.get("roomy", {}), "0.02")),
        flush=True,
    )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "results": results}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
