"""The library is silent until the application configures logging; then every event arrives.

Events go through stdlib logging (``provider_router/_log.py``): a process that
configures nothing sees nothing on stdout or stderr, one that attaches a handler
sees each event with its name and fields.
"""

from __future__ import annotations

import ast
import json
import logging
import subprocess
import sys
import textwrap
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import structlog

import provider_router
from provider_router import MemoryLedger, ProviderPolicy, Router
from provider_router._log import ROOT_LOGGER, EventLogger, get_logger
from provider_router.cli._logging import configure_logging
from provider_router.testing import SimulatorServer
from provider_router.testing.server import DEFAULT_TEST_KEY

KIMI = "moonshotai/kimi-k2.5"
MESSAGES = [{"role": "user", "content": "Say hello."}]

_UNCONFIGURED_RUN = textwrap.dedent(
    """
    import asyncio, math
    from decimal import Decimal
    import provider_router as pr
    from provider_router.testing import SimulatorServer
    from provider_router.testing.server import DEFAULT_TEST_KEY

    async def main():
        async with SimulatorServer(api_keys=[DEFAULT_TEST_KEY], speed=math.inf) as sim:
            sim.add_fault({"kind": "rate_limit", "times": 1, "no_fallback": True})
            async with pr.Router(
                "moonshotai/kimi-k2.5", base_url=sim.url, api_key=DEFAULT_TEST_KEY,
                ledger=pr.MemoryLedger(Decimal(1)), policy=pr.ProviderPolicy(exclude_below="int4"),
                sleep=lambda s: asyncio.sleep(0),
            ) as router:
                await router.chat([{"role": "user", "content": "hi"}], max_tokens=20)
                try:  # a refused request logs route.failed at warning
                    await router.chat([{"role": "user", "content": "hi"}], max_tokens=20,
                                      model="x")
                except Exception:
                    pass
                try:  # refused by the budget
                    await router.chat([{"role": "user", "content": "hi"}], max_tokens=10**9)
                except pr.BudgetExhausted:
                    pass
                assert router.requests == 1 and router.failures == 1

    asyncio.run(main())
    raise SystemExit(7)  # proof that the whole script ran
    """
)


def test_unconfigured_library_prints_nothing() -> None:
    # A fresh interpreter: pytest itself configures logging in this one.
    done = subprocess.run(  # noqa: S603 - our own fixed script
        [sys.executable, "-c", _UNCONFIGURED_RUN], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 7, done.stderr
    assert done.stdout == ""
    assert done.stderr == ""


async def _one_request(sim: SimulatorServer, **kwargs: Any) -> None:
    async with Router(
        KIMI,
        base_url=sim.url,
        api_key=DEFAULT_TEST_KEY,
        ledger=MemoryLedger(Decimal(1)),
        policy=ProviderPolicy(exclude_below="int4"),
        **kwargs,
    ) as router:
        await router.chat(MESSAGES, max_tokens=20, key="prompt-1")


async def test_events_reach_a_stdlib_handler_with_name_and_fields(
    openrouter_sim: SimulatorServer, log_events: list[dict[str, Any]]
) -> None:
    await _one_request(openrouter_sim)
    done = [e for e in log_events if e["event"] == "route.done"]
    assert len(done) == 1
    assert done[0]["logger"] == "provider_router.client.router"
    assert done[0]["log_level"] == "debug"
    assert done[0]["key"] == "prompt-1"
    assert done[0]["model"] == KIMI
    assert Decimal(done[0]["cost"]) > 0
    assert any(e["event"] == "route.plan" for e in log_events)


async def test_per_request_events_build_nothing_below_their_level(
    openrouter_sim: SimulatorServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One attempt and the answer it ends with log through the router's logger.
    import provider_router.client._attempt as client_module

    calls: list[str] = []

    class Recording(EventLogger):
        __slots__ = ()

        def debug(self, event: str, **fields: Any) -> None:
            calls.append(event)
            super().debug(event, **fields)

    recording = Recording(logging.getLogger("provider_router.client.router"))
    monkeypatch.setattr(client_module, "log", recording)
    root = logging.getLogger(ROOT_LOGGER)
    root.setLevel(logging.INFO)  # the autouse fixture restores it
    openrouter_sim.add_fault({"kind": "rate_limit", "times": 1, "no_fallback": True})
    await _one_request(openrouter_sim, sleep=_no_sleep)
    assert calls == []  # neither route.attempt nor route.done was even called
    root.setLevel(logging.DEBUG)
    openrouter_sim.add_fault({"kind": "rate_limit", "times": 1, "no_fallback": True})
    await _one_request(openrouter_sim, sleep=_no_sleep)
    assert calls == ["route.attempt", "route.done"]


async def _no_sleep(_: float) -> None:
    return None


def test_cli_renders_library_events_with_their_fields(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging(level="info", fmt="json")
    configure_logging(level="debug", fmt="json")  # again: replaces, never duplicates
    get_logger("provider_router.client.router").debug("route.done", key="p-1", cost="0.01")
    get_logger("provider_router.ledger").info("ledger.set_limit", limit="5")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [line["event"] for line in lines] == ["route.done", "ledger.set_limit"]
    assert lines[0]["key"] == "p-1"
    assert lines[0]["cost"] == "0.01"
    assert lines[0]["level"] == "debug"
    assert capsys.readouterr().out == ""


_LEVEL_METHODS = {"debug", "info", "warning", "error", "exception", "critical"}
_RECORD_ATTRIBUTES = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


def test_no_event_field_collides_with_a_log_record_attribute() -> None:
    # A field named like a LogRecord attribute ("name", "module"...) makes stdlib
    # raise KeyError, but only once that level is enabled: check every call site.
    bad = []
    package = Path(provider_router.__file__).parent
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _LEVEL_METHODS
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "log"
            ):
                bad += [
                    f"{path.name}:{node.lineno} {kw.arg}"
                    for kw in node.keywords
                    if kw.arg in _RECORD_ATTRIBUTES
                ]
    assert bad == []


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _RECORD_ATTRIBUTES}


@pytest.mark.parametrize("level", ["debug", "info", "warning", "error"])
def test_records_match_structlog_render_to_log_kwargs(level: str) -> None:
    # The same record as structlog.wrap_logger(..., [filter_by_level, render_to_log_kwargs]).
    stdlib = logging.getLogger("provider_router.tests.equivalence")
    handler = _Records()
    stdlib.addHandler(handler)
    stdlib.setLevel(logging.INFO)
    try:
        ours = get_logger(stdlib.name).bind(run="r-1")
        theirs = structlog.wrap_logger(
            stdlib,
            processors=[structlog.stdlib.filter_by_level, structlog.stdlib.render_to_log_kwargs],
            wrapper_class=structlog.stdlib.BoundLogger,
        ).bind(run="r-1")
        for logger in (ours, theirs):
            try:
                raise ValueError("boom")
            except ValueError:
                getattr(logger, level)("ledger.thing", key="k", units=3, exc_info=True)
    finally:
        stdlib.removeHandler(handler)
        stdlib.setLevel(logging.NOTSET)
    if level == "debug":
        assert handler.records == []  # below the level: no record from either
        return
    mine, reference = handler.records
    assert mine.getMessage() == reference.getMessage() == "ledger.thing"
    assert mine.levelno == reference.levelno
    assert _fields(mine) == _fields(reference) == {"run": "r-1", "key": "k", "units": 3}
    assert mine.exc_info is not None
    assert reference.exc_info is not None
    assert mine.exc_info[0] is reference.exc_info[0] is ValueError
    assert mine.funcName == "test_records_match_structlog_render_to_log_kwargs"
