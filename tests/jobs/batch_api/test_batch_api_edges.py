"""The Batch API's sharp edges, handled by the route on the local OpenRouter (real
loopback sockets): a line served by a provider the policy excludes, a fresh batch id
that answers 404, a line that would fail its whole batch, long prompt ids, a sync price
below the ``:batch`` one, and a Batch API that answers 404 for the key."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from _batch_api_helpers import K3, Job, Killed, prompts
from _job_helpers import run_cli, small_plan

from provider_router import ProviderPolicy
from provider_router._exceptions import ConfigurationError
from provider_router.catalog.fetch import Catalog
from provider_router.jobs.batch_api.api import BatchApi
from provider_router.jobs.batch_api_runner import batch_datasets
from provider_router.jobs.run import RunHooks, StopReason, run_plan
from provider_router.jobs.store._layout import QUARANTINED_FILE
from provider_router.planning.compare import compare_routes
from provider_router.planning.prompts import Prompt
from provider_router.planning.workload import DatasetDemand, WorkloadEstimate
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

Factory = Callable[..., Awaitable[SimulatorServer]]


def _prompt(pid: str, text: str, line: int) -> Prompt:
    return Prompt(pid, [{"role": "user", "content": text}], {}, Path("in.jsonl"), line)


async def test_a_line_served_by_an_excluded_provider_is_quarantined_paid_and_sent_again(
    job: Job,
) -> None:
    job.sim.simulator.batches.faults.served_by = "Shady Cloud"
    first = await job.go(prompts(5), max_attempts=1)
    assert first.quarantined == 5
    assert job.outputs() == [], "never data"
    kept = [json.loads(x) for x in (job.directory / QUARANTINED_FILE).read_text().splitlines()]
    assert sorted(e["id"] for e in kept) == [f"p{i}" for i in range(5)]
    assert {e["provider"] for e in kept} == {"Shady Cloud"}
    assert all("not one of the allowed providers (together)" in e["reason"] for e in kept)
    await job.money_agrees()  # paid: booked with its batch
    job.sim.simulator.batches.faults.served_by = None
    again = await job.go(prompts(5), max_attempts=2)  # each had one batch: one more
    assert again.quarantined == 0
    assert sorted(job.outputs()) == [f"p{i}" for i in range(5)], "their prompts went again"
    await job.money_agrees()
    lines = (job.directory / QUARANTINED_FILE).read_text().splitlines()
    assert len(lines) == 5, "each kept once"


async def test_a_fresh_batch_that_answers_404_for_minutes_is_waited_for_not_vanished(
    job: Job,
) -> None:
    # Neither the list nor GET shows the new batch for 7 minutes (longer than the 2
    # minutes a batch seen before may answer 404): it is not visible yet, not gone.
    job.sim.simulator.batches.faults.list_lag = 420.0
    result = await job.go(prompts(5))
    assert result.stop is None
    assert sorted(job.outputs()) == [f"p{i}" for i in range(5)]
    assert set(job.submitted().values()) == {1}
    await job.money_agrees()


class ListedNeverSeenTwice(BatchApi):
    """The list never shows the batch (so it is asked for by id); GET answers 404 at
    its first look and once more much later, and the batch between."""

    def __init__(self, http: Any, job: Job) -> None:
        super().__init__(http)
        self.job, self.gets = job, 0

    async def list_page(self, created_after: int, after: str | None) -> dict[str, Any]:
        return {"object": "list", "data": [], "has_more": False, "last_id": None}

    async def get(self, batch_id: str, **kw: Any) -> dict[str, Any]:
        self.gets += 1
        if self.gets in (1, 4):
            return await super().get("batch-0-gone", **kw)  # a real 404 of the server
        return await super().get(batch_id, **kw)


async def test_a_404_after_the_batch_was_seen_starts_a_new_streak(job: Job) -> None:
    job.sim.simulator.batches.faults.slow = 20.0  # runs long enough for a later blip
    api = ListedNeverSeenTwice(job.http, job)
    result = await job.go(prompts(5), api)
    assert api.gets > 4
    assert result.stop is None, "one 404 between sightings is a blip, not the end"
    assert sorted(job.outputs()) == [f"p{i}" for i in range(5)]
    await job.money_agrees()


async def test_a_line_beyond_the_context_is_never_put_in_a_batch(job: Job) -> None:
    items = prompts(4)
    # About 300k tokens even at four bytes a token: beyond Together's 262,144.
    items.append(_prompt("huge", "word " * 240_000, 9))
    result = await job.go(items)
    assert sorted(job.outputs()) == [f"p{i}" for i in range(4)], "one bad line fails no batch"
    assert result.refused == {"ds": 1}
    assert result.gave_up == {}
    assert any("in.jsonl:9 (id 'huge')" in e and "context length" in e for e in result.events)
    assert "huge" not in job.submitted()
    await job.money_agrees()


async def test_a_line_that_may_overflow_goes_in_a_batch_of_its_own_kind(job: Job) -> None:
    items = prompts(3)
    # 300 KB: over the context at a byte a token, within it at four.
    items.append(_prompt("long", "word " * 60_000, 9))
    result = await job.go(items)
    assert result.refused == {}
    assert result.submitted == 2, "the doubtful line does not share a batch with sure ones"
    assert sorted(job.outputs()) == sorted(["long", "p0", "p1", "p2"])


class KillOnPoll(BatchApi):
    """Killed at the first poll, after the submit (its 202 journaled)."""

    async def list_page(self, created_after: int, after: str | None) -> dict[str, Any]:
        raise Killed

    async def get(self, batch_id: str, **kw: Any) -> dict[str, Any]:
        raise Killed


async def test_long_prompt_ids_go_as_short_custom_ids_mapped_in_the_journal(job: Job) -> None:
    items = [_prompt("x" * 150 + str(n), f"question {n}", n + 1) for n in range(5)]
    with pytest.raises(Killed):
        await job.go(items, KillOnPoll(job.http))
    result = await job.go(items)  # the mapping read back from batches.jsonl
    assert result.stop is None  # the simulator answers 422 to a custom_id over 64
    assert set(job.submitted().values()) == {1}
    assert sorted(job.outputs()) == sorted(p.id for p in items)
    journal = [json.loads(x) for x in (job.directory / "batches.jsonl").read_text().splitlines()]
    intent = next(e for e in journal if e["op"] == "intent")
    assert intent["ids"] == [p.id for p in items], "the mapping is journaled before the submit"


def _promotion_market(directory: Path) -> Path:
    """The default market with Kimi K3's ``:batch`` price above every sync price."""
    text = (resources.files("provider_router.testing") / "markets" / "kimi-k2.5.yaml").read_text()
    data = yaml.safe_load(text)
    for model in data["models"]:
        if model["id"] == K3:
            model["batch_endpoints"][0]["pricing"] = {"prompt": "1.00", "completion": "4.00"}
    path = directory / "promotion.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("route", ["auto", "batch"])
async def test_a_sync_price_below_the_batch_price_is_said_and_auto_goes_sync(
    tmp_path: Path, openrouter_sim_factory: Factory, route: str
) -> None:
    sim = await openrouter_sim_factory(market=_promotion_market(tmp_path), speed=float("inf"))
    plan = small_plan(tmp_path, requests=None, prompts=3, model=K3, route=route)
    chosen = await batch_datasets(plan, base_url=sim.url, api_key=DEFAULT_TEST_KEY)
    assert len(chosen.notes) == 1
    assert "sync price" in chosen.notes[0]
    assert "below the :batch price" in chosen.notes[0]
    assert chosen.names == (() if route == "auto" else ("p",))


async def test_the_bundled_market_keeps_batch_where_it_is_cheaper(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(speed=float("inf"))
    plan = small_plan(tmp_path, requests=None, prompts=3, model=K3, route="auto")
    chosen = await batch_datasets(plan, base_url=sim.url, api_key=DEFAULT_TEST_KEY)
    assert chosen.names == ("p",)
    assert chosen.notes == ()


async def test_an_unreachable_batch_api_sends_auto_sync_and_stops_batch(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(speed=float("inf"))
    sim.simulator.batches.faults.unreachable = True
    auto = small_plan(tmp_path, requests=None, prompts=3, model=K3, route="auto")
    chosen = await batch_datasets(auto, base_url=sim.url, api_key=DEFAULT_TEST_KEY)
    assert chosen.names == ()
    assert chosen.notes == (
        "dataset 'p' goes sync: the Batch API answers 404 for this key (GET /batches), "
        "so it is not available to it",
    )
    probes = [r for r in sim.simulator.log.records if r.route == "batch_list"]
    assert len(probes) == 1, "one probe"
    batch = small_plan(tmp_path, requests=None, prompts=3, model=K3, route="batch")
    with pytest.raises(ConfigurationError, match="answers 404 for this key"):
        await batch_datasets(batch, base_url=sim.url, api_key=DEFAULT_TEST_KEY)


async def test_generation_fields_beyond_the_batch_endpoints_caps_send_auto_sync(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(speed=float("inf"))
    plan = small_plan(tmp_path, requests=None, prompts=3, model=K3, route="auto")
    plan = plan.model_copy(
        update={"generation": plan.generation.model_copy(update={"max_tokens": 40_000})}
    )
    chosen = await batch_datasets(plan, base_url=sim.url, api_key=DEFAULT_TEST_KEY)
    assert chosen.names == ()
    assert "max_tokens 40000 is above Together's batch cap 32768" in chosen.notes[0]


def _plan_with_a_huge_line(tmp_path: Path, route: str) -> Any:
    """Dataset ``p``: 3 ordinary prompts and one beyond every context (``huge``)."""
    plan = small_plan(tmp_path, requests=None, prompts=3, model=K3, route=route)
    path = tmp_path / "p.jsonl"
    with path.open("a") as fh:
        fh.write(json.dumps({"id": "huge", "prompt": "word " * 240_000}) + "\n")
    return plan


@pytest.mark.parametrize("route", ["auto", "batch"])
async def test_a_line_that_would_fail_its_batch_goes_sync_on_auto_and_fails_on_batch(
    tmp_path: Path, openrouter_sim_factory: Factory, route: str
) -> None:
    sim = await openrouter_sim_factory(speed=float("inf"))
    out = tmp_path / "out"
    said: list[str] = []
    outcome = await run_plan(
        _plan_with_a_huge_line(tmp_path, route),
        out,
        api_key=DEFAULT_TEST_KEY,
        base_url=sim.url,
        hooks=RunHooks(on_batch_line=said.append),
    )
    assert outcome.batch is not None
    assert outcome.batch.result.refused == {"p": 1}
    batched = {json.loads(x)["id"] for x in (out / "p.jsonl").read_text().splitlines()}
    assert {"q0", "q1", "q2"} <= batched
    sync_sent = [r for r in sim.simulator.log.records if r.route == "chat"]
    if route == "auto":
        assert sync_sent, "the refused line went to the sync route"
        assert any("they go to the sync route" in e for e in outcome.batch.result.events)
    else:
        assert outcome.reason is StopReason.INCOMPLETE
        assert outcome.batch.stuck == 1
        assert "huge" not in batched
        assert not sync_sent
        assert any("p.jsonl:4 (id 'huge')" in e for e in outcome.batch.result.events)


async def test_the_projection_sends_auto_sync_when_sync_is_cheaper(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(market=_promotion_market(tmp_path))
    async with Catalog(sim.url, api_key=DEFAULT_TEST_KEY) as catalog:
        sync, batch = await catalog.endpoints(K3), await catalog.batch_endpoints(K3)
    demands = [DatasetDemand("a", max_requests=100), DatasetDemand("b", max_requests=100)]
    routes = compare_routes(
        demands,
        sync,
        batch,
        ProviderPolicy(exclude_below="int4"),
        WorkloadEstimate(200, 1600),
        routes={"a": "auto", "b": "batch"},
    )
    a, b = routes.choices
    assert (a.route, b.route) == ("sync", "batch")
    assert "dataset 'a' goes sync: DeepInfra's sync price" in a.reason
    assert "keeps route batch as asked" in b.reason


@pytest.mark.parametrize("route", ["auto", "batch"])
async def test_the_command_with_an_unreachable_batch_api(
    tmp_path: Path, openrouter_sim_factory: Factory, route: str
) -> None:
    sim = await openrouter_sim_factory(speed=float("inf"), seed=3)
    sim.simulator.batches.faults.unreachable = True
    small_plan(tmp_path, requests=None, prompts=4, model=K3, route=route)  # writes p.jsonl
    path = tmp_path / "plan.yaml"
    path.write_text(
        f"model: {K3}\nbudget: 10\npolicy: {{exclude_below: int4}}\n"
        f"generation: {{max_tokens: 200}}\n"
        f"datasets:\n  - {{name: p, input: p.jsonl, route: {route}}}\n"
    )
    out = tmp_path / "out"
    args = ["run", "--plan", str(path), "--out", str(out), "--base-url", sim.url]
    code, _, err = await run_cli(*args, "--progress", "off", "--no-preflight")
    if route == "auto":
        assert code == 0, err[-2000:]
        assert "dataset 'p' goes sync: the Batch API answers 404 for this key" in err
        assert len(sim.simulator.log.chat()) == 4, "sent synchronously"
    else:
        assert code == 1
        assert "dataset 'p' asks for route batch, but the Batch API answers 404" in err
        assert not sim.simulator.log.chat(), "nothing sent"
