"""A real HTTP proxy on loopback for the tests: Debian's tinyproxy, started per test.

Its own log (``LogLevel Connect``) names every request it forwarded and every
``CONNECT`` tunnel it opened: the tests read it to see what went through it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

TINYPROXY = shutil.which("tinyproxy") or "/usr/bin/tinyproxy"
_REQUEST = re.compile(r"Request \(file descriptor \d+\): (\S+ \S+) HTTP/1\.\d")


@dataclass
class Tinyproxy:
    """A running tinyproxy: its port, and what its log says it forwarded."""

    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def requests(self) -> list[str]:
        """``"METHOD target"`` of every request the proxy logged, in order."""
        text = self.log.read_text() if self.log.exists() else ""
        return _REQUEST.findall(text)


StartProxy = Callable[..., Tinyproxy]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def _wait_listening(port: int, process: subprocess.Popen[bytes]) -> None:
    for _ in range(500):  # tinyproxy binds within a few ms; give it 5 s
        if process.poll() is not None:
            raise RuntimeError("tinyproxy exited at start")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.1):
            return
        time.sleep(0.01)
    raise RuntimeError("tinyproxy did not start listening")


@pytest.fixture(name="tinyproxy")
def tinyproxy_fixture(tmp_path: Path) -> Iterator[StartProxy]:
    """``tinyproxy(auth=("user", "password"))``: a started proxy (stopped after the test)."""
    if not Path(TINYPROXY).exists():
        if os.environ.get("PROVIDER_ROUTER_REQUIRE_TINYPROXY"):
            pytest.fail("tinyproxy is required here (.ci/run installs it)")
        pytest.skip("no tinyproxy binary (apt-get install tinyproxy)")
    processes: list[subprocess.Popen[bytes]] = []

    def start(auth: tuple[str, str] | None = None) -> Tinyproxy:
        port = _free_port()
        log = tmp_path / f"tinyproxy-{port}.log"
        lines = [
            f"Port {port}",
            "Listen 127.0.0.1",
            "Timeout 30",
            f'LogFile "{log}"',
            "LogLevel Connect",
            "MaxClients 100",
            "Allow 127.0.0.1",
            "DisableViaHeader Yes",
        ]
        if auth is not None:
            lines.append(f"BasicAuth {auth[0]} {auth[1]}")
        config = tmp_path / f"tinyproxy-{port}.conf"
        config.write_text("\n".join(lines) + "\n")
        process = subprocess.Popen(  # noqa: S603  (a fixed binary, our own config)
            [TINYPROXY, "-d", "-c", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        processes.append(process)
        _wait_listening(port, process)
        return Tinyproxy(port, log)

    yield start
    for process in processes:
        process.terminate()
    for process in processes:
        process.wait(timeout=5)
