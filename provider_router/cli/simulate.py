"""``provider-router simulate``: run the local OpenRouter until interrupted.

Any OpenAI-compatible client can then use ``http://HOST:PORT/api/v1`` as its base
URL. Without ``--api-key`` any non-empty key is accepted (and it says so).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import signal
import sys
from collections.abc import Callable
from decimal import Decimal
from typing import TextIO

from provider_router._collector import tune_for_process
from provider_router._exceptions import ConfigurationError
from provider_router._format import decimal_str
from provider_router.cli._options import usd
from provider_router.testing.app import ROUTES
from provider_router.testing.server import SimulatorServer

__all__ = ["register", "serve"]


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _routes_epilog() -> str:
    width = max(len(f"{method} {path}") for method, path, _ in ROUTES)
    lines = [f"  {f'{method} {path}':<{width}}  {what}" for method, path, what in ROUTES]
    return "routes served under /api/v1:\n" + "\n".join(lines)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="run the local OpenRouter simulator",
        description="Serve a simulated OpenRouter API on this machine (see docs/simulator.md).",
        epilog=_routes_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--host", default="127.0.0.1", help="address (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port (default: 8080; 0 picks one)")
    parser.add_argument("--market", metavar="FILE", help="market file (JSON or YAML)")
    parser.add_argument("--faults", metavar="FILE", help="fault file (JSON or YAML)")
    parser.add_argument(
        "--credits",
        type=usd,
        default=Decimal(100),
        help="account credits in USD (default: 100)",
    )
    parser.add_argument(
        "--api-key",
        action="append",
        dest="api_keys",
        metavar="KEY",
        help="accept this key (repeatable); without it any non-empty key is accepted",
    )
    parser.add_argument(
        "--speed",
        type=_positive_float,
        default=1.0,
        help="time compression: 1000 runs a 2-minute generation in 120 ms; inf never waits",
    )
    parser.add_argument(
        "--management-key",
        action="append",
        dest="management_keys",
        default=[],
        metavar="KEY",
        help="a management key: may make, disable and delete keys (/keys), not chat (repeatable)",
    )
    parser.add_argument(
        "--key-limit-status",
        type=int,
        choices=(402, 403),
        default=402,
        help="how a key past its limit is refused: 402 as documented (default) or the "
        "field's bare 403 'Key limit exceeded (total limit)'",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.set_defaults(handler=_handle)


def _describe(sim: SimulatorServer, api_keys: list[str] | None) -> str:
    simulator = sim.simulator
    models = ", ".join(sorted({m.id for m in simulator.market.models.values()}))
    speed = "inf (no waiting)" if math.isinf(simulator.speed) else f"{simulator.speed:g}x"
    keys = (
        "accepting ANY non-empty API key (pass --api-key to restrict)"
        if api_keys is None
        else f"accepting {len(api_keys)} API key(s)"
    )
    return (
        f"Local OpenRouter at {sim.url}\n"
        f"  models: {models}\n"
        f"  credits: ${decimal_str(simulator.balance)}  speed: {speed}  seed: {simulator.seed}\n"
        f"  {keys}\n"
        "  Ctrl-C to stop."
    )


async def serve(
    args: argparse.Namespace,
    stop: asyncio.Event,
    *,
    out: TextIO = sys.stdout,
    on_ready: Callable[[SimulatorServer], None] | None = None,
) -> int:
    """Run the simulator described by ``args`` until ``stop`` is set."""
    sim = SimulatorServer(
        args.market,
        args.faults,
        seed=args.seed,
        credits=args.credits,
        api_keys=args.api_keys,
        speed=args.speed,
        host=args.host,
        port=args.port,
        management_keys=args.management_keys,
        key_limit_status=args.key_limit_status,
    )
    try:
        await sim.start()
    except OSError as exc:
        where = f"{args.host}:{args.port}"
        raise ConfigurationError(f"cannot listen on {where}: {exc.strerror}") from None
    try:
        print(_describe(sim, args.api_keys), file=out, flush=True)
        if on_ready is not None:
            on_ready(sim)
        await stop.wait()
    finally:
        await sim.stop()
    return 0


def _handle(args: argparse.Namespace) -> int:
    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):  # Windows
                loop.add_signal_handler(signum, stop.set)
        # This process serves and does nothing else: its collector is ours to set.
        return await serve(args, stop, on_ready=lambda _sim: tune_for_process())

    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return asyncio.run(main())
    return uvloop.run(main())
