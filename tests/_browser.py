"""Headless Chromium, driven over the DevTools protocol (a websocket: aiohttp's client).

Opens a page as a person's browser would, and reports what a person would notice:
console errors and uncaught exceptions, and what each chart drew. Chromium is
the Debian package ``chromium`` (.ci/run installs it); without it these tests
skip, except where ``PROVIDER_ROUTER_REQUIRE_CHROMIUM`` is set (CI).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

REQUIRE_CHROMIUM_ENV = "PROVIDER_ROUTER_REQUIRE_CHROMIUM"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
)
_STARTUP_SECONDS = 60.0
_CALL_SECONDS = 60.0


def chromium_binary() -> str:
    """The Chromium binary, or skip (fail under ``PROVIDER_ROUTER_REQUIRE_CHROMIUM``)."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    reason = "chromium not found on PATH (apt-get install chromium)"
    if os.environ.get(REQUIRE_CHROMIUM_ENV):
        pytest.fail(f"{reason}, and {REQUIRE_CHROMIUM_ENV} is set: browser tests must run")
    pytest.skip(f"browser tests skipped: {reason}")


@dataclass
class PageView:
    """What loading a page showed: errors, the charts' drawings, a screenshot, its text."""

    errors: list[str] = field(default_factory=list)
    charts: list[dict[str, Any]] = field(default_factory=list)
    screenshot: bytes = b""
    text: str = ""
    """The page's text as laid out (``innerText``): what a reader sees."""


class _Session:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self.ids)
        await self.ws.send_json({"id": call_id, "method": method, "params": params})
        async with asyncio.timeout(_CALL_SECONDS):
            async for message in self.ws:
                data = json.loads(message.data)
                if data.get("id") == call_id:
                    if "error" in data:
                        raise AssertionError(f"{method}: {data['error']}")
                    return dict(data.get("result", {}))
                self.events.append(data)
        raise AssertionError(f"{method}: the browser closed the connection")

    async def wait_for(self, method: str) -> None:
        if any(e.get("method") == method for e in self.events):
            return
        async with asyncio.timeout(_CALL_SECONDS):
            async for message in self.ws:
                data = json.loads(message.data)
                self.events.append(data)
                if data.get("method") == method:
                    return


@contextlib.asynccontextmanager
async def _browser() -> AsyncIterator[str]:
    """Start Chromium with a fresh profile; yields its DevTools HTTP base URL."""
    binary = chromium_binary()
    # Chromium's helper processes may still write to the profile after the browser
    # exits: a leftover file there is no failure of the page under test.
    with tempfile.TemporaryDirectory(prefix="pr-chromium-", ignore_cleanup_errors=True) as profile:
        process = await asyncio.create_subprocess_exec(
            binary,
            *FLAGS,
            f"--user-data-dir={profile}",
            "about:blank",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            loop = asyncio.get_running_loop()
            deadline = loop.time() + _STARTUP_SECONDS
            while not (text := await asyncio.to_thread(_read, port_file)):
                if process.returncode is not None or loop.time() > deadline:
                    raise AssertionError("chromium did not start its DevTools endpoint")
                await asyncio.sleep(0.05)
            yield f"http://127.0.0.1:{text.split()[0]}"
        finally:
            if process.returncode is None:
                process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


_CHARTS_JS = """
JSON.stringify([...document.querySelectorAll('svg.chart')].map(svg => {
  const plot = svg.querySelector('g.plot');
  const box = plot ? plot.getBBox() : {width: 0, height: 0};
  return {name: svg.dataset.chart, width: box.width, height: box.height,
          shapes: plot ? plot.querySelectorAll('rect,polyline,circle,path,line').length : 0,
          shown: svg.getBoundingClientRect().width};
}))
"""


async def view_page(url: str, *, width: int = 1340, height: int = 1900) -> PageView:
    """Load ``url`` (say ``Path.as_uri()``) in headless Chromium and look at it."""
    async with _browser() as base, aiohttp.ClientSession() as http:
        async with http.get(f"{base}/json/list") as response:
            targets = await response.json()
        page = next(t for t in targets if t.get("type") == "page")
        async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            session = _Session(ws)
            for domain in ("Runtime", "Log", "Page"):
                await session.call(f"{domain}.enable")
            await session.call(
                "Emulation.setDeviceMetricsOverride",
                width=width,
                height=height,
                deviceScaleFactor=1,
                mobile=False,
            )
            await session.call("Page.navigate", url=url)
            await session.wait_for("Page.loadEventFired")
            result = await session.call("Runtime.evaluate", expression=_CHARTS_JS)
            text = await session.call("Runtime.evaluate", expression="document.body.innerText")
            shot = await session.call("Page.captureScreenshot", format="png")
            view = PageView(
                charts=json.loads(result["result"]["value"]),
                screenshot=base64.b64decode(shot["data"]),
                text=str(text["result"].get("value", "")),
            )
            for event in session.events:
                method, params = event.get("method"), event.get("params", {})
                if method == "Runtime.exceptionThrown":
                    view.errors.append(json.dumps(params.get("exceptionDetails", {}))[:500])
                elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
                    view.errors.append(json.dumps(params.get("args", []))[:500])
                elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                    view.errors.append(str(params["entry"].get("text"))[:500])
            return view
