"""The ``blackhole_port`` fixture: a loopback address that drops SYNs
(:func:`provider_router.testing.loopback.blackhole`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from provider_router.testing.loopback import blackhole

__all__ = ["blackhole", "blackhole_fixture"]


@pytest.fixture(name="blackhole_port")
def blackhole_fixture() -> Iterator[int]:
    with blackhole() as port:
        yield port
