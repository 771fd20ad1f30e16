"""Streamed chat completions: reading one attempt's SSE stream, and :class:`ChatStream`.

:func:`read_stream` turns the server-sent events of one attempt into a
:class:`~provider_router.client._completion.Completion`, attaching the generation id to
the reservation as soon as the first chunk names it and handing each text piece
to ``on_delta``. :class:`ChatStream` is what :meth:`Router.stream` returns: an
async iterator of :class:`~provider_router.client.results.StreamDelta` over a request
that runs (with its retries) in a task of its own.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Final

from provider_router._exceptions import APIConnectionError, InvalidResponseError, RequestTimeout
from provider_router._http import session as _http
from provider_router._http.sse import DONE
from provider_router._money import pin_exact_cost
from provider_router._resource import AsyncResource
from provider_router.client._billing import Billing
from provider_router.client._completion import Completion, StreamAccumulator, parse_completion
from provider_router.client._request import PreparedRequest
from provider_router.client.results import ChatResult, StreamDelta
from provider_router.ledger import Reservation

__all__ = ["DEADLINE_FINISH", "ChatStream", "not_a_stream", "read_stream"]

DEADLINE_FINISH: Final = "deadline"
"""The ``finish_reason`` of a stream cut by its deadline while still delivering tokens."""

_DEADLINE_SLACK: Final = 0.05
"""Seconds before the deadline a timeout counts as the deadline's (timer granularity)."""


async def read_stream(
    response: _http.PostResponse,
    request: PreparedRequest,
    attempt: int,
    reservation: Reservation | None,
    billing: Billing,
    idle_timeout: float,
    *,
    deadline_at: float | None = None,
) -> Completion:
    """Read one attempt's stream to its ``[DONE]``.

    A stream cut after its usage chunk and a finish reason arrived is a result
    all the same: the answer is whole and paid for (only ``[DONE]`` is missing),
    so it is returned, never retried. A stream still delivering tokens when its
    deadline (``deadline_at``, loop time) passes ends as it stands, with
    ``finish_reason="deadline"`` (its cost is then asked of ``/generation``):
    retrying it blind would pay for the same long answer again.

    Raises:
        InvalidResponseError: an event is not JSON.
        APIConnectionError: the stream ended (or broke) before ``[DONE]`` and
            before its usage, without an error.
        RequestTimeout: silence (or only keep-alives) for ``idle_timeout``, or the
            deadline passed, before the usage arrived.
    """
    accumulator = StreamAccumulator()
    result = accumulator.result
    on_delta = request.on_delta
    done = False
    try:
        async for data in response.events(idle_timeout=idle_timeout):
            if data == DONE:
                done = True
                break
            try:
                chunk = json.loads(data)
            except ValueError as exc:
                raise InvalidResponseError(f"a stream event is not JSON: {data[:200]!r}") from exc
            if "usage" in chunk:
                pin_exact_cost(chunk, data)  # usage.cost digit for digit, never a float
            known = result.generation_id
            delta = accumulator.feed(chunk, attempt)
            generation_id = result.generation_id
            if known is None and generation_id and request.generation_id is None:
                await billing.attach(request, reservation, generation_id)
            if delta is not None and on_delta is not None:
                on_delta(delta)
    except APIConnectionError as exc:
        if _paid_and_whole(result):
            done = True
        elif (
            isinstance(exc, RequestTimeout)
            and deadline_at is not None
            and accumulator.delivered
            and result.error is None
            and asyncio.get_running_loop().time() >= deadline_at - _DEADLINE_SLACK
        ):
            done = True
            if result.finish_reason is None:
                result.finish_reason = DEADLINE_FINISH
        else:
            raise
    completion = accumulator.finish()
    if not done and completion.error is None and not _paid_and_whole(completion):
        raise APIConnectionError("the stream ended before its [DONE] event")
    return completion


async def not_a_stream(response: _http.PostResponse, content_type: str) -> Completion:
    """A streaming request answered 200 with ``content_type``, not ``text/event-stream``.

    A whole JSON chat completion (a server that ignored ``stream: true``) is the answer:
    it was paid for, and sending it again would pay twice. Anything else (an HTML page
    from a proxy, plain text) fails as :class:`InvalidResponseError` saying what came:
    its type and first bytes. The request was sent, so it stays held until OpenRouter's
    records price it.

    Raises:
        InvalidResponseError: the body is not a chat completion.
        APIConnectionError: the body was cut.
    """
    try:
        return parse_completion(await response.json(expect="a chat completion"))
    except InvalidResponseError as exc:
        raise InvalidResponseError(
            f"a streaming request was answered 200 with {content_type}, not an event "
            f"stream (text/event-stream), nor a chat completion: {exc}"
        ) from exc


def _paid_and_whole(completion: Completion) -> bool:
    """Usage (with its cost) and a finish reason arrived: nothing is missing but ``[DONE]``."""
    return (
        completion.usage is not None
        and completion.finish_reason is not None
        and completion.error is None
    )


class ChatStream(AsyncResource):
    """An async iterator of :class:`StreamDelta` for one streamed request.

    Use as ``async with router.stream(...) as stream: async for delta in stream``;
    afterwards :attr:`result` is the :class:`ChatResult`. Leaving the block early
    cancels the request.
    """

    def __init__(
        self, start: Callable[[Callable[[StreamDelta], None]], Coroutine[Any, Any, ChatResult]]
    ) -> None:
        # ``start(on_delta)`` runs the whole request (retries included) handing each
        # piece to ``on_delta``: a callable rather than the Router, so this module
        # needs nothing from the client (which imports it).
        self._run = start
        self._queue: asyncio.Queue[StreamDelta | None] = asyncio.Queue()
        self._task: asyncio.Task[ChatResult] | None = None
        self.result: ChatResult | None = None

    async def _on_enter(self) -> None:
        self._start()

    async def _on_exit(self) -> None:
        await self.aclose()

    def _start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(self._queue.put_nowait))
            self._task.add_done_callback(lambda _: self._queue.put_nowait(None))

    def __aiter__(self) -> AsyncIterator[StreamDelta]:
        return self._deltas()

    async def _deltas(self) -> AsyncIterator[StreamDelta]:
        self._start()
        assert self._task is not None
        while True:
            delta = await self._queue.get()
            if delta is None:
                break
            yield delta
        self.result = await self._task

    async def aclose(self) -> None:
        """Cancel the request if it is still running."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        elif task is not None and task.done() and not task.cancelled():
            # Surface nothing here: the iterator re-raises the task's error.
            task.exception()
