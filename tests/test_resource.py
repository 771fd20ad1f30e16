"""AsyncResource: the one implementation of ``async with`` (provider_router/_resource.py)."""

from __future__ import annotations

import pytest

from provider_router._resource import AsyncResource


class _Recording(AsyncResource):
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def _on_enter(self) -> None:
        self.calls.append("enter")

    async def _on_exit(self) -> None:
        self.calls.append("exit")


class _CloseOnly(AsyncResource):
    closed = False

    async def _on_exit(self) -> None:
        self.closed = True


async def test_entering_gives_the_object_and_leaving_runs_the_exit_hook() -> None:
    resource = _Recording()
    async with resource as entered:
        assert entered is resource
        assert resource.calls == ["enter"]
    assert resource.calls == ["enter", "exit"]


async def test_the_exit_hook_runs_when_the_block_raises_and_the_error_propagates() -> None:
    resource = _Recording()
    with pytest.raises(KeyError, match="boom"):
        async with resource:
            raise KeyError("boom")
    assert resource.calls == ["enter", "exit"]


async def test_entering_does_nothing_unless_asked() -> None:
    async with _CloseOnly() as resource:
        assert not resource.closed
    assert resource.closed


async def test_a_subclass_without_an_exit_hook_fails_loudly() -> None:
    with pytest.raises(NotImplementedError):
        async with AsyncResource():
            pass


class _FailingClose(AsyncResource):
    async def _on_exit(self) -> None:
        raise OSError("socket already gone")


async def test_a_clean_up_error_surfaces_when_the_block_succeeded() -> None:
    with pytest.raises(OSError, match="socket already gone"):
        async with _FailingClose():
            pass


async def test_a_clean_up_error_never_replaces_the_blocks_own_error() -> None:
    with pytest.raises(KeyError) as caught:
        async with _FailingClose():
            raise KeyError("the real failure")
    assert caught.value.__notes__ == ["while cleaning up after it: OSError('socket already gone')"]
