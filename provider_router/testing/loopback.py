"""Loopback stand-ins for the network's hard cases, for tests and benchmarks of the wire.

Nothing here leaves the machine: a self-signed certificate for a TLS server on
127.0.0.1, a keep-alive server that answers every request with one body, and an
address that blackholes connections (a route that drops packets, on loopback).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import subprocess
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

__all__ = ["answer_every_request", "blackhole", "self_signed_certificate", "tls_contexts"]

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Coroutine[Any, Any, None]]


def self_signed_certificate(where: Path, openssl: str = "openssl") -> Path:
    """A certificate for ``localhost`` and ``127.0.0.1`` (``cert.pem``, ``key.pem`` beside it)
    written into ``where`` by the ``openssl`` command line."""
    subprocess.run(  # noqa: S603 - fixed arguments, the openssl the caller names
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout",
            str(where / "key.pem"),
            "-out",
            str(where / "cert.pem"),
        ],
        check=True,
        capture_output=True,
    )
    return where / "cert.pem"


def tls_contexts(certificate: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context serving ``certificate``, and a client one trusting it alone."""
    served = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    served.load_cert_chain(certificate, certificate.with_name("key.pem"))
    return served, ssl.create_default_context(cafile=certificate)


def answer_every_request(body: bytes) -> Handler:
    """An ``asyncio.start_server`` handler: every request on a keep-alive connection is
    answered ``200`` with ``body`` (JSON)."""
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
    )

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.lower().split(b"\r\n"):
                    if line.startswith(b"content-length:"):
                        length = int(line[15:])
                await reader.readexactly(length)
                writer.write(answer)
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    return handle


@contextlib.contextmanager
def blackhole() -> Iterator[int]:
    """The port on 127.0.0.1 of a listener that never answers another SYN.

    Its accept queue is full: Linux drops a SYN it cannot queue
    (``tcp_abort_on_overflow`` is 0 by default), so a connect to it neither succeeds
    nor fails until the client gives up, as through a route that blackholes packets.
    """
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
