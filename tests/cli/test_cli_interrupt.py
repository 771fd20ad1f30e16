"""A Ctrl-C during the command line's start-up prints one line, never a traceback (#21).

8 of 45 interrupts during start-up printed a ``KeyboardInterrupt`` traceback: the
command modules import (most of start-up) before ``main`` caught anything.
"""

from __future__ import annotations

from typing import Any

import pytest

import provider_router.cli as cli


def interrupt(*_: Any, **__: Any) -> Any:
    raise KeyboardInterrupt


@pytest.mark.parametrize("where", ["build_parser", "configure_logging"])
def test_a_ctrl_c_at_start_up_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    monkeypatch.setattr(cli, where, interrupt)
    assert cli.main(["ledger", "show", "nowhere.sqlite"]) == cli.EXIT_INTERRUPTED
    captured = capsys.readouterr()
    assert captured.err == "provider-router: interrupted\n"
    assert captured.out == ""
