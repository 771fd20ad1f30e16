"""The simulated Batch API: submit checks, the state machine on an injected clock, billing
per successful line at finalize, 402 on results, list filters, delete, faults."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any

import aiohttp
import pytest
from _sim_client import SimClient, StartSim

from provider_router.testing import DEFAULT_TEST_KEY, Market
from provider_router.testing.batch_api.lines import MAX_BATCH_REQUESTS
from provider_router.testing.batch_api.state import MEDIAN_SECONDS, P90_SECONDS, SIGMA, BatchBook

K3 = "moonshotai/kimi-k3"
K25 = "moonshotai/kimi-k2.5"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def lines(n: int, max_tokens: int = 100, **extra: Any) -> list[dict[str, Any]]:
    return [
        {
            "custom_id": f"p-{i}",
            "body": {
                "messages": [{"role": "user", "content": f"prompt {i}"}],
                "max_tokens": max_tokens,
                **extra,
            },
        }
        for i in range(n)
    ]


def submit_body(n: int = 3, model: str = K3, **top: Any) -> dict[str, Any]:
    return {"endpoint": "/v1/chat/completions", "model": model, **top, "requests": lines(n)}


async def test_batch_listing_prices_k3_and_is_empty_for_k25(client: SimClient) -> None:
    k3 = await client.get(f"/models/{K3}:batch/endpoints")
    assert k3.status == 200
    (together,) = k3.json["data"]["endpoints"]
    assert together["provider_name"] == "Together"
    sync = await client.get(f"/models/{K3}/endpoints")
    sync_together = next(
        e for e in sync.json["data"]["endpoints"] if e["provider_name"] == "Together"
    )
    ratio = Decimal(together["pricing"]["completion"]) / Decimal(
        sync_together["pricing"]["completion"]
    )
    assert ratio == Decimal("0.76")
    k25 = await client.get(f"/models/{K25}:batch/endpoints")
    assert k25.status == 200
    assert k25.json["data"]["endpoints"] == []


async def test_a_batch_walks_validating_in_progress_finalizing_completed(
    start_sim: StartSim,
) -> None:
    clock = Clock()
    sim, client = await start_sim(speed=1.0, clock=clock)
    reply = await client.post("/batches", submit_body(4))
    assert reply.status == 202
    assert reply.json["status"] == "validating"
    assert reply.json["provider"] is None
    batch_id = reply.json["id"]
    assert batch_id.startswith(f"batch-{reply.json['created_at']}-")
    (batch,) = list(sim.simulator.batches)
    seen = []
    for seconds in (1.0, batch.duration / 2, batch.duration - 1, batch.duration + 1):
        clock.t = 1000.0 + seconds
        got = await client.get(f"/batches/{batch_id}")
        assert got.status == 200
        seen.append(got.json["status"])
        if got.json["status"] != "completed":
            assert got.json["results"] is None
            assert got.json["usage"] is None
            assert sim.simulator.usage == 0, "nothing is billed before finalize"
    assert seen == ["validating", "in_progress", "finalizing", "completed"]
    assert got.json["provider"] == "Together"
    assert got.json["request_counts"] == {"total": 4, "completed": 4, "failed": 0}
    assert sorted(r["custom_id"] for r in got.json["results"]) == [f"p-{i}" for i in range(4)]
    assert Decimal(str(got.json["usage"]["cost"])) == sim.simulator.usage


async def test_billing_is_the_sum_of_lines_at_batch_prices(start_sim: StartSim) -> None:
    sim, client = await start_sim(speed=math.inf)
    reply = await client.post("/batches", submit_body(5))
    got = await client.get(f"/batches/{reply.json['id']}")
    together = next(e for e in Market.default().models[K3].batch_endpoints)
    expected = sum(
        r["response"]["body"]["usage"]["prompt_tokens"] * together.prompt_units
        + r["response"]["body"]["usage"]["completion_tokens"] * together.completion_units
        for r in got.json["results"]
    )
    assert sim.simulator.batches.charged == expected
    assert sim.simulator.account.usage == expected


async def test_failed_lines_cost_nothing(start_sim: StartSim) -> None:
    sim, client = await start_sim(speed=math.inf)
    sim.simulator.batches.faults.line_failure_rate = 0.5
    reply = await client.post("/batches", submit_body(40))
    got = await client.get(f"/batches/{reply.json['id']}")
    failed = [r for r in got.json["results"] if r["error"] is not None]
    assert 5 < len(failed) < 35
    assert all(r["response"] is None for r in failed)
    counts = got.json["request_counts"]
    assert counts["failed"] == len(failed)
    assert counts["completed"] == 40 - len(failed)
    paid = sum(r["response"]["body"]["usage"]["cost"] for r in got.json["results"] if r["response"])
    assert Decimal(str(got.json["usage"]["cost"])) == pytest.approx(Decimal(str(paid)))


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (
            {"requests": lines(1), "endpoint": "/v1/chat/completions", "model": K3},
            400,
            "must appear before requests",
        ),
        ({"endpoint": "/v1/chat/completions", "requests": lines(1)}, 400, "are required"),
        (submit_body(model=K25), 400, "does not have a :batch endpoint"),
        (submit_body(model="nobody/nothing"), 404, "not found"),
        (submit_body(provider={"only": ["deepinfra"]}), 404, "matching provider.only"),
        (submit_body(completion_window="48h"), 400, "completion_window"),
        ({"endpoint": "/v1/chat/completions", "model": K3, "requests": []}, 400, "non-empty"),
        (
            {"endpoint": "/v1/chat/completions", "model": K3, "requests": lines(1) + lines(1)},
            422,
            "line 2 has a duplicate custom_id",
        ),
        (
            {
                "endpoint": "/v1/chat/completions",
                "model": K3,
                "requests": [{"custom_id": "a b", "body": {"messages": []}}],
            },
            422,
            "custom_id",
        ),
        (
            {
                "endpoint": "/v1/chat/completions",
                "model": K3,
                "requests": [{"custom_id": "a", "body": {"model": K25, "messages": [{}]}}],
            },
            400,
            "must match the top-level model",
        ),
        ({"endpoint": "/v1/embeddings", "model": K3, "requests": lines(1)}, 400, "not served"),
    ],
)
async def test_submit_refusals(
    client: SimClient, body: dict[str, Any], status: int, fragment: str
) -> None:
    reply = await client.post("/batches", body)
    assert reply.status == status, reply.text
    assert fragment in reply.json["error"]["message"]


async def test_too_many_requests_is_413(client: SimClient) -> None:
    body = {
        "endpoint": "/v1/chat/completions",
        "model": K3,
        "requests": lines(MAX_BATCH_REQUESTS + 1, max_tokens=1),
    }
    reply = await client.post("/batches", body)
    assert reply.status == 413


@pytest.mark.parametrize("extra", [{"stream": True}, {"max_tokens": 0}])
async def test_stream_or_bad_max_tokens_fail_the_batch_after_202(
    start_sim: StartSim, extra: dict[str, Any]
) -> None:
    sim, client = await start_sim(speed=math.inf)
    body = submit_body(2)
    body["requests"][1]["body"].update(extra)
    reply = await client.post("/batches", body)
    assert reply.status == 202
    got = await client.get(f"/batches/{reply.json['id']}")
    assert got.json["status"] == "failed"
    assert "line 2" in got.json["error"]["message"]
    assert got.json["results"] == []
    assert sim.simulator.usage == 0


async def test_submit_refuses_what_the_balance_cannot_cover(start_sim: StartSim) -> None:
    _, client = await start_sim(credits="0.001")
    reply = await client.post("/batches", submit_body(3))  # 3 x 100 tokens at $2.66/M: fits
    assert reply.status == 202
    big = {"endpoint": "/v1/chat/completions", "model": K3, "requests": lines(10, 10_000)}
    refused = await client.post("/batches", big)
    assert refused.status == 402
    assert "estimated cost" in refused.json["error"]["message"]


async def test_results_withheld_with_402_until_a_top_up_then_released_unbilled_twice(
    start_sim: StartSim,
) -> None:
    sim, client = await start_sim(speed=math.inf, credits="0.01")
    first = await client.post("/batches", submit_body(3))
    second = await client.post("/batches", submit_body(3))
    assert first.status == second.status == 202  # each affordable alone: no hold at submit
    sim.simulator.set_balance("0.0001")
    owed = await client.get(f"/batches/{first.json['id']}")
    assert owed.status == 402
    assert owed.json["results"] is None
    assert owed.json["error"]["code"] == 402
    assert "not re-run" in owed.json["error"]["message"]
    assert owed.json["usage"]["cost"] > 0.0001
    page = await client.get(f"/batches/{first.json['id']}/results")
    assert page.status == 402
    before = sim.simulator.usage
    sim.simulator.top_up(1)
    paid = await client.get(f"/batches/{first.json['id']}")
    assert paid.status == 200
    assert len(paid.json["results"]) == 3
    assert sim.simulator.usage - before == Decimal(str(paid.json["usage"]["cost"]))
    again = await client.get(f"/batches/{first.json['id']}")
    assert again.json["results"] == paid.json["results"], "the same results, not re-run"
    assert sim.simulator.usage - before == Decimal(str(paid.json["usage"]["cost"]))


async def test_results_pages_cover_every_line_once(start_sim: StartSim) -> None:
    _, client = await start_sim(speed=math.inf)
    reply = await client.post("/batches", submit_body(25))
    ids: list[str] = []
    cursor = None
    while True:
        params = {"limit": "10", **({"cursor": cursor} if cursor else {})}
        page = await client.get(f"/batches/{reply.json['id']}/results", **params)
        assert page.status == 200
        ids += [r["custom_id"] for r in page.json["data"]]
        if not page.json["has_more"]:
            break
        cursor = page.json["next_cursor"]
    assert sorted(ids) == sorted(f"p-{i}" for i in range(25))
    bad = await client.get(f"/batches/{reply.json['id']}/results", limit="1001")
    assert bad.status == 400


async def test_results_before_terminal_is_409(start_sim: StartSim) -> None:
    clock = Clock()
    _, client = await start_sim(speed=1.0, clock=clock)
    reply = await client.post("/batches", submit_body(2))
    page = await client.get(f"/batches/{reply.json['id']}/results")
    assert page.status == 409


async def test_list_newest_first_with_after_status_and_created_filters(
    start_sim: StartSim,
) -> None:
    clock = Clock()
    _, client = await start_sim(speed=1.0, clock=clock)
    made = []
    for _ in range(3):
        made.append((await client.post("/batches", submit_body(1))).json)
        clock.t += 10
    listing = await client.get("/batches", limit="2")
    assert [b["id"] for b in listing.json["data"]] == [made[2]["id"], made[1]["id"]]
    assert listing.json["has_more"] is True
    assert all(b["results"] is None for b in listing.json["data"])
    rest = await client.get("/batches", limit="2", after=listing.json["last_id"])
    assert [b["id"] for b in rest.json["data"]] == [made[0]["id"]]
    assert rest.json["has_more"] is False
    after = await client.get("/batches", created_after=str(made[0]["created_at"]))
    assert [b["id"] for b in after.json["data"]] == [made[2]["id"], made[1]["id"]]
    before = await client.get("/batches", created_before=str(made[1]["created_at"]))
    assert [b["id"] for b in before.json["data"]] == [made[0]["id"]]
    running = await client.get("/batches", status="in_progress")
    assert {b["status"] for b in running.json["data"]} <= {"in_progress"}
    assert (await client.get("/batches", status="nope")).status == 400
    assert (await client.get("/batches", created_after="yesterday")).status == 400
    assert (await client.get("/batches", limit="0")).status == 400


async def test_another_keys_batches_are_invisible(start_sim: StartSim) -> None:
    sim, client = await start_sim(speed=math.inf, api_keys=[DEFAULT_TEST_KEY, "sk-other"])
    reply = await client.post("/batches", submit_body(1))
    other = SimClient(sim.url, "sk-other")
    try:
        assert (await other.get(f"/batches/{reply.json['id']}")).status == 404
        assert (await other.get("/batches")).json["data"] == []
    finally:
        await other.close()


async def test_delete_only_when_terminal_and_billing_is_kept(start_sim: StartSim) -> None:
    clock = Clock()
    sim, client = await start_sim(speed=1.0, clock=clock)
    reply = await client.post("/batches", submit_body(2))
    url = f"{sim.url}/batches/{reply.json['id']}"
    async with client.session.delete(url) as response:
        assert response.status == 409
    clock.t += 2 * 86400
    await client.get(f"/batches/{reply.json['id']}")
    charged = sim.simulator.usage
    async with client.session.delete(url) as response:
        assert response.status == 200
        body = await response.json()
    assert body["deletion"]["openrouter"] == "deleted"
    assert (await client.get(f"/batches/{reply.json['id']}")).status == 404
    assert sim.simulator.usage == charged > 0


async def test_faults_fail_expire_and_slow(start_sim: StartSim) -> None:
    clock = Clock()
    sim, client = await start_sim(speed=1.0, clock=clock)
    book = sim.simulator.batches
    book.faults.fail = 1
    failed = (await client.post("/batches", submit_body(1))).json["id"]
    book.faults.expire = 1
    expired = (await client.post("/batches", submit_body(1))).json["id"]
    clock.t += 86400 + 1
    got_failed = await client.get(f"/batches/{failed}")
    got_expired = await client.get(f"/batches/{expired}")
    assert got_failed.json["status"] == "failed"
    assert got_failed.json["error"]["message"]
    assert got_expired.json["status"] == "expired"
    assert got_expired.json["results"] == []
    assert sim.simulator.usage == 0
    book.faults.slow = 1000.0
    await client.post("/batches", submit_body(1))
    assert math.isinf(list(book)[-1].duration), "1000 x slower runs past the window"


async def test_a_batch_failing_late_ran_and_billed_half_its_lines(start_sim: StartSim) -> None:
    clock = Clock()
    sim, client = await start_sim(speed=1.0, clock=clock)
    sim.simulator.batches.faults.fail_late = 1
    batch_id = (await client.post("/batches", submit_body(4))).json["id"]
    clock.t += 30
    assert (await client.get(f"/batches/{batch_id}")).json["status"] != "failed", "it runs"
    clock.t += 86400
    got = (await client.get(f"/batches/{batch_id}")).json
    assert got["status"] == "failed"
    assert got["error"]["message"]
    assert got["request_counts"] == {"total": 4, "completed": 2, "failed": 2}
    assert Decimal(str(got["usage"]["cost"])) == sim.simulator.usage > 0, "billed, and says so"


async def test_a_lost_202_still_creates_the_batch_and_list_finds_it(start_sim: StartSim) -> None:
    sim, client = await start_sim(speed=math.inf)
    sim.simulator.batches.faults.lose_202 = 1
    with pytest.raises(aiohttp.ClientError):
        await client.post("/batches", submit_body(2))
    listing = await client.get("/batches", created_after="0")
    (found,) = listing.json["data"]
    got = await client.get(f"/batches/{found['id']}")
    assert sorted(r["custom_id"] for r in got.json["results"]) == ["p-0", "p-1"]


async def test_a_fresh_batch_may_answer_404_a_moment(start_sim: StartSim) -> None:
    sim, client = await start_sim(speed=math.inf)
    sim.simulator.batches.faults.fresh_404s = 1
    reply = await client.post("/batches", submit_body(1))
    assert (await client.get(f"/batches/{reply.json['id']}")).status == 404
    assert (await client.get(f"/batches/{reply.json['id']}")).status == 200


async def test_a_new_batch_may_stay_out_of_the_list_for_list_lag(start_sim: StartSim) -> None:
    clock = Clock()
    sim, client = await start_sim(speed=1.0, clock=clock)
    sim.simulator.batches.faults.list_lag = 300.0
    reply = await client.post("/batches", submit_body(1))
    assert reply.status == 202
    assert (await client.get("/batches", created_after="0")).json["data"] == []
    assert (await client.get(f"/batches/{reply.json['id']}")).status == 404
    clock.t += 300.0
    (listed,) = (await client.get("/batches", created_after="0")).json["data"]
    assert listed["id"] == reply.json["id"]
    assert (await client.get(f"/batches/{reply.json['id']}")).status == 200


async def test_a_dropped_submit_makes_no_batch(start_sim: StartSim) -> None:
    sim, client = await start_sim(speed=math.inf)
    sim.simulator.batches.faults.drop_submit = 1
    with pytest.raises(aiohttp.ClientError):
        await client.post("/batches", submit_body(2))
    assert len(sim.simulator.batches) == 0
    assert (await client.get("/batches", created_after="0")).json["data"] == []
    assert (await client.post("/batches", submit_body(2))).status == 202, "the next one goes"


async def test_beta_path_serves_the_same_batches(start_sim: StartSim) -> None:
    sim, client = await start_sim(speed=math.inf)
    beta = sim.url.replace("/api/v1", "/api/beta")
    async with client.session.post(beta + "/batches", data=json.dumps(submit_body(1))) as r:
        assert r.status == 202


def test_completion_times_match_median_7_min_and_p90_1_h() -> None:
    # The drawn log-normal's quantiles, checked on the parameters the book draws from.
    assert MEDIAN_SECONDS == 420
    assert MEDIAN_SECONDS * math.exp(1.2815515655446004 * SIGMA) == pytest.approx(P90_SECONDS)
    assert BatchBook.__name__ == "BatchBook"


async def test_drawn_durations_have_the_observed_quantiles(start_sim: StartSim) -> None:
    clock = Clock()
    sim, client = await start_sim(speed=1.0, clock=clock, seed=3)
    for _ in range(400):
        assert (await client.post("/batches", submit_body(1))).status == 202
    durations = sorted(b.duration for b in sim.simulator.batches)
    median = durations[len(durations) // 2]
    p90 = durations[int(len(durations) * 0.9)]
    assert 300 < median < 600
    assert 2400 < p90 < 5400
