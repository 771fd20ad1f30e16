"""The SQLite ledger's writer thread: jobs run off the loop, each answered with one wake-up.

A ledger commits (the WAL write and its fsync) in one thread of its own, so a slow disk
never stalls the event loop. The thread takes jobs from a ``SimpleQueue`` and hands
each result to the loop with one ``call_soon_threadsafe``, cheaper than an executor's
``wrap_future`` round trip (docs/performance.md); one commit per batch pays it. The
loop must not touch the connection while a job runs, even when the task that awaited
it was cancelled: :attr:`WriterThread.busy` and :meth:`WriterThread.idle` follow the
jobs themselves, not their futures.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["WriterThread"]

_T = TypeVar("_T")

_Job = tuple[asyncio.AbstractEventLoop, Callable[..., Any], Callable[..., Any], tuple[Any, ...]]


class WriterThread:
    """One daemon thread running jobs in submission order; started on first use.

    Args:
        name: the thread's name (shown by debuggers and ``py-spy``).
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._running = 0  # jobs submitted whose answer has not reached the loop
        self._idle: list[asyncio.Future[None]] = []

    @property
    def busy(self) -> bool:
        """Whether a job submitted from the loop has not finished yet."""
        return self._running > 0

    def run(self, fn: Callable[..., _T], *args: Any) -> asyncio.Future[_T]:
        """Run ``fn(*args)`` in the thread; its result (or exception) on the loop.

        Cancelling the returned future does not stop the job: see :meth:`idle`.
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[_T] = loop.create_future()
        if self._thread is None:
            self._start()

        def answer(result: Any, error: BaseException | None) -> None:
            self._finished()
            if fut.done():  # the awaiting task was cancelled meanwhile
                return
            if error is None:
                fut.set_result(result)
            else:
                fut.set_exception(error)

        self._running += 1
        self._jobs.put((loop, answer, fn, args))
        return fut

    async def idle(self) -> None:
        """Wait until every job submitted so far has finished."""
        while self._running:
            waiter = asyncio.get_running_loop().create_future()
            self._idle.append(waiter)
            await waiter

    def stop(self) -> None:
        """End the thread once the jobs already queued are done (waits for it)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._jobs.put(None)
            thread.join()

    def _start(self) -> None:
        jobs = self._jobs
        thread = threading.Thread(target=_work, args=(jobs,), name=self._name, daemon=True)
        thread.start()
        self._thread = thread
        # A ledger dropped without close() must not leave its thread behind.
        weakref.finalize(self, jobs.put, None)

    def _finished(self) -> None:
        self._running -= 1
        if not self._running and self._idle:
            waiters, self._idle = self._idle, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)


def _work(jobs: queue.SimpleQueue[_Job | None]) -> None:
    """The thread's body: holds the queue only, so the owner can be collected."""
    while (job := jobs.get()) is not None:
        loop, answer, fn, args = job
        del job
        try:
            result, error = fn(*args), None
        except BaseException as exc:  # handed to the awaiting caller, as a future would
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
            loop.call_soon_threadsafe(answer, result, error)
        del loop, answer, fn, args, result, error
