"""Client benchmarks: our Router against a bare aiohttp+uvloop loop (and openai, LiteLLM).

Run: ``python -m bench client`` (or ``python bench/bench_client.py``); ``--quick``
for a smaller run. Everything runs against the local OpenRouter
(:mod:`provider_router.testing`) with time-scaled latencies; the simulator runs in
its own process so each client process's CPU is its own. Reported as ratios
against the bare loop measured in the same run (the machine is shared: noisy).

Sections:
1. overhead and throughput at 2,000 in flight, 2 s and 200 ms latency: CPU per
   1,000 requests, requests/s, peak RSS: bare aiohttp, our full stack (policy,
   routing, SQLite ledger, retries, info logging to a file), the openai SDK and
   LiteLLM's Router (when installed; it is not a dependency);
2. budget runs: 50 seeded runs (``--jobs`` in parallel) at 2,000 concurrency with
   random completion lengths until the budget is gone: overspend and the spent
   share at exhaustion;
3. rate limits: the simulator admits R requests/s for the key (a token bucket,
   one run per ``--burst`` depth); goodput and the share of attempts drawing a 429.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import multiprocessing as mp
import os
import platform
import resource
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import Any

MODEL = "moonshotai/kimi-k2.5"
KEY = "sk-sim-bench-key"
MESSAGES = [{"role": "user", "content": "Write one sentence about routing."}]
COMPLETION_TOKENS = 10
MAX_TOKENS = 64
# Chutes (the first in our order) answers in ~1.85 s + 10 tokens / 31 tok/s at speed 1.
BASE_LATENCY = 1.85 + COMPLETION_TOKENS / 31


def _uvloop() -> None:
    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


# --- the simulator process ----------------------------------------------------------


def _serve(
    speed: float,
    ready: Any,
    faults: list[dict[str, Any]] | None = None,
    completion_tokens: int | None = COMPLETION_TOKENS,
    cache_capacity: int | None = None,
) -> None:
    _uvloop()
    from provider_router._collector import tune_for_process as tune_for_server
    from provider_router.testing import SimulatorServer
    from provider_router.testing.market.prefix_cache import PrefixCache

    async def main() -> None:
        async with SimulatorServer(
            api_keys=[KEY],
            credits=10**6,
            speed=speed,
            faults=faults or [],
            log_limit=1000,
            **({} if completion_tokens is None else {"completion_tokens": completion_tokens}),
        ) as sim:
            if cache_capacity is not None:
                sim.simulator.caches = PrefixCache(cache_capacity)
            # A process of the simulator's own, as `provider_router simulate` runs it.
            tune_for_server()
            ready.send(sim.url)
            await asyncio.Event().wait()

    asyncio.run(main())


class Sim:
    """The simulator in a child process."""

    def __init__(
        self,
        speed: float,
        faults: list[dict[str, Any]] | None = None,
        completion_tokens: int | None = COMPLETION_TOKENS,
        cache_capacity: int | None = None,
    ) -> None:
        parent, child = mp.Pipe()
        self.process = mp.get_context("fork").Process(
            target=_serve,
            args=(speed, child, faults, completion_tokens, cache_capacity),
            daemon=True,
        )
        self.process.start()
        self.url: str = parent.recv()

    def stop(self) -> None:
        self.process.terminate()
        self.process.join(5)


# --- client processes ---------------------------------------------------------------


def _provider_object(url: str) -> dict[str, Any]:
    from provider_router import Catalog, ProviderPolicy, Workload, build_route_plan

    async def fetch() -> dict[str, Any]:
        async with Catalog(url) as catalog:
            listing = await catalog.endpoints(MODEL)
        decisions = ProviderPolicy(exclude_below="int4").evaluate(listing, model_id=MODEL)
        plan = build_route_plan(
            MODEL, decisions, workload=Workload(prompt_tokens=500, completion_tokens=2000)
        )
        return plan.provider_object()

    return asyncio.run(fetch())


async def _drive(send: Any, n: int, concurrency: int) -> tuple[int, int, list[float]]:
    """``concurrency`` workers send until ``n`` requests were started."""
    started = 0
    ok = 0
    failed = 0
    latencies: list[float] = []

    async def worker() -> None:
        nonlocal started, ok, failed
        while started < n:
            started += 1
            t0 = time.perf_counter()
            try:
                await send()
            except Exception:
                failed += 1
            else:
                ok += 1
                latencies.append(time.perf_counter() - t0)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return ok, failed, latencies


async def _bare(
    url: str, n: int, concurrency: int, provider: dict[str, Any], stream: bool = False
) -> Any:
    """A bare aiohttp + uvloop loop; ``stream``: each answer read as SSE lines, every
    ``data:`` line decoded and the cost taken from the usage chunk (a user's own loop)."""
    import aiohttp

    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": MAX_TOKENS, "provider": provider}
    if stream:
        body["stream"] = True
    payload = json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), headers=headers
    ) as session:

        async def send() -> None:
            async with session.post(f"{url}/chat/completions", data=payload) as response:
                data = json.loads(await response.read())
                if response.status != 200:
                    raise RuntimeError(response.status)
                data["usage"]["cost"]

        async def send_streamed() -> None:
            async with session.post(f"{url}/chat/completions", data=payload) as response:
                if response.status != 200:
                    raise RuntimeError(response.status)
                cost = None
                async for line in response.content:
                    if line.startswith(b"data: ") and line[6:].strip() != b"[DONE]":
                        usage = json.loads(line[6:]).get("usage")
                        if usage:
                            cost = usage["cost"]
                if cost is None:
                    raise RuntimeError("no usage in the stream")

        return await _measured(_drive(send_streamed if stream else send, n, concurrency))


async def _ours(url: str, n: int, concurrency: int, provider: dict[str, Any]) -> Any:
    import structlog

    from provider_router import ProviderPolicy, Router, SQLiteLedger

    log_file = open(os.devnull, "w")  # noqa: SIM115, ASYNC230 - set-up, closed below
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(20),  # info
        logger_factory=structlog.PrintLoggerFactory(file=log_file),
        cache_logger_on_first_use=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        async with (
            SQLiteLedger(Path(tmp) / "bench.ledger", limit=Decimal(10**6)) as ledger,
            Router(
                MODEL,
                policy=ProviderPolicy(exclude_below="int4"),
                ledger=ledger,
                max_concurrency=concurrency,
                base_url=url,
                api_key=KEY,
            ) as router,
        ):

            async def send() -> None:
                await router.chat(MESSAGES, max_tokens=MAX_TOKENS)

            result = await _measured(_drive(send, n, concurrency))
    log_file.close()
    return result


async def _openai(url: str, n: int, concurrency: int, provider: dict[str, Any]) -> Any:
    import openai

    limits_kw: dict[str, Any] = {}
    try:
        import httpx

        limits_kw["http_client"] = openai.DefaultAsyncHttpxClient(
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        )
    except Exception:  # the SDK's own default client, then
        limits_kw = {}
    client = openai.AsyncOpenAI(base_url=url, api_key=KEY, max_retries=0, **limits_kw)

    async def send() -> None:
        response = await client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=MAX_TOKENS,
            extra_body={"provider": provider},
        )
        assert response.usage is not None

    try:
        return await _measured(_drive(send, n, concurrency))
    finally:
        await client.close()


async def _litellm(url: str, n: int, concurrency: int, provider: dict[str, Any]) -> Any:
    # Not a dependency: ``pip install litellm`` to include it (the run says when absent).
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download at import
    from litellm import Router as LiteLLMRouter

    router = LiteLLMRouter(
        model_list=[
            {
                "model_name": "kimi",
                "litellm_params": {"model": f"openrouter/{MODEL}", "api_base": url, "api_key": KEY},
            }
        ],
        num_retries=0,
    )

    async def send() -> None:
        response = await router.acompletion(
            model="kimi",
            messages=MESSAGES,
            max_tokens=MAX_TOKENS,
            extra_body={"provider": provider},
        )
        assert response.usage is not None

    return await _measured(_drive(send, n, concurrency))


async def _measured(drive: Any) -> dict[str, Any]:
    before = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    ok, failed, latencies = await drive
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    latencies.sort()
    return {
        "ok": ok,
        "failed": failed,
        "wall": wall,
        "cpu": cpu,
        "cpu_per_1000": cpu / max(ok, 1) * 1000,
        "rps": ok / wall,
        "latency_p50": latencies[len(latencies) // 2] if latencies else None,
        "mean_latency": sum(latencies) / len(latencies) if latencies else None,
    }


_CLIENTS = {"bare": _bare, "ours": _ours, "openai": _openai, "litellm": _litellm}


def _client_main(kind: str, url: str, n: int, concurrency: int, out: Any) -> None:
    _uvloop()
    provider = _provider_object(url)
    result = asyncio.run(_CLIENTS[kind](url, n, concurrency, provider))
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out.send(result)


def run_client(kind: str, url: str, n: int, concurrency: int) -> dict[str, Any]:
    parent, child = mp.Pipe()
    process = mp.get_context("fork").Process(
        target=_client_main, args=(kind, url, n, concurrency, child)
    )
    process.start()
    result: dict[str, Any] = parent.recv()
    process.join()
    return result


# --- budget runs --------------------------------------------------------------------


async def _budget_run(seed: int, concurrency: int, reservations: int) -> dict[str, Any]:
    from provider_router import BudgetExhausted, MemoryLedger, ProviderPolicy, Router
    from provider_router.testing import SimulatorServer

    async with SimulatorServer(
        api_keys=[KEY], credits=10**6, speed=math.inf, seed=seed, median_completion_tokens=300
    ) as sim:
        probe = Router(
            MODEL, policy=ProviderPolicy(exclude_below="int4"), base_url=sim.url, api_key=KEY
        )
        async with probe:
            worst = probe._build_request(MESSAGES, 1000, False, None, None, {}).worst_case
        limit = worst * reservations
        ledger = MemoryLedger(limit)
        stop = False
        async with Router(
            MODEL,
            policy=ProviderPolicy(exclude_below="int4"),
            ledger=ledger,
            max_concurrency=concurrency,
            base_url=sim.url,
            api_key=KEY,
            budget_wait=True,
        ) as router:

            async def worker() -> None:
                nonlocal stop
                while not stop:
                    try:
                        await router.chat(MESSAGES, max_tokens=1000)
                    except BudgetExhausted:
                        stop = True

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        state = await ledger.snapshot()
        charged = sum((r.cost for r in sim.log.chat()), Decimal(0))
    return {
        "seed": seed,
        "limit": limit,
        "charged": charged,
        "ledger_spent": state.spent,
        "overspend": max(charged - limit, Decimal(0)),
        "spent_share": charged / limit,
        "requests": router.requests,
    }


def _budget_main(seed: int) -> dict[str, Any]:
    """One budget run in a pool process (quiet logs: this measures money, not CPU)."""
    import structlog

    _uvloop()
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(30), cache_logger_on_first_use=True
    )
    return asyncio.run(_budget_run(seed, 2000, reservations=1000))


# --- rate limits --------------------------------------------------------------------


async def _rate_limit_run(
    url: str, rate: float, seconds: float, concurrency: int
) -> dict[str, Any]:
    """Drive the Router for ``seconds`` against a simulator that admits ``rate`` requests/s.

    The simulator runs in its own process (as OpenRouter is remote: its 429s come
    back while this loop is busy sending). Every failed attempt here is a 429
    (the only fault), so the 429s are counted from the attempts each request took.
    """
    from provider_router import AllAttemptsFailed, ProviderPolicy, Router

    async with Router(
        MODEL,
        policy=ProviderPolicy(exclude_below="int4"),
        max_concurrency=concurrency,
        base_url=url,
        api_key=KEY,
    ) as router:
        deadline = time.perf_counter() + seconds
        ok = 0
        rejected = 0

        async def worker() -> None:
            nonlocal ok, rejected
            while time.perf_counter() < deadline:
                try:
                    result = await router.chat(MESSAGES, max_tokens=MAX_TOKENS)
                except AllAttemptsFailed as exc:
                    rejected += len(exc.errors)
                    continue
                except Exception:
                    rejected += 1
                    continue
                # Requests finishing after the deadline count toward the 429 share
                # but not toward goodput (measured over the deadline only).
                if time.perf_counter() <= deadline:
                    ok += 1
                rejected += result.attempts - 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        window = router.limiter.limit
        sent = router.requests + router.failures
    attempts = sent + rejected - router.failures
    return {
        "R": rate,
        "seconds": round(deadline - t0, 2),
        "goodput": round(ok / (deadline - t0), 1),
        "goodput_share": round(ok / (deadline - t0) / rate, 4),
        "attempts": attempts,
        "share_429": round(rejected / max(attempts, 1), 4),
        "final_window": window,
    }


def _rate_limit_main(url: str, rate: float, seconds: float, concurrency: int, out: Any) -> None:
    _uvloop()
    out.send(asyncio.run(_rate_limit_run(url, rate, seconds, concurrency)))


def run_rate_limit(rate: float, burst: float, latency: float, seconds: float) -> dict[str, Any]:
    speed = BASE_LATENCY / latency
    # The bucket runs on simulated seconds: ``rate / speed`` per simulated second
    # is ``rate`` per real second; Retry-After is one real second.
    fault = {
        "kind": "rate_limit",
        "scope": "platform",
        "per_second": rate / speed,
        "burst": burst,
        "retry_after": speed,
    }
    sim = Sim(speed, [fault])
    try:
        parent, child = mp.Pipe()
        process = mp.get_context("fork").Process(
            target=_rate_limit_main, args=(sim.url, rate, seconds, 2000, child)
        )
        process.start()
        result: dict[str, Any] = parent.recv()
        process.join()
    finally:
        sim.stop()
    return {"burst": burst, "latency": latency, **result}


# --- report -------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench client", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller runs")
    parser.add_argument(
        "--skip", default="", help="comma list: throughput,budget,ratelimit,openai,litellm"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--jobs", type=int, default=2, help="budget runs in parallel")
    parser.add_argument(
        "--rate", type=float, default=200.0, help="rate-limit runs: R, requests/s admitted"
    )
    parser.add_argument(
        "--burst",
        type=float,
        nargs="+",
        default=[200.0, 20.0],
        help="rate-limit runs: token-bucket depths to try (one run each)",
    )
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    quick = args.quick
    results: dict[str, Any] = {
        "machine": f"{platform.machine()} {os.cpu_count()} cores, {platform.python_version()}, "
        f"{platform.platform()}",
    }
    concurrency = 2000
    if "throughput" not in skip:
        for label, latency in (("2s", 2.0), ("200ms", 0.2)):
            speed = BASE_LATENCY / latency
            n = 6000 if quick else (12000 if latency >= 1 else 16000)
            sim = Sim(speed)
            try:
                section: dict[str, Any] = {}
                kinds = ["bare", "ours"] + [k for k in ("openai", "litellm") if k not in skip]
                if "litellm" in kinds and importlib.util.find_spec("litellm") is None:
                    print("litellm is not installed: skipped", file=sys.stderr)
                    kinds.remove("litellm")
                for kind in kinds:
                    count = n if kind in ("bare", "ours") else min(n, 4000)
                    section[kind] = run_client(kind, sim.url, count, concurrency)
                    print(f"[{label}] {kind}: {section[kind]}", file=sys.stderr)
                results[f"throughput_{label}"] = section
            finally:
                sim.stop()
    if "budget" not in skip:
        runs = 10 if quick else 50
        t0 = time.perf_counter()
        with ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("fork")) as pool:
            budget = list(pool.map(_budget_main, range(runs)))
        for row in budget:
            print(f"[budget] run {row['seed']}: {row}", file=sys.stderr)
        results["budget"] = {
            "runs": runs,
            "wall_seconds": round(time.perf_counter() - t0, 1),
            "max_overspend": str(max(r["overspend"] for r in budget)),
            "min_spent_share": str(min(r["spent_share"] for r in budget)),
            "ledger_equals_charged": all(r["ledger_spent"] == r["charged"] for r in budget),
            "mean_requests": sum(r["requests"] for r in budget) / runs,
        }
        print(f"[budget] {results['budget']}", file=sys.stderr)
    if "ratelimit" not in skip:
        _uvloop()
        runs = []
        for burst in args.burst:
            runs.append(run_rate_limit(args.rate, burst, 0.5, 10 if quick else 30))
            print(f"[ratelimit] {runs[-1]}", file=sys.stderr)
        results["ratelimit"] = runs
    text = json.dumps(results, indent=2, default=str)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
