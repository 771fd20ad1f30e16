"""A loopback address that drops SYNs, as a route that blackholes packets does.

A listening socket whose accept queue is full: Linux drops a SYN it cannot queue
(``tcp_abort_on_overflow`` is 0 by default), so a connect to it neither succeeds
nor fails until the client gives up. Nothing leaves the machine.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def blackhole() -> Iterator[int]:
    """The port on 127.0.0.1 of a listener that never answers another SYN."""
    with contextlib.ExitStack() as stack:
        listener = stack.enter_context(socket.socket())
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port: int = listener.getsockname()[1]
        for _ in range(3):  # fill the accept queue (and the SYN queue behind it)
            filler = stack.enter_context(socket.socket())
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
        yield port


@pytest.fixture(name="blackhole_port")
def blackhole_fixture() -> Iterator[int]:
    with blackhole() as port:
        yield port
