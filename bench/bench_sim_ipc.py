"""What a shared bill across simulator workers would cost: ``python -m bench sim_ipc``.

``--workers N`` on one port would need one owner of the account, the holds, the
key usage and the ``/generation`` records, asked by every worker at admission and
again at settlement (docs/simulator.md, "More than one core"). This measures that
round trip: an owner process answering small JSON messages over a Unix socket, one
worker keeping ``--in-flight`` of them outstanding (uvloop on both ends), and the
CPU each side spends per round trip (from /proc), against which the simulator's
~0.15 ms of CPU per request compares.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import tempfile
import time
from typing import Any

_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _owner(path: str, ready: Any) -> None:
    import uvloop

    held = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal held
        while line := await reader.readline():
            message = json.loads(line)
            held += message["units"]
            answer = {"id": message["id"], "ok": True, "held": held}
            writer.write(json.dumps(answer).encode() + b"\n")

    async def main() -> None:
        await asyncio.start_unix_server(handle, path)
        ready.send(os.getpid())
        await asyncio.Event().wait()

    uvloop.run(main())


async def _worker(path: str, n: int, in_flight: int, owner_pid: int) -> tuple[float, float, float]:
    reader, writer = await asyncio.open_unix_connection(path)

    def send(i: int) -> None:
        message = {"id": i, "op": "hold", "key": "key-0123456789", "units": 123_456_789}
        writer.write(json.dumps(message).encode() + b"\n")

    cpu0, owner0, t0 = time.process_time(), _cpu_seconds(owner_pid), time.perf_counter()
    sent = min(in_flight, n)
    for i in range(sent):
        send(i)
    for _ in range(n):
        json.loads(await reader.readline())
        if sent < n:
            send(sent)
            sent += 1
    seconds = time.perf_counter() - t0
    writer.close()
    return time.process_time() - cpu0, _cpu_seconds(owner_pid) - owner0, seconds


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench sim_ipc")
    parser.add_argument("--round-trips", type=int, default=50_000)
    parser.add_argument("--in-flight", type=int, default=2_000)
    args = parser.parse_args(argv)
    import uvloop

    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "owner.sock")
        parent, child = multiprocessing.Pipe()
        process = multiprocessing.get_context("fork").Process(
            target=_owner, args=(path, child), daemon=True
        )
        process.start()
        try:
            owner_pid = parent.recv()
            worker, owner, seconds = uvloop.run(
                _worker(path, args.round_trips, args.in_flight, owner_pid)
            )
        finally:
            process.terminate()
            process.join()
    n = args.round_trips
    print(
        f"{n} round trips, {args.in_flight} in flight: worker CPU {worker / n * 1e6:.1f} µs, "
        f"owner CPU {owner / n * 1e6:.1f} µs per round trip; {n / seconds:,.0f} round trips/s"
    )
    return 0
