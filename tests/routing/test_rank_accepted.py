"""Cost per accepted sample: the ranking prices a verified endpoint's pass rate, exactly,
and ranks what was not verified after what was (unknown is not free)."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from _metadata_server import serve

import provider_router as pr
from provider_router import ConfigurationError, Endpoint, Workload, rank
from provider_router.cli import main
from provider_router.testing import SimulatorServer
from provider_router.testing.server import DEFAULT_TEST_KEY as KEY

KIMI = "moonshotai/kimi-k2.5"
WORKLOAD = Workload(prompt_tokens=200, completion_tokens=2000)
SimFactory = Callable[..., Awaitable[SimulatorServer]]


def endpoint(tag: str, completion: str, **overrides: Any) -> Endpoint:
    raw: dict[str, Any] = {
        "name": f"{tag} | {KIMI}",
        "provider_name": tag.title(),
        "tag": tag,
        "pricing": {"prompt": "0", "completion": completion},
        "quantization": "int4",
        "status": 0,
        "uptime_last_30m": 100,
    }
    raw.update(overrides)
    return Endpoint.model_validate(raw)


def report(model: str = KIMI, **rates: tuple[int, int]) -> pr.VerificationReport:
    """A report whose endpoints passed ``accepted`` of ``judged`` canaries each."""
    verdicts = tuple(
        pr.EndpointVerdict(
            tag=tag.replace("_", "-"),
            provider_name=tag.title(),
            passed=True,
            accepted=accepted,
            judged=judged,
        )
        for tag, (accepted, judged) in rates.items()
    )
    return pr.VerificationReport(
        model=model, reference="moonshotai", self_agreement=None, endpoints=verdicts
    )


CHEAP = endpoint("cheap", "0.000001")  # $0.002 per request
DEAR = endpoint("dear", "0.0000015")  # $0.003 per request
DEARER = endpoint("dearer", "0.000002")  # $0.004 per request


def test_the_pass_rate_reorders_by_price_over_pass_rate_exactly() -> None:
    # cheap accepts 3 of 5: $0.002 / 0.6 = $0.00333… > dear's $0.003 / 1.
    verified = report(cheap=(3, 5), dear=(8, 8), dearer=(7, 8))
    ranked = rank([CHEAP, DEAR, DEARER], workload=WORKLOAD, verified=verified)
    assert [r.endpoint.slug for r in ranked] == ["dear", "cheap", "dearer"]
    by_tag = {r.endpoint.slug: r for r in ranked}
    cheap = by_tag["cheap"]
    assert cheap.pass_rate == Decimal("0.6")
    assert cheap.cost_per_accepted_sample == Decimal("0.002") * 5 / 3
    assert isinstance(cheap.cost_per_accepted_sample, Decimal)
    assert by_tag["dear"].cost_per_accepted_sample == Decimal("0.003")
    assert by_tag["dearer"].cost_per_accepted_sample == Decimal("0.004") * 8 / 7
    # The plain scores are still there, and without a report nothing changes.
    assert cheap.expected_cost_per_success == Decimal("0.002")
    plain = rank([CHEAP, DEAR, DEARER], workload=WORKLOAD)
    assert [r.endpoint.slug for r in plain] == ["cheap", "dear", "dearer"]
    assert all(r.pass_rate is None and r.cost_per_accepted_sample is None for r in plain)


def test_unverified_endpoints_rank_after_verified_ones_and_none_accepted_last() -> None:
    down = endpoint("down", "0.0000001", status=-5)
    verified = report(dearer=(1, 8), dear=(0, 8), down=(8, 8))
    ranked = rank([CHEAP, DEAR, DEARER, down], workload=WORKLOAD, verified=verified)
    # dearer: measured, one accepted; cheap: not in the report; dear: none accepted;
    # down: down endpoints go last whatever their pass rate.
    assert [r.endpoint.slug for r in ranked] == ["dearer", "cheap", "dear", "down"]
    by_tag = {r.endpoint.slug: r for r in ranked}
    assert (by_tag["cheap"].pass_rate, by_tag["cheap"].cost_per_accepted_sample) == (None, None)
    assert (by_tag["dear"].pass_rate, by_tag["dear"].cost_per_accepted_sample) == (0, None)
    # A verdict with nothing judged is not a measurement either.
    ranked = rank([CHEAP, DEAR], workload=WORKLOAD, verified=report(cheap=(0, 0), dear=(2, 2)))
    assert [r.endpoint.slug for r in ranked] == ["dear", "cheap"]


def test_the_order_never_depends_on_the_input_order() -> None:
    verified = report(cheap=(2, 4), dear=(4, 4))  # cheap: $0.004 per accepted sample
    orders = {
        tuple(r.endpoint.slug for r in rank(perm, workload=WORKLOAD, verified=verified))
        for perm in itertools.permutations([CHEAP, DEAR, DEARER])
    }
    assert orders == {("dear", "cheap", "dearer")}


def test_the_policy_option_needs_a_report_and_ignores_another_models() -> None:
    with pytest.raises(ConfigurationError, match="needs verified="):
        pr.ProviderPolicy(rank_per_accepted_sample=True)
    with pytest.raises(ConfigurationError, match="true or false"):
        pr.ProviderPolicy(verified=report(), rank_per_accepted_sample="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="VerificationReport"):
        rank([CHEAP], workload=WORKLOAD, verified="r.json")  # type: ignore[arg-type]
    ours = report(cheap=(1, 2))
    assert pr.ProviderPolicy(verified=ours).ranking_report(KIMI) is None  # not asked
    policy = pr.ProviderPolicy(verified=ours, rank_per_accepted_sample=True)
    assert policy.ranking_report(KIMI) is ours
    assert policy.ranking_report("acme/other") is None


async def test_a_router_orders_openrouter_by_cost_per_accepted_sample(
    openrouter_sim_factory: SimFactory,
) -> None:
    sim = await openrouter_sim_factory(seed=1)
    async with pr.Catalog(base_url=sim.url, api_key=KEY) as catalog:
        listing = await catalog.endpoints(KIMI)
    int4 = pr.ProviderPolicy(exclude_below="int4")
    async with pr.Router(KIMI, policy=int4, base_url=sim.url, api_key=KEY) as router:
        cheapest = router.plan.order[0]
    # The cheapest endpoint passed a third of its canaries, every other one all of them.
    rates = {e.slug: (6, 6) for e in listing.endpoints}
    rates[cheapest] = (2, 6)
    verified = pr.VerificationReport(
        model=KIMI,
        reference="moonshotai",
        self_agreement=None,
        endpoints=tuple(
            pr.EndpointVerdict(tag=t, provider_name=t, passed=True, accepted=a, judged=j)
            for t, (a, j) in rates.items()
        ),
    )
    policy = pr.ProviderPolicy(
        exclude_below="int4", verified=verified, rank_per_accepted_sample=True
    )
    async with pr.Router(KIMI, policy=policy, base_url=sim.url, api_key=KEY) as router:
        order = list(router.plan.order)
        result = await router.chat([{"role": "user", "content": "Hi"}], max_tokens=4)
    assert order[0] != cheapest
    assert order[-1] == cheapest
    assert sim.requests[-1].routing["only"] == [order[0]]  # admitted to the best first
    assert result.provider != next(e.provider_name for e in listing.endpoints if e.slug == cheapest)


# --- the endpoints command ---------------------------------------------------------------


def _endpoints(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``provider-router endpoints KIMI ARGV`` on the bundled listing over loopback."""
    with serve() as server:
        code = main(["endpoints", KIMI, "--base-url", server.base_url, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_endpoints_ranks_per_accepted_sample_from_a_saved_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "verify.json"
    report(chutes=(1, 4), deepinfra=(4, 4), novita=(0, 4)).save(saved)
    base = ["--exclude-below", "int4"]
    code, out, _ = _endpoints(capsys, *base, "--json", "--verified", str(saved))
    assert code == 0
    plain = {e["tag"]: e for e in json.loads(out)["endpoints"]}
    assert plain["chutes"]["rank"] == 1  # shown, not ranked by it
    assert plain["chutes"]["cost_per_accepted_sample"] is None

    ranked = [*base, "--verified", str(saved), "--per-accepted-sample"]
    code, out, _ = _endpoints(capsys, *ranked, "--json")
    assert code == 0
    data = json.loads(out)
    assert data["policy"]["rank_per_accepted_sample"] is True
    by_tag = {e["tag"]: e for e in data["endpoints"]}
    assert by_tag["deepinfra"]["rank"] == 1
    assert by_tag["deepinfra"]["pass_rate"] == "1"
    assert by_tag["chutes"]["pass_rate"] == "0.25"
    chutes_cost = Decimal(by_tag["chutes"]["expected_cost_per_success"]) * 4
    assert Decimal(by_tag["chutes"]["cost_per_accepted_sample"]) == chutes_cost
    ranks = sorted((e["rank"], e["tag"]) for e in data["endpoints"] if e["allowed"])
    assert ranks[1][1] == "chutes"  # verified: before every unverified one
    assert ranks[-1][1] == "novita"  # none accepted: last

    code, out, _ = _endpoints(capsys, *ranked)
    assert code == 0
    assert "$/1k accepted" in out
    # Piped: one plain line per endpoint, cells two spaces apart, the rank first.
    cells = [re.split(r"\s{2,}", line.strip()) for line in out.splitlines()]
    rows = {c[1]: "  ".join(c) for c in cells if len(c) > 5 and c[0].isdigit()}
    assert "1/4" in rows["Chutes"]
    assert "not verified" in rows["Together"]
    assert "none accepted" in rows["Novita"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--per-accepted-sample"], "needs --verified"),
        (["--verified", "{other}"], "verified acme/other, not moonshotai/kimi-k2.5"),
        (["--verified", "{missing}"], "cannot read verification report"),
    ],
)
def test_endpoints_refuses_a_ranking_it_cannot_price(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    other = tmp_path / "other.json"
    report(model="acme/other").save(other)
    paths = {"other": str(other), "missing": str(tmp_path / "nope.json")}
    argv = [a.format(**paths) for a in argv]
    code, _, err = _endpoints(capsys, *argv)
    assert code != 0
    assert message in err


async def test_verify_then_rank_end_to_end(
    tmp_path: Path, openrouter_sim_factory: SimFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    sim = await openrouter_sim_factory(seed=4)
    verified = await pr.verify(KIMI, policy=pr.ProviderPolicy(exclude_below="int4"),
                               base_url=sim.url, api_key=KEY)  # fmt: skip
    assert all(v.judged and v.accepted == v.judged for v in verified.endpoints)
    async with pr.Catalog(base_url=sim.url, api_key=KEY) as catalog:
        listing = await catalog.endpoints(KIMI)
    allowed = pr.ProviderPolicy(exclude_below="int4").evaluate(listing).allowed
    ranked = await asyncio.to_thread(rank, allowed, workload=WORKLOAD, verified=verified)
    # Honest endpoints all pass everything: the same order as by price alone.
    assert [r.endpoint.slug for r in ranked] == [
        r.endpoint.slug for r in rank(allowed, workload=WORKLOAD)
    ]
    assert all(r.pass_rate == 1 for r in ranked)


BUNDLED_SNAPSHOT = Path(__file__).parents[2] / "provider_router/data/kimi-k2.5.endpoints.json"
UNIFORM = [
    "project", "--model", KIMI, "--datasets", "1", "--target-output-tokens", "1M",
    "--prompt-tokens", "200", "--completion-tokens", "2000", "--exclude-below", "int4",
    "--snapshot", str(BUNDLED_SNAPSHOT), "--json",
]  # fmt: skip


def test_project_routes_its_mix_per_accepted_sample(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(UNIFORM) == 0
    plain = json.loads(capsys.readouterr().out)["mix"]
    first = plain[0]["slug"]
    saved = tmp_path / "verify.json"
    rates = {m["slug"].replace("-", "_"): (4, 4) for m in plain}
    rates[first.replace("-", "_")] = (1, 4)  # the cheapest accepts a quarter
    report(**rates).save(saved)
    assert main([*UNIFORM, "--verified", str(saved)]) == 0
    assert json.loads(capsys.readouterr().out)["mix"] == plain  # applied, not ranked by
    assert main([*UNIFORM, "--verified", str(saved), "--per-accepted-sample"]) == 0
    mix = json.loads(capsys.readouterr().out)["mix"]
    assert mix[0]["slug"] != first
    assert [m["slug"] for m in mix][-1] == first
    assert main([*UNIFORM, "--per-accepted-sample"]) != 0
    assert "needs --verified" in capsys.readouterr().err
