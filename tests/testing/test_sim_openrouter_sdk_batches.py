"""The newest official ``openrouter`` SDK's batch operations, unchanged, against the simulator.

Like ``test_sim_openrouter_sdk.py`` (CI installs the SDK fresh and unpinned; a missing
SDK skips here unless ``PROVIDER_ROUTER_REQUIRE_OPENROUTER_SDK`` is set): every call
goes over a loopback socket through the SDK's own client and response models, so a
batch object, list page, deletion or 402 the simulator shapes wrongly fails here.
"""

from __future__ import annotations

import math
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio

from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

REQUIRE_SDK_ENV = "PROVIDER_ROUTER_REQUIRE_OPENROUTER_SDK"
if os.environ.get(REQUIRE_SDK_ENV):
    import openrouter
else:
    openrouter = pytest.importorskip(
        "openrouter", reason=f"the openrouter SDK is not installed ({REQUIRE_SDK_ENV} unset)"
    )
from openrouter import errors  # noqa: E402

K3 = "moonshotai/kimi-k3"


def requests(n: int) -> list[dict[str, Any]]:
    return [
        {
            "custom_id": f"row-{i}",
            "body": {"messages": [{"role": "user", "content": f"Say {i}."}], "max_tokens": 64},
        }
        for i in range(n)
    ]


@pytest_asyncio.fixture
async def sim_and_sdk(
    openrouter_sim_factory: Callable[..., Awaitable[SimulatorServer]],
) -> AsyncIterator[tuple[SimulatorServer, Any]]:
    sim = await openrouter_sim_factory(speed=math.inf)
    async with openrouter.OpenRouter(
        api_key=DEFAULT_TEST_KEY, server_url=sim.url, retry_config=None
    ) as client:
        yield sim, client


async def test_create_get_list_delete(sim_and_sdk: tuple[SimulatorServer, Any]) -> None:
    sim, sdk = sim_and_sdk
    created = await sdk.batch.create_batches_async(
        endpoint="/v1/chat/completions",
        model=K3,
        requests=requests(3),
        provider={"only": ["together"], "allow_fallbacks": False},
    )
    assert created.status == "validating"
    assert created.results is None
    done = await sdk.batch.get_batches_async(id=created.id)
    assert done.status == "completed"
    assert done.provider == "Together"
    assert done.request_counts.completed == 3
    assert sorted(r.custom_id for r in done.results) == ["row-0", "row-1", "row-2"]
    assert all(r.response.status_code == 200 and r.error is None for r in done.results)
    assert done.usage.cost == pytest.approx(float(sim.simulator.usage))

    page = await sdk.batch.list_async(limit=10, created_after="2020-01-01")
    assert [b.id for b in page.result.data] == [created.id]
    assert page.result.data[0].results is None
    by_status = await sdk.batch.list_async(status=["completed", "failed"])
    assert [b.id for b in by_status.result.data] == [created.id]

    deleted = await sdk.batch.delete_async(id=created.id)
    assert deleted.id == created.id
    assert deleted.deletion.openrouter == "deleted"
    with pytest.raises(errors.BatchErrorResponse):
        await sdk.batch.get_batches_async(id=created.id)


async def test_a_model_without_batch_endpoints_is_the_sdk_error(
    sim_and_sdk: tuple[SimulatorServer, Any],
) -> None:
    _, sdk = sim_and_sdk
    with pytest.raises(errors.BatchErrorResponse) as caught:
        await sdk.batch.create_batches_async(
            endpoint="/v1/chat/completions", model="moonshotai/kimi-k2.5", requests=requests(1)
        )
    assert "does not have a :batch endpoint" in caught.value.data.error.message


async def test_a_failed_batch_says_why(sim_and_sdk: tuple[SimulatorServer, Any]) -> None:
    _, sdk = sim_and_sdk
    rows = requests(2)
    rows[0]["body"]["stream"] = True
    created = await sdk.batch.create_batches_async(
        endpoint="/v1/chat/completions", model=K3, requests=rows
    )
    failed = await sdk.batch.get_batches_async(id=created.id)
    assert failed.status == "failed"
    assert "stream" in failed.error.message


async def test_results_402_is_the_sdk_payment_error_then_a_top_up_unlocks(
    sim_and_sdk: tuple[SimulatorServer, Any],
) -> None:
    sim, sdk = sim_and_sdk
    created = await sdk.batch.create_batches_async(
        endpoint="/v1/chat/completions", model=K3, requests=requests(2)
    )
    sim.set_balance(0)
    with pytest.raises(errors.BatchPaymentRequiredResponseError) as caught:
        await sdk.batch.get_batches_async(id=created.id)
    assert caught.value.data.results is None
    assert caught.value.data.status == "completed"
    sim.top_up(1)
    paid = await sdk.batch.get_batches_async(id=created.id)
    assert len(paid.results) == 2


async def test_deleting_a_running_batch_is_409(
    openrouter_sim_factory: Callable[..., Awaitable[SimulatorServer]],
) -> None:
    sim = await openrouter_sim_factory(speed=1.0)
    async with openrouter.OpenRouter(
        api_key=DEFAULT_TEST_KEY, server_url=sim.url, retry_config=None
    ) as sdk:
        created = await sdk.batch.create_batches_async(
            endpoint="/v1/chat/completions", model=K3, requests=requests(1)
        )
        with pytest.raises(errors.BatchErrorResponse) as caught:
            await sdk.batch.delete_async(id=created.id)
        assert caught.value.status_code == 409
