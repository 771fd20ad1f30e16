"""The lean-path table of issue #13: CPU per request of our full stack against bare aiohttp.

Run: ``python -m bench perf`` (``--quick`` for a short run; ``--rounds``, ``--n``,
``--skip openai,litellm,redis,import``, ``--litellm-python PATH`` to take LiteLLM
from another interpreter, ``--json FILE``; ``--stream``: every request streamed, what
the batch runner sends, against a bare aiohttp loop reading the same SSE stream; the
openai and LiteLLM rows are left out). Scenarios: 2 s latency with 2,000
requests in flight, and 200 ms with 500. Each client run is a fresh process
(``python -m bench.bench_perf --client ...``) against a local OpenRouter started
for that run alone in its own process; every client sends the same body (the
Router's ``provider`` object included). Rounds are interleaved (every client
once per round, in the same order), so load from other work on a shared machine
spreads over all of them. Reported: CPU (user + system, all threads) per request,
median over rounds; the ratio to bare aiohttp measured in the same round, as a
median and a range; peak RSS. Then ``import provider_router`` against ``import
aiohttp``, cold, from ``python -X importtime``.

Rows:

* ``bare``: aiohttp + uvloop, one shared session, the body pre-encoded;
* ``sqlite``: ``Router`` + ``SQLiteLedger`` as a library user writes it (policy,
  route plan, reservation durable before send, retries, limiter, health), logging
  not configured;
* ``sqlite-logging``: the same in an application that configured logging
  (``logging.basicConfig(level=logging.INFO)``, to a file);
* ``memory``: ``Router`` + ``MemoryLedger``;
* ``redis``: ``Router`` + ``RedisLedger`` (a local ``redis-server`` started here);
* ``openai``: ``AsyncOpenAI`` (httpx), no retries;
* ``litellm``: LiteLLM's ``Router`` (not a dependency: skipped unless importable by
  the interpreter given with ``--litellm-python``, default this one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from decimal import Decimal
from pathlib import Path
from typing import Any

from bench.bench_client import (
    BASE_LATENCY,
    KEY,
    MAX_TOKENS,
    MESSAGES,
    MODEL,
    Sim,
    _bare,
    _drive,
    _litellm,
    _measured,
    _openai,
    _provider_object,
    _uvloop,
)

SCENARIOS = (("2s", 2.0, 2000), ("200ms", 0.2, 500))
KINDS = ("bare", "sqlite", "sqlite-logging", "memory", "redis", "openai", "litellm")
LABELS = {
    "bare": "bare aiohttp + uvloop",
    "sqlite": "Router + SQLiteLedger, logging not configured",
    "sqlite-logging": "Router + SQLiteLedger, application logging at INFO",
    "memory": "Router + MemoryLedger",
    "redis": "Router + RedisLedger",
    "openai": "openai SDK (AsyncOpenAI)",
    "litellm": "LiteLLM Router",
}
_SLOW_CLIENTS = ("openai", "litellm")


# --- one client run (in its own process) ----------------------------------------------


async def _router(
    url: str, n: int, concurrency: int, kind: str, redis_url: str | None, stream: bool = False
) -> Any:
    from provider_router import MemoryLedger, ProviderPolicy, RedisLedger, Router, SQLiteLedger

    with tempfile.TemporaryDirectory() as tmp:
        limit = Decimal(10**6)
        ledger: Any
        if kind == "memory":
            ledger = MemoryLedger(limit)
        elif kind == "redis":
            assert redis_url is not None
            ledger = RedisLedger(redis_url, f"bench-{os.getpid()}", limit)
        else:
            ledger = SQLiteLedger(Path(tmp) / "bench.ledger", limit)
        if kind == "sqlite-logging":
            import logging

            logging.basicConfig(
                filename=str(Path(tmp) / "app.log"),
                level=logging.INFO,
                format="%(asctime)s %(name)s %(levelname)s %(message)s",
            )
        async with (
            ledger,
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
                await router.chat(MESSAGES, max_tokens=MAX_TOKENS, stream=stream)

            return await _measured(_drive(send, n, concurrency))


def _client(kind: str, url: str, n: int, concurrency: int, provider: dict[str, Any]) -> None:
    _uvloop()
    redis_url = os.environ.get("BENCH_REDIS_URL")
    stream = os.environ.get("BENCH_STREAM") == "1"
    if kind == "bare":
        coro = _bare(url, n, concurrency, provider, stream)
    elif kind == "openai":
        coro = _openai(url, n, concurrency, provider)
    elif kind == "litellm":
        coro = _litellm(url, n, concurrency, provider)
    else:
        coro = _router(url, n, concurrency, kind, redis_url, stream)
    result = asyncio.run(coro)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


def run_client(
    kind: str,
    url: str,
    n: int,
    concurrency: int,
    provider: dict[str, Any],
    python: str,
    redis_url: str | None,
    stream: bool = False,
) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    if redis_url:
        env["BENCH_REDIS_URL"] = redis_url
    if stream:
        env["BENCH_STREAM"] = "1"
    args = ["-m", "bench.bench_perf", "--client", kind, url, str(n), str(concurrency)]
    done = subprocess.run(  # noqa: S603 - our own fixed command
        [python, *args, json.dumps(provider)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{kind} client failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# --- import time ---------------------------------------------------------------------------


def import_seconds(statement: str, runs: int = 5) -> float:
    """Median seconds ``statement`` takes in a fresh interpreter (cold, after start-up).

    For ``import X`` this is the cumulative figure ``python -X importtime`` gives
    for ``X``; timing the statement also covers names a lazy package imports on
    first use (``from provider_router import Router``).
    """
    code = "import time; t = time.perf_counter(); " + statement + "; print(time.perf_counter() - t)"
    times = []
    for _ in range(runs):
        done = subprocess.run(  # noqa: S603 - our own fixed command
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
        times.append(float(done.stdout.strip()))
    return statistics.median(times)


# --- redis -----------------------------------------------------------------------------------


def _start_redis() -> tuple[subprocess.Popen[str] | None, str | None]:
    binary = shutil.which("redis-server")
    if binary is None:
        return None, None
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(  # noqa: S603 - fixed arguments
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if "Ready to accept connections" in line:
            break
    proc.stdout.close()
    return proc, f"redis://127.0.0.1:{port}/0"


# --- the table -------------------------------------------------------------------------------


def _summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    bare = runs["bare"]
    out: dict[str, Any] = {}
    for kind, rows in runs.items():
        per_req = [r["cpu_per_1000"] for r in rows]  # s per 1,000 = ms per request
        ratios = [r["cpu_per_1000"] / b["cpu_per_1000"] for r, b in zip(rows, bare, strict=True)]
        out[kind] = {
            "cpu_ms_per_request": round(statistics.median(per_req), 3),
            "ratio": round(statistics.median(ratios), 2),
            "ratio_min": round(min(ratios), 2),
            "ratio_max": round(max(ratios), 2),
            "peak_rss_mb": round(statistics.median(r["peak_rss_mb"] for r in rows), 1),
            "rps": round(statistics.median(r["rps"] for r in rows)),
            "failed": sum(r["failed"] for r in rows),
        }
    return out


def _table(results: dict[str, Any]) -> str:
    lines = [
        "| client | 2 s, 2,000 in flight: CPU ms/req | vs bare | 200 ms, 500 in flight: "
        "CPU ms/req | vs bare | peak RSS (2 s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    two, fast = results.get("2s", {}), results.get("200ms", {})
    for kind in KINDS:
        if kind not in two and kind not in fast:
            continue
        cells = [LABELS[kind]]
        for section in (two, fast):
            row = section.get(kind)
            if row is None:
                cells += ["–", "–"]
                continue
            cells.append(f"{row['cpu_ms_per_request']:.3f}")
            cells.append(f"{row['ratio']:.2f}× ({row['ratio_min']:.2f}–{row['ratio_max']:.2f})")
        rss = two.get(kind) or fast.get(kind)
        cells.append(f"{rss['peak_rss_mb']:.0f} MB")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--client":
        kind, url, n, concurrency, provider = argv[1:6]
        _client(kind, url, int(n), int(concurrency), json.loads(provider))
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench perf", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="1 round of 3,000 requests")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=10_000, help="requests per run (ours, bare)")
    parser.add_argument("--n-slow", type=int, default=2_000, help="requests per openai/litellm run")
    parser.add_argument("--skip", default="", help="comma list of rows, or 'import'")
    parser.add_argument("--scenario", default="2s,200ms", help="comma list: 2s,200ms")
    parser.add_argument("--litellm-python", default=sys.executable)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--stream", action="store_true", help="stream every answer (bare and our rows only)"
    )
    args = parser.parse_args(argv)
    rounds, n, n_slow = args.rounds, args.n, args.n_slow
    if args.quick:
        rounds, n, n_slow = 1, 3000, 1000
    skip = set(filter(None, args.skip.split(",")))
    if args.stream:
        skip |= {*_SLOW_CLIENTS, "import"}
    kinds = [k for k in KINDS if k not in skip]
    if "litellm" in kinds:
        probe = subprocess.run(  # noqa: S603 - our own fixed command
            [args.litellm_python, "-c", "import litellm"], capture_output=True, check=False
        )
        if probe.returncode != 0:
            print("litellm is not importable: row skipped", file=sys.stderr)
            kinds.remove("litellm")
    redis_proc, redis_url = (None, None)
    if "redis" in kinds:
        redis_proc, redis_url = _start_redis()
        if redis_url is None:
            print("redis-server not found: row skipped", file=sys.stderr)
            kinds.remove("redis")
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, load "
        f"{os.getloadavg()[0]:.1f}, Python {platform.python_version()}, {platform.platform()}",
        "rounds": rounds,
        "requests": {"ours_and_bare": n, "openai_litellm": n_slow},
        "streamed": args.stream,
    }
    try:
        for label, latency, concurrency in SCENARIOS:
            if label not in args.scenario.split(","):
                continue
            speed = BASE_LATENCY / latency
            provider: dict[str, Any] | None = None
            runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
            for round_no in range(rounds):
                for kind in kinds:
                    sim = Sim(speed)
                    try:
                        if provider is None:
                            provider = _provider_object(sim.url)
                        python = args.litellm_python if kind == "litellm" else sys.executable
                        count = n_slow if kind in _SLOW_CLIENTS else n
                        row = run_client(
                            kind,
                            sim.url,
                            count,
                            concurrency,
                            provider,
                            python,
                            redis_url,
                            args.stream,
                        )
                    finally:
                        sim.stop()
                    runs[kind].append(row)
                    print(f"[{label} round {round_no + 1}] {kind}: {row}", file=sys.stderr)
            results[label] = _summarize(runs)
    finally:
        if redis_proc is not None:
            redis_proc.terminate()
            redis_proc.wait()
    if "import" not in skip:
        results["import_seconds"] = {
            "import provider_router": round(import_seconds("import provider_router"), 3),
            "from provider_router import Router, SQLiteLedger": round(
                import_seconds("from provider_router import Router, SQLiteLedger"), 3
            ),
            "import aiohttp": round(import_seconds("import aiohttp"), 3),
            "import openai": round(import_seconds("import openai"), 3),
        }
    if args.stream:
        print("every answer streamed (SSE), bare aiohttp reading the same stream")
    print(_table(results))
    if "import_seconds" in results:
        for statement, seconds in results["import_seconds"].items():
            print(f"{statement}: {seconds:.3f} s (cold, median of 5)")
    print(results["machine"])
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
