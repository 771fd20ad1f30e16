"""How fast is the local OpenRouter? ``python -m bench simulator [--requests N] [--concurrency C]``.

The server runs in its own process (one core), a raw aiohttp client in this one
(the other core). Each scenario is measured twice: against a bare aiohttp+uvloop
server that returns pre-built bytes of the same size and shape (the baseline, in
the same run) and against the simulator at infinite speed (zero latency), so the
numbers are reported as ratios to the baseline as well as absolutes. The server's
CPU comes from /proc (user + system), so "CPU per 1,000 requests" is the
simulator's own cost, whoever the bottleneck is; "one-core capacity" is 1 / that.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

COMPLETION_TOKENS = 256
_TICKS = os.sysconf("SC_CLK_TCK")


_TUNE_BASELINE = "PROVIDER_ROUTER_BENCH_TUNE_BASELINE"
_LOG_LIMIT = "PROVIDER_ROUTER_BENCH_LOG_LIMIT"


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _baseline_app(sample_json: bytes, sample_chunks: list[bytes]) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        if not body.get("stream"):
            return web.Response(body=sample_json, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in sample_chunks:
            await response.write(chunk)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/api/v1/chat/completions", chat)
    return app


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _serve(kind: str, ready: Any, sample_json: bytes, sample_chunks: list[bytes]) -> None:
    import uvloop

    from provider_router._collector import tune_for_process as tune_for_server
    from provider_router.testing import SimulatorServer

    async def main() -> None:
        if kind == "baseline":
            runner = web.AppRunner(_baseline_app(sample_json, sample_chunks), access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
            await site.start()
            port = runner.addresses[0][1]
        else:
            # The default log_limit (100,000), so the RSS curve shows what a user's run keeps.
            sim = SimulatorServer(
                speed=math.inf,
                credits=10**9,
                completion_tokens=COMPLETION_TOKENS,
                log_limit=int(os.environ.get(_LOG_LIMIT, "100000")),
            )
            await sim.start()
            port = sim.port
        if kind != "baseline" or os.environ.get(_TUNE_BASELINE):
            # The simulator's process as `provider_router simulate` runs it; the bare
            # server as people write it, unless --tune-baseline gives it the same.
            tune_for_server()
        ready.send(port)
        await asyncio.Event().wait()

    uvloop.run(main())


@dataclass
class Result:
    requests: int
    seconds: float
    server_cpu: float
    client_cpu: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    @property
    def cpu_ms_per_1000(self) -> float:
        return self.server_cpu / self.requests * 1000 * 1000


def _body(i: int, stream: bool) -> bytes:
    return json.dumps(
        {
            "model": "moonshotai/kimi-k2.5",
            "messages": [{"role": "user", "content": f"Write sample {i} of the data set."}],
            "max_tokens": 1024,
            "stream": stream,
        }
    ).encode()


async def _load(
    port: int, pid: int, n: int, concurrency: int, stream: bool, rss_every: int = 0
) -> Result:
    url = f"http://127.0.0.1:{port}/api/v1/chat/completions"
    headers = {"Authorization": "Bearer bench", "Content-Type": "application/json"}
    bodies = [_body(i, stream) for i in range(n)]
    connector = aiohttp.TCPConnector(limit=concurrency)
    next_index = 0
    last_cpu = _cpu_seconds(pid)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

        async def worker() -> None:
            nonlocal next_index, last_cpu
            while next_index < n:
                body = bodies[next_index]
                next_index += 1
                if rss_every and next_index % rss_every == 0:
                    # CPU of the stretch too: it must stay flat past log_limit as well.
                    cpu = _cpu_seconds(pid)
                    stretch = (cpu - last_cpu) / rss_every * 1e6
                    last_cpu = cpu
                    print(
                        f"  after {next_index:>7} requests: simulator RSS {_rss_mb(pid):6.1f} MB, "
                        f"CPU {stretch:5.0f} ms per 1,000 since the last line"
                    )
                async with session.post(url, data=body) as response:
                    await response.read()
                    if response.status != 200:
                        raise RuntimeError(f"status {response.status}")

        cpu0, client0, t0 = _cpu_seconds(pid), time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - t0
        return Result(n, seconds, _cpu_seconds(pid) - cpu0, time.process_time() - client0)


def _samples() -> tuple[bytes, list[bytes]]:
    """Bytes shaped like the simulator's answers, for the baseline server."""

    async def grab() -> tuple[bytes, list[bytes]]:
        from provider_router.testing import SimulatorServer

        async with (
            SimulatorServer(speed=math.inf, completion_tokens=COMPLETION_TOKENS) as sim,
            aiohttp.ClientSession(headers={"Authorization": "Bearer x"}) as session,
        ):
            url = sim.url + "/chat/completions"
            async with session.post(url, data=_body(0, False)) as response:
                sample_json = await response.read()
            async with session.post(url, data=_body(0, True)) as response:
                text = await response.read()
        chunks = [c + b"\n\n" for c in text.split(b"\n\n") if c]
        return sample_json, chunks

    return asyncio.run(grab())


def _run(
    kind: str,
    n: int,
    concurrency: int,
    stream: bool,
    samples: tuple[bytes, list[bytes]],
    rss_every: int = 0,
) -> Result:
    parent, child = multiprocessing.Pipe()
    process = multiprocessing.get_context("fork").Process(
        target=_serve, args=(kind, child, *samples), daemon=True
    )
    process.start()
    try:
        port = parent.recv()
        assert process.pid is not None
        import uvloop

        return uvloop.run(_load(port, process.pid, n, concurrency, stream, rss_every))
    finally:
        process.terminate()
        process.join()


_OTHER_TREE_SERVER = """
import sys
sys.path.insert(0, ".")
from bench import bench_simulator as bench

class Ready:
    def send(self, port):
        print(port, flush=True)

bench._serve("simulator", Ready(), b"", [])
"""


_THIS_TREE = str(Path(__file__).resolve().parents[1])


def _run_other_tree(tree: str, n: int, concurrency: int, stream: bool) -> Result:
    """The simulator of another checkout (``--against``), in its own process."""
    env = {**os.environ, "PYTHONPATH": tree}
    process = subprocess.Popen(  # noqa: S603 - our interpreter, our script, a path the user gave
        [sys.executable, "-c", _OTHER_TREE_SERVER],
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        import uvloop

        return uvloop.run(_load(port, process.pid, n, concurrency, stream))
    finally:
        process.terminate()
        process.wait()


def _ab(args: argparse.Namespace, samples: tuple[bytes, list[bytes]]) -> int:
    """Rounds of baseline, this simulator and ``--against``'s, the two simulators'
    order swapped every round, each in a fresh interpreter; medians and ranges of CPU
    per 1,000 and of the ratios."""
    print(
        f"simulator A/B: {args.rounds} rounds of {args.requests} requests, {args.concurrency} "
        f"concurrent; this tree vs {args.against}; {os.cpu_count()} CPUs"
    )
    for stream in (False, True):
        label = "stream" if stream else "json"
        cpu: dict[str, list[float]] = {"baseline": [], "this": [], "against": []}
        for round_ in range(args.rounds):
            cpu["baseline"].append(
                _run("baseline", args.requests, args.concurrency, stream, samples).cpu_ms_per_1000
            )
            order = ("this", "against") if round_ % 2 == 0 else ("against", "this")
            for name in order:
                # Both simulators in fresh processes: a server forked from this one would
                # carry this process's heap, which every full collection traverses.
                tree = _THIS_TREE if name == "this" else args.against
                result = _run_other_tree(tree, args.requests, args.concurrency, stream)
                cpu[name].append(result.cpu_ms_per_1000)
            print(
                f"  {label} round {round_ + 1}: "
                + ", ".join(f"{k} {v[-1]:.0f} ms/1k" for k, v in cpu.items())
                + f" (load {os.getloadavg()[0]:.1f})"
            )
        for name, values in cpu.items():
            ratios = [v / b for v, b in zip(values, cpu["baseline"], strict=True)]
            print(
                f"{label:<7}{name:<9} CPU ms/1k median {statistics.median(values):.0f} "
                f"({min(values):.0f}-{max(values):.0f}), vs baseline "
                f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
            )
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench simulator")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=2_000)
    parser.add_argument(
        "--rss-curve",
        type=int,
        default=0,
        metavar="N",
        help="instead: N distinct JSON requests to the simulator, printing its RSS every N/20",
    )
    parser.add_argument(
        "--against",
        metavar="TREE",
        help="also run the simulator of another checkout (e.g. main's) in alternating rounds",
    )
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the --against A/B")
    parser.add_argument(
        "--tune-baseline",
        action="store_true",
        help="give the bare server the simulator process's collector settings too",
    )
    parser.add_argument(
        "--log-limit",
        type=int,
        default=100_000,
        help="the simulator's log_limit (default 100,000, as a user's): with --rss-curve, "
        "a smaller one shows memory and CPU past it",
    )
    args = parser.parse_args(argv)
    os.environ[_LOG_LIMIT] = str(args.log_limit)  # read by the forked simulator
    if args.tune_baseline:
        os.environ[_TUNE_BASELINE] = "1"  # read by the forked baseline server
    samples = _samples()
    if args.against:
        return _ab(args, samples)
    if args.rss_curve:
        n = args.rss_curve
        print(f"simulator RSS over {n} distinct JSON requests, {args.concurrency} concurrent")
        result = _run("simulator", n, args.concurrency, False, samples, max(1, n // 20))
        print(f"  {result.rps:.0f} req/s, {result.cpu_ms_per_1000:.0f} ms server CPU per 1,000")
        return 0
    print(
        f"simulator benchmark: {args.requests} requests, {args.concurrency} concurrent, "
        f"{COMPLETION_TOKENS} completion tokens, speed=inf; {os.cpu_count()} CPUs"
    )
    header = ("scenario", "req/s", "server CPU ms/1k", "1-core cap req/s", "vs baseline")
    print(f"{header[0]:<24}{header[1]:>9}{header[2]:>18}{header[3]:>18}{header[4]:>13}")
    for stream in (False, True):
        label = "stream" if stream else "json"
        base = _run("baseline", args.requests, args.concurrency, stream, samples)
        sim = _run("simulator", args.requests, args.concurrency, stream, samples)
        for name, result in ((f"baseline {label}", base), (f"simulator {label}", sim)):
            ratio = result.cpu_ms_per_1000 / base.cpu_ms_per_1000
            print(
                f"{name:<24}{result.rps:>9.0f}{result.cpu_ms_per_1000:>18.0f}"
                f"{1000 / result.cpu_ms_per_1000 * 1000:>18.0f}{ratio:>12.2f}x"
            )
    return 0
