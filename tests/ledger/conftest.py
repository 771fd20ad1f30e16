"""Ledger backends for the contract suite, and a private redis-server per session.

The Redis tests start their own ``redis-server`` on a free loopback port. Without
the binary they skip (saying why), except where ``PROVIDER_ROUTER_REQUIRE_REDIS``
is set (CI): there a missing server is a failure.
"""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from provider_router.ledger import Ledger, MemoryLedger, SQLiteLedger

REQUIRE_REDIS_ENV = "PROVIDER_ROUTER_REQUIRE_REDIS"
_names = itertools.count(1)


@dataclass
class RedisServer:
    url: str
    process: subprocess.Popen[str]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _start_redis(binary: str, port: int | None = None, *extra: str) -> RedisServer:
    port = port or _free_port()
    options = extra or ("--appendonly", "no")
    proc = subprocess.Popen(  # noqa: S603 - our own fixed argument list
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:  # ready when it says so: no polling, no sleeps
        seen.append(line)
        if "Ready to accept connections" in line:
            break
    else:
        proc.wait()
        raise RuntimeError("redis-server did not start:\n" + "".join(seen))
    proc.stdout.close()
    return RedisServer(f"redis://127.0.0.1:{port}/0", proc)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    binary = shutil.which("redis-server")
    if binary is None:
        reason = "redis-server not found on PATH (apt-get install redis-server)"
        if os.environ.get(REQUIRE_REDIS_ENV):
            pytest.fail(f"{reason}, and {REQUIRE_REDIS_ENV} is set: Redis tests must run")
        pytest.skip(f"Redis ledger tests skipped: {reason}")
    server = _start_redis(binary)
    try:
        yield server
    finally:
        server.process.terminate()
        server.process.wait(timeout=10)


class RestartableRedis:
    """A private redis-server that a test stops and starts again, keeping its data (AOF)."""

    def __init__(self, binary: str, directory: Path) -> None:
        self.binary = binary
        self.directory = directory
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.server: RedisServer | None = None

    def start(self) -> None:
        assert self.server is None
        self.server = _start_redis(
            self.binary,
            self.port,
            *("--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.directory)),
        )

    def stop(self) -> None:
        """Shut down (SIGTERM: Redis syncs its AOF); connections are refused until start()."""
        assert self.server is not None
        self.server.process.terminate()
        self.server.process.wait(timeout=30)
        self.server = None


@pytest.fixture
def restartable_redis(tmp_path: Path) -> Iterator[RestartableRedis]:
    binary = shutil.which("redis-server")
    if binary is None:
        reason = "redis-server not found on PATH (apt-get install redis-server)"
        if os.environ.get(REQUIRE_REDIS_ENV):
            pytest.fail(f"{reason}, and {REQUIRE_REDIS_ENV} is set: Redis tests must run")
        pytest.skip(f"Redis outage tests skipped: {reason}")
    directory = tmp_path / "redis-data"
    directory.mkdir()
    redis = RestartableRedis(binary, directory)
    redis.start()
    try:
        yield redis
    finally:
        if redis.server is not None:
            redis.stop()


@dataclass
class Backend:
    """Makes ledgers of one kind; ``reopen`` opens another view of the same store."""

    name: str
    persistent: bool
    _make: Callable[..., Ledger]
    _opened: list[Ledger] = field(default_factory=list)

    def make(self, limit: Decimal | None, **kwargs: Any) -> Ledger:
        ledger = self._make(limit, **kwargs)
        self._opened.append(ledger)
        return ledger


def _backend(name: str, tmp: Path, redis_url: str | None) -> Backend:
    if name == "memory":
        return Backend(name, False, lambda limit, **kw: MemoryLedger(limit, **kw))
    if name.startswith("sqlite"):
        path = tmp / f"ledger-{next(_names)}.sqlite"
        executor = "loop" if name == "sqlite-loop" else "thread"
        return Backend(
            name,
            True,
            lambda limit, **kw: SQLiteLedger(path, limit, executor=executor, **kw),
        )
    from provider_router.ledger import RedisLedger

    assert redis_url is not None
    ledger_name = f"test-{os.getpid()}-{next(_names)}"
    return Backend(name, True, lambda limit, **kw: RedisLedger(redis_url, ledger_name, limit, **kw))


PERSISTENT = ["sqlite", "sqlite-loop", pytest.param("redis", marks=pytest.mark.redis)]
BACKENDS = ["memory", *PERSISTENT]


@pytest.fixture(params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def redis_url(request: pytest.FixtureRequest, backend_name: str) -> str | None:
    if backend_name != "redis":
        return None
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url


@pytest.fixture
async def backend(
    backend_name: str, tmp_path: Path, redis_url: str | None
) -> AsyncIterator[Backend]:
    made = _backend(backend_name, tmp_path, redis_url)
    yield made
    for ledger in made._opened:
        await ledger.close()


@pytest.fixture
def backend_factory(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, backend_name: str
) -> Callable[[], Backend]:
    """A fresh backend per call (for Hypothesis examples, which each need their own store)."""
    url = None
    if backend_name == "redis":
        url = request.getfixturevalue("redis_server").url
    tmp = tmp_path_factory.mktemp("ledgers")
    return lambda: _backend(backend_name, tmp, url)
