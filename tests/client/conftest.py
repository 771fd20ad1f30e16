"""Fixtures for the Router tests: a real local OpenRouter over loopback sockets."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from _router_helpers import KIMI, MakeRouter, RecordingSleep

from provider_router import ProviderPolicy, Router
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer


@pytest.fixture
def recording_sleep() -> RecordingSleep:
    return RecordingSleep()


@pytest_asyncio.fixture
async def make_router(recording_sleep: RecordingSleep) -> AsyncIterator[MakeRouter]:
    """``await make_router(sim, **kwargs)``: an open Router on ``sim``, closed after the test."""
    routers: list[Router] = []

    async def make(sim: SimulatorServer, **kwargs: Any) -> Router:
        kwargs.setdefault("policy", ProviderPolicy(exclude_below="int4"))
        kwargs.setdefault("api_key", DEFAULT_TEST_KEY)
        kwargs.setdefault("sleep", recording_sleep)
        router = Router(model=kwargs.pop("model", KIMI), base_url=sim.url, **kwargs)
        await router.open()
        routers.append(router)
        return router

    try:
        yield make
    finally:
        for router in reversed(routers):
            await router.close()


@pytest.fixture(scope="session")
def _openapi_registry() -> Any:
    import yaml
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with (Path(__file__).parents[1] / "data" / "openrouter-openapi.yaml").open(
        encoding="utf-8"
    ) as handle:
        doc = yaml.load(handle, Loader=loader)  # noqa: S506 - a safe loader
    resource = Resource.from_contents(doc, default_specification=DRAFT202012)
    return Registry().with_resource("urn:openrouter-openapi", resource)


@pytest.fixture
def openapi_validator(_openapi_registry: Any) -> Callable[[str, Any], None]:
    """``validate(schema_name, instance)`` against ``#/components/schemas/<name>``."""
    import jsonschema

    def validate(name: str, instance: Any) -> None:
        schema = {"$ref": f"urn:openrouter-openapi#/components/schemas/{name}"}
        validator = jsonschema.Draft202012Validator(schema, registry=_openapi_registry)
        errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.path))
        assert not errors, "; ".join(f"{list(e.path)}: {e.message}" for e in errors[:5])

    return validate
