"""A command run in a real terminal (tmux), and the screen a person would read.

tmux gives the command a pseudo-terminal of the given width, as a person's terminal
does: the command sees a terminal (colour, boxes, its width from the terminal), and
what it prints wider than the screen wraps there. :func:`in_terminal` returns the
screen twice: as shown (a wrapped line is several screen lines) and with wrapped lines
joined (each printed line once), so a test can tell a line that fits from one the
terminal had to wrap. tmux is the Debian package ``tmux`` (.ci/run installs it);
without it these tests skip, except where ``PROVIDER_ROUTER_REQUIRE_TMUX`` is set (CI).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

REQUIRE_TMUX_ENV = "PROVIDER_ROUTER_REQUIRE_TMUX"
_SECONDS = 120.0


@dataclass(frozen=True)
class Screen:
    """What the terminal showed: ``lines`` as on screen, ``printed`` with wrapped lines
    joined (one entry per line the command printed)."""

    lines: list[str]
    printed: list[str]


def tmux_binary() -> str:
    """The tmux binary, or skip (fail under ``PROVIDER_ROUTER_REQUIRE_TMUX``)."""
    found = shutil.which("tmux")
    if found:
        return found
    reason = "tmux not found on PATH (apt-get install tmux)"
    if os.environ.get(REQUIRE_TMUX_ENV):
        pytest.fail(f"{reason}, and {REQUIRE_TMUX_ENV} is set: terminal tests must run")
    pytest.skip(f"terminal tests skipped: {reason}")


def in_terminal(
    argv: Sequence[str], *, columns: int, env: Mapping[str, str] | None = None, rows: int = 300
) -> Screen:
    """Run ``argv`` in a terminal ``columns`` wide and return its screen once it exits.

    Blocking (it waits for the command): call it through ``asyncio.to_thread`` from a
    test whose event loop serves the command (a simulator).
    """
    tmux = tmux_binary()
    server = f"provider-router-test-{uuid.uuid4().hex[:12]}"
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "tmux.conf"
        # The pane stays after the command exits, so its screen can be read.
        conf.write_text(f"set -g remain-on-exit on\nset -g history-limit {rows * 10}\n")
        signal = shlex.join([tmux, "-L", server, "wait-for", "-S", "done"])
        command = f"{shlex.join(argv)}; {signal}"
        environ = {**os.environ, **(env or {}), "SHELL": "/bin/sh"}
        environ.pop("TMUX", None)
        environ.pop("COLUMNS", None)  # the terminal says how wide it is

        def tmux_(*args: str) -> str:
            done = subprocess.run(  # noqa: S603 - the tmux binary, our own arguments
                [tmux, "-L", server, *args],
                env=environ, check=True, capture_output=True, text=True, timeout=_SECONDS,
            )  # fmt: skip
            return done.stdout

        tmux_("-f", str(conf), "new-session", "-d", "-x", str(columns), "-y", str(rows),
              "-s", "t", command)  # fmt: skip
        try:
            tmux_("wait-for", "done")
            capture = ("capture-pane", "-p", "-t", "t", "-S", "-", "-E", "-")
            shown, joined = tmux_(*capture), tmux_(*capture, "-J")
        finally:
            with contextlib.suppress(subprocess.SubprocessError):
                tmux_("kill-server")
    return Screen(_content(shown), _content(joined))


def _content(screen: str) -> list[str]:
    lines = [line.rstrip() for line in screen.splitlines()]
    lines = [line for line in lines if not line.startswith("Pane is dead")]
    while lines and not lines[-1]:
        lines.pop()
    return lines
