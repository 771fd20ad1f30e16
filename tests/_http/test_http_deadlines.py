"""POST deadlines kept by one timer per client (``_http/deadlines.py``), over real sockets.

aiohttp's per-request ``total`` timeout (a timer per request) was replaced by a
FIFO per timeout value and one loop timer per ``HttpClient`` (``_http/deadlines.py``
says why). These tests hold the new way to
the old one: the same exception, message and ``request_sent`` as aiohttp's own
total timeout mapped as ``_http`` mapped it before (``reference`` below is the
old code path), for answers that never come, bodies that stall or trickle after
the headers, streams, error statuses; cancellation as ``asyncio.timeout`` does
it; and nothing left registered, no timer left armed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from _raw_http import head, serve_fixture, whole  # noqa: F401  (the serve fixture)

from provider_router import APIConnectionError, APIError, RequestTimeout
from provider_router._constants import DEFAULT_CONNECT_TIMEOUT
from provider_router._http.deadlines import GRANULARITY, Deadlines
from provider_router._http.session import (
    HttpClient,
    connection_error,
    error_from_response,
    never_sent,
)
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

KIMI = "moonshotai/kimi-k2.5"
CHAT = "/chat/completions"
BODY = {"model": KIMI, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
PAYLOAD = json.dumps(BODY).encode()
STREAM_PAYLOAD = json.dumps({**BODY, "stream": True, "max_tokens": 2000}).encode()

Outcome = tuple[str, str, bool | None]
Serve = Callable[[Callable[[int], Any]], Awaitable[Any]]


def outcome_of(exc: BaseException) -> Outcome:
    return type(exc).__name__, str(exc), getattr(exc, "request_sent", None)


async def reference(
    base_url: str,
    payload: bytes,
    seconds: float,
    *,
    stream: bool = False,
    idle: float | None = None,
    key: str | None = DEFAULT_TEST_KEY,
    between: Callable[[], Awaitable[None]] | None = None,
) -> Outcome | Any:
    """The old path: aiohttp's ``total`` timeout, errors mapped as ``_http`` mapped them."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    url = f"{base_url}{CHAT}"
    what = f"POST {url}"
    limits = aiohttp.ClientTimeout(total=seconds, connect=DEFAULT_CONNECT_TIMEOUT, sock_read=idle)
    async with aiohttp.ClientSession(headers=headers) as session:
        try:
            try:
                response = await session.post(
                    url, data=payload, timeout=limits, headers={"Content-Type": "application/json"}
                )
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise connection_error(
                    exc, what=what, timeout=seconds, sent=not never_sent(exc)
                ) from exc
            if not 200 <= response.status < 300:
                try:
                    body = await response.read()
                except (TimeoutError, aiohttp.ClientError):
                    body = b""
                finally:
                    response.release()
                raise error_from_response(response.status, response.headers, body, what=what)
            try:
                if not stream:
                    if between is not None:
                        await between()
                    return json.loads(await response.read())
                events = 0
                async for _ in response.content.iter_any():
                    events += 1
                    if between is not None:
                        await between()
                return events
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise connection_error(exc, what=what, timeout=seconds) from exc
            finally:
                response.close()
        except APIError as exc:
            return outcome_of(exc)


async def ours(
    http: HttpClient,
    payload: bytes,
    seconds: float,
    *,
    stream: bool = False,
    idle: float | None = None,
    between: Callable[[], Awaitable[None]] | None = None,
) -> Outcome | Any:
    """The same exchange through ``HttpClient`` (its deadlines)."""
    try:
        if not stream:
            response = await http.send(CHAT, payload, request_timeout=seconds)
            try:
                if between is not None:
                    await between()
                return await response.json()
            finally:
                response.close()
        events = 0
        post = http.post(CHAT, payload, request_timeout=seconds, idle_timeout=idle)
        async with post as answer:
            async for _ in answer.events():
                events += 1
                if between is not None:
                    await between()
        return events
    except APIError as exc:
        return outcome_of(exc)
    finally:
        assert len(http._deadlines) == 0  # nothing left registered, whatever the end


@pytest.fixture
async def hanging(openrouter_sim: SimulatorServer) -> SimulatorServer:
    """A local OpenRouter that accepts every request and never answers (no headers)."""
    openrouter_sim.add_fault({"kind": "hang", "no_fallback": True})
    return openrouter_sim


def stalled_after(first: bytes, *, length: int = 1000) -> Callable[[int], Any]:
    """Headers and ``first`` of a ``length``-byte body, then silence (the connection open)."""

    def answer(_: int) -> Any:
        async def write(writer: asyncio.StreamWriter) -> None:
            writer.write(head(length) + first)
            await writer.drain()
            await writer.wait_closed()  # silent until the client leaves

        return write

    return answer


def trickled(*, interval: float = 0.02, length: int = 100_000) -> Callable[[int], Any]:
    """Headers, then one byte of a long body every ``interval`` seconds: never silent
    long enough for a read timeout, never whole within the deadline."""

    def answer(_: int) -> Any:
        async def write(writer: asyncio.StreamWriter) -> None:
            writer.write(head(length))
            for _ in range(length):
                writer.write(b" ")
                await writer.drain()
                await asyncio.sleep(interval)  # the peer's pace, not the test waiting

        return write

    return answer


async def test_no_headers_in_time_is_the_same_timeout_as_before(hanging: SimulatorServer) -> None:
    async with HttpClient(hanging.url, DEFAULT_TEST_KEY) as http:
        new = await ours(http, PAYLOAD, 0.1)
        streamed = await ours(http, STREAM_PAYLOAD, 0.1, stream=True, idle=5)
    old = await reference(hanging.url, PAYLOAD, 0.1)
    old_streamed = await reference(hanging.url, STREAM_PAYLOAD, 0.1, stream=True, idle=5)
    assert (
        new
        == old
        == ("RequestTimeout", f"POST {hanging.url}{CHAT}: no complete answer within 0.1 s", True)
    )
    assert streamed == old_streamed == new  # may have reached OpenRouter: never "never sent"


@pytest.mark.parametrize(
    "answer",
    [stalled_after(b"  "), stalled_after(b""), trickled()],
    ids=["stalled-body", "stalled-before-body", "trickling-body"],
)
async def test_a_body_that_stalls_or_trickles_after_the_headers_ends_at_the_deadline(
    serve: Serve, answer: Callable[[int], Any]
) -> None:
    raw = await serve(answer)
    async with HttpClient(raw.url) as http:
        loop = asyncio.get_running_loop()
        started = loop.time()
        new = await ours(http, PAYLOAD, 0.15)
        ended = loop.time()
    old = await reference(raw.url, PAYLOAD, 0.15, key=None)
    assert (
        new
        == old
        == ("RequestTimeout", f"POST {raw.url}{CHAT}: no complete answer within 0.15 s", True)
    )
    assert ended >= started + 0.15  # never early


async def test_a_whole_answer_is_the_same_value(serve: Serve) -> None:
    body = b'{"id":"gen-1","choices":[],"usage":{"cost":0.5}}'
    raw = await serve(whole(body))
    async with HttpClient(raw.url) as http:
        new = await ours(http, PAYLOAD, 5)
    assert new == {"id": "gen-1", "choices": [], "usage": {"cost": 0.5}}
    assert str(new["usage"]["cost"]) == "0.5"  # the wire's digits (a Decimal)
    assert await reference(raw.url, PAYLOAD, 5, key=None) == new


async def test_an_error_status_whose_body_stalls_is_the_same_error(serve: Serve) -> None:
    def answer(_: int) -> Any:
        async def write(writer: asyncio.StreamWriter) -> None:
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 50\r\n\r\n{")
            await writer.drain()
            await writer.wait_closed()  # silent until the client leaves

        return write

    raw = await serve(answer)
    async with HttpClient(raw.url) as http:
        new = await ours(http, PAYLOAD, 0.1)
    old = await reference(raw.url, PAYLOAD, 0.1, key=None)
    assert new == old
    assert new[0] == "ProviderUnavailableError"


async def test_a_refused_connection_is_still_never_sent(unused_tcp_port: int) -> None:
    url = f"http://127.0.0.1:{unused_tcp_port}"
    async with HttpClient(url) as http:
        new = await ours(http, PAYLOAD, 5)
    assert new == await reference(url, PAYLOAD, 5, key=None)
    assert new[0] == "APIConnectionError"
    assert new[2] is False  # provably free


async def test_a_stream_that_trickles_past_its_deadline_is_the_same_timeout(
    openrouter_sim_factory: Any,
) -> None:
    # 2,000 tokens at speed 20 take ~2 s: events keep coming when the 0.3 s deadline passes.
    sim = await openrouter_sim_factory(speed=20, completion_tokens=2000)
    async with HttpClient(sim.url, DEFAULT_TEST_KEY) as http:
        new = await ours(http, STREAM_PAYLOAD, 0.3, stream=True, idle=5)
    old = await reference(sim.url, STREAM_PAYLOAD, 0.3, stream=True, idle=5)
    assert (
        new
        == old
        == ("RequestTimeout", f"POST {sim.url}{CHAT}: no complete answer within 0.3 s", True)
    )


async def test_a_stream_silent_for_its_idle_timeout_is_the_same_timeout(serve: Serve) -> None:
    raw = await serve(stalled_after(b"data: {}\n\n"))
    async with HttpClient(raw.url) as http:
        new = await ours(http, STREAM_PAYLOAD, 30, stream=True, idle=0.1)
    old = await reference(raw.url, STREAM_PAYLOAD, 30, stream=True, idle=0.1, key=None)
    assert (
        new
        == old
        == ("RequestTimeout", f"POST {raw.url}{CHAT}: no complete answer within 30 s", True)
    )


async def test_a_deadline_passing_in_the_callers_own_code_never_cancels_it(serve: Serve) -> None:
    """As aiohttp's timer does: the caller's await between two reads runs to its end
    (a ledger write is never cut); the next read then raises the timeout at once."""
    raw = await serve(stalled_after(b"data: {}\n\n"))
    loop = asyncio.get_running_loop()
    finished: list[bool] = []

    async def past_the_deadline() -> None:
        done = asyncio.Event()
        loop.call_later(0.25, done.set)  # the deadline (0.1 s) passes meanwhile
        await done.wait()
        finished.append(True)

    async with HttpClient(raw.url) as http:
        new = await ours(http, STREAM_PAYLOAD, 0.1, stream=True, between=past_the_deadline)
    assert finished == [True]
    old = await reference(
        raw.url, STREAM_PAYLOAD, 0.1, stream=True, key=None, between=past_the_deadline
    )
    assert finished == [True, True]
    assert (
        new
        == old
        == ("RequestTimeout", f"POST {raw.url}{CHAT}: no complete answer within 0.1 s", True)
    )


BODY_BYTES = b'{"id":"gen-1","choices":[],"usage":{"cost":0.25}}'


def whole_after(go: asyncio.Event) -> Callable[[int], Any]:
    """Headers and the body's first byte, the rest once ``go`` is set."""

    def answer(_: int) -> Any:
        async def write(writer: asyncio.StreamWriter) -> None:
            writer.write(head(len(BODY_BYTES)) + BODY_BYTES[:1])
            await writer.drain()
            await go.wait()
            writer.write(BODY_BYTES[1:])
            await writer.drain()
            await writer.wait_closed()

        return write

    return answer


def _after(seconds: float) -> Callable[[], Awaitable[None]]:
    async def wait() -> None:  # the caller's own code, outlasting the deadline
        done = asyncio.Event()
        asyncio.get_running_loop().call_later(seconds, done.set)
        await done.wait()

    return wait


@pytest.mark.parametrize(
    "case",
    ["whole-with-headers", "completed-before-deadline", "stalled", "whole-after-deadline"],
)
async def test_a_body_read_after_the_deadline_passed_in_the_callers_code(
    serve: Serve, case: str
) -> None:
    """Headers in time, the body read only once the deadline has passed (the router
    was writing to its ledger): a body that was whole before the deadline is the
    answer (aiohttp stops its timer at the body's end); one that was not is the
    timeout, even if it is whole by the time it is read."""
    go = asyncio.Event()
    answer = {
        "whole-with-headers": whole(BODY_BYTES),
        "completed-before-deadline": whole_after(go),
        "stalled": stalled_after(b"{", length=len(BODY_BYTES)),
        "whole-after-deadline": whole_after(go),
    }[case]
    raw = await serve(answer)

    async def between() -> None:
        if case == "completed-before-deadline":
            go.set()  # the rest of the body arrives at once, well before the deadline
        await _after(0.15)()  # the 0.05 s deadline passes meanwhile
        go.set()  # the rest of the body arrives after it, before the read
        await _after(0.05)()
        go.clear()

    async with HttpClient(raw.url) as http:
        new = await ours(http, PAYLOAD, 0.05, between=between)
    old = await reference(raw.url, PAYLOAD, 0.05, key=None, between=between)
    assert new == old
    if case in ("whole-with-headers", "completed-before-deadline"):
        assert new == {"id": "gen-1", "choices": [], "usage": {"cost": 0.25}}
    else:
        assert new == (
            "RequestTimeout",
            f"POST {raw.url}{CHAT}: no complete answer within 0.05 s",
            True,
        )


async def test_the_deadlines_cancel_is_taken_back(hanging: SimulatorServer) -> None:
    """A timeout leaves the task uncancelled (Task.uncancel, as asyncio.timeout does):
    an asyncio.timeout or TaskGroup around the request still works."""
    async with HttpClient(hanging.url, DEFAULT_TEST_KEY) as http:
        task = asyncio.current_task()
        assert task is not None
        with pytest.raises(RequestTimeout):
            await http.send(CHAT, PAYLOAD, request_timeout=0.05)
        assert task.cancelling() == 0
        async with asyncio.timeout(5):
            await asyncio.sleep(0)  # not cancelled by a cancel left pending


async def test_a_task_already_cancelling_still_gets_its_timeout(hanging: SimulatorServer) -> None:
    """A cancel pending before the request is not the deadline's to take back."""
    async with HttpClient(hanging.url, DEFAULT_TEST_KEY) as http:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.sleep(0)
        assert task.cancelling() == 1
        with pytest.raises(RequestTimeout):
            await http.send(CHAT, PAYLOAD, request_timeout=0.05)
        assert task.cancelling() == 1
        task.uncancel()
        assert len(http._deadlines) == 0


async def _in_flight(http: HttpClient, sim: SimulatorServer, seconds: float) -> asyncio.Task[Any]:
    task = asyncio.ensure_future(http.send(CHAT, PAYLOAD, request_timeout=seconds))
    for _ in range(5000):  # until the request reached the local OpenRouter (it hangs there)
        if sim.requests:
            break
        await asyncio.sleep(0.001)
    assert len(http._deadlines) == 1
    return task


def _due_now(deadlines: Deadlines) -> None:
    """Make every registered deadline due and run the timer's sweep now (a race, staged)."""
    loop = asyncio.get_running_loop()
    for fifo in deadlines._fifos.values():
        for entry in fifo:
            entry._when = loop.time()
    deadlines._sweep()


async def test_a_cancel_from_outside_is_a_cancel(hanging: SimulatorServer) -> None:
    async with HttpClient(hanging.url, DEFAULT_TEST_KEY) as http:
        task = await _in_flight(http, hanging, 60)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(http._deadlines) == 0


@pytest.mark.parametrize("outside_first", [False, True])
async def test_an_outside_cancel_with_the_deadline_is_never_swallowed(
    hanging: SimulatorServer, outside_first: bool
) -> None:
    async with HttpClient(hanging.url, DEFAULT_TEST_KEY) as http:
        task = await _in_flight(http, hanging, 60)
        if outside_first:
            task.cancel()
        _due_now(http._deadlines)  # the deadline fires in the same loop iteration
        if not outside_first:
            task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(http._deadlines) == 0


async def test_the_deadline_alone_is_a_timeout(hanging: SimulatorServer) -> None:
    async with HttpClient(hanging.url, DEFAULT_TEST_KEY) as http:
        task = await _in_flight(http, hanging, 60)
        _due_now(http._deadlines)
        with pytest.raises(RequestTimeout, match="no complete answer within 60 s") as info:
            await task
        assert info.value.request_sent is True
        assert task.cancelling() == 0


async def test_nothing_stays_registered_after_any_ending(
    serve: Serve, openrouter_sim: SimulatorServer
) -> None:
    raw = await serve(stalled_after(b"data: {}\n\n"))
    async with HttpClient(raw.url) as http:
        # Released unread, closed on an error inside the block, read whole elsewhere.
        async with http.post(CHAT, PAYLOAD, request_timeout=30):
            assert len(http._deadlines) == 1  # the handed-out response stays covered
        assert len(http._deadlines) == 0
        with pytest.raises(ValueError, match="the caller's"):
            async with http.post(CHAT, PAYLOAD, request_timeout=30):
                raise ValueError("the caller's")
        assert len(http._deadlines) == 0
        response = await http.send(CHAT, PAYLOAD, request_timeout=30)
        assert len(http._deadlines) == 1
        response.close()
        assert len(http._deadlines) == 0
    async with HttpClient(openrouter_sim.url, DEFAULT_TEST_KEY) as http:
        assert await http.post_json(CHAT, BODY)  # a whole answer: ended with its headers
        with pytest.raises(APIError):  # an error status
            await http.post_json(CHAT, {**BODY, "model": "no/such-model"})
        assert len(http._deadlines) == 0


async def test_a_dropped_response_is_unregistered_by_its_deadline(serve: Serve) -> None:
    """A response dropped without release() or close() stays registered until its
    deadline, when the timer drops it (nothing cancelled): never longer."""
    raw = await serve(stalled_after(b"  "))
    async with HttpClient(raw.url) as http:
        response = await http.send(CHAT, PAYLOAD, request_timeout=0.05)
        connection = response._response  # closed below: only the PostResponse is dropped
        del response
        assert len(http._deadlines) == 1
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        loop.call_later(0.05 + GRANULARITY + 0.05, done.set)
        await done.wait()
        assert len(http._deadlines) == 0
        assert not http._deadlines.timer_armed
        connection.close()


async def test_the_timer_wakes_at_the_earliest_deadline_and_stops_with_the_client(
    hanging: SimulatorServer,
) -> None:
    http = HttpClient(hanging.url, DEFAULT_TEST_KEY)
    deadlines = http._deadlines
    # aiohttp arms no timer of its own per POST: the deadline is ours alone.
    assert http._post_target(CHAT, 60, None)[0].total is None
    assert http._post_target(CHAT, None, 5)[0].sock_read == 5
    loop = asyncio.get_running_loop()
    slow = asyncio.ensure_future(http.send(CHAT, PAYLOAD, request_timeout=60))
    await asyncio.sleep(0)
    timer = deadlines._timer
    assert timer is not None
    first = timer.when()
    assert first == pytest.approx(loop.time() + 60, abs=0.5)
    fast = asyncio.ensure_future(http.send(CHAT, PAYLOAD, request_timeout=0.1))
    await asyncio.sleep(0)
    timer = deadlines._timer
    assert timer is not None
    assert timer.when() < first  # re-armed for the earlier one
    with pytest.raises(RequestTimeout, match=r"within 0\.1 s"):
        await fast
    timer = deadlines._timer
    assert timer is not None
    assert timer.when() == first  # back to the one left
    assert len(deadlines) == 1
    await http.aclose()  # the request still in flight fails as the session closes
    with pytest.raises(APIConnectionError):
        await slow
    assert len(deadlines) == 0
    assert not deadlines.timer_armed  # closed and idle: no timer left behind


async def test_closing_an_idle_client_stops_the_timer(openrouter_sim: SimulatorServer) -> None:
    async with HttpClient(openrouter_sim.url, DEFAULT_TEST_KEY) as http:
        assert await http.post_json(CHAT, BODY)
        assert http._deadlines.timer_armed  # armed for the request's deadline (600 s)
    assert not http._deadlines.timer_armed


async def test_deadlines_just_after_a_wake_up_share_the_next_one(
    hanging: SimulatorServer,
) -> None:
    """A deadline a hair after a wake-up waits for the next one, GRANULARITY later at
    most: a burst of expiries costs a few wake-ups, not one each. None fires early."""
    async with HttpClient(hanging.url, DEFAULT_TEST_KEY) as http:
        deadlines = http._deadlines
        loop = asyncio.get_running_loop()
        first = asyncio.ensure_future(http.send(CHAT, PAYLOAD, request_timeout=60))
        await asyncio.sleep(0)
        second = asyncio.ensure_future(http.send(CHAT, PAYLOAD, request_timeout=60))
        await asyncio.sleep(0)
        early, late = next(iter(deadlines._fifos.values()))
        assert early._when <= late._when  # one timeout value: registered in order
        now = loop.time()
        early._when = now
        late._when = now + GRANULARITY / 10  # a hair after the wake-up
        deadlines._sweep()
        assert len(deadlines) == 1  # the one not yet due stays
        timer = deadlines._timer
        assert timer is not None
        assert timer.when() == pytest.approx(loop.time() + GRANULARITY, abs=GRANULARITY / 2)
        with pytest.raises(RequestTimeout):
            await first
        with pytest.raises(RequestTimeout):
            await second  # expired by the next wake-up
        assert len(deadlines) == 0
