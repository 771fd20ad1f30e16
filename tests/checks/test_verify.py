"""pr.verify(): each allowed endpoint measured against the reference on the local OpenRouter,
whose market can make an endpoint serve something other than what it declares."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from _markets import degraded_market

import provider_router as pr
from provider_router.catalog.verdicts import mean_estimate, share_estimate
from provider_router.checks.verify import agreement
from provider_router.cli import main
from provider_router.testing import SimulatorServer
from provider_router.testing.chat.synth import count_prompt_tokens
from provider_router.testing.server import DEFAULT_TEST_KEY as KEY

MODEL = "moonshotai/kimi-k2.5"
INT4 = pr.ProviderPolicy(exclude_below="int4")
SimFactory = Callable[..., Awaitable[SimulatorServer]]
MINE = [
    {"role": "user", "content": "Write one line about tea."},
    {"role": "user", "content": "And one about coffee, please, in a few more words."},
]


def charged(sim: SimulatorServer) -> Decimal:
    return sum((r.cost for r in sim.requests if r.cost is not None), Decimal(0))


async def test_a_secretly_degraded_provider_is_flagged_and_only_it_for_cents(
    tmp_path: Path, openrouter_sim_factory: SimFactory
) -> None:
    market = degraded_market(tmp_path, {"novita": {"agreement": 0.7}})
    sim = await openrouter_sim_factory(market=market, seed=11)
    ledger = pr.MemoryLedger(Decimal(1))
    report = await pr.verify(MODEL, policy=INT4, base_url=sim.url, api_key=KEY, ledger=ledger)

    assert report.vendor_rules == "Moonshot AI's Kimi Vendor Verifier"
    assert report.failed == ("novita",)
    novita = report.verdict("novita")
    assert novita is not None
    assert novita.agreement is not None
    assert novita.agreement.high < 0.9 < 1.0 == report.self_agreement.value  # type: ignore[union-attr]
    assert "greedy agreement" in novita.reason
    # Every allowed endpoint measured, the reference among them; the rejected ones not.
    tags = {v.tag for v in report.endpoints}
    assert "moonshotai" in tags
    assert not tags & {"fireworks", "baseten"}
    assert all(v.passed for v in report.endpoints if v.tag != "novita")
    # Canaries cost cents, and every cent is on the ledger and equals the bill.
    assert report.cost < Decimal("0.05")
    assert report.cost == charged(sim) == (await ledger.snapshot()).spent
    # Each canary was pinned to one endpoint, with no fallbacks (so were the vendor-rule
    # probes, which every endpoint here refused: served by none, billed nothing).
    for record in sim.requests:
        if record.routing is not None:
            assert len(record.routing["only"]) == 1
            assert record.routing.get("allow_fallbacks") is False
            if record.outcome == "refused_parameter":
                assert (record.tag, record.cost_units) == (None, 0)
                continue
            assert record.tag == record.routing["only"][0]


@pytest.mark.parametrize("seed", range(20))
async def test_no_honest_provider_is_flagged(seed: int, openrouter_sim_factory: SimFactory) -> None:
    sim = await openrouter_sim_factory(seed=seed)
    report = await pr.verify(MODEL, policy=INT4, base_url=sim.url, api_key=KEY, seed=seed)
    assert report.failed == ()
    assert all(v.passed is True for v in report.endpoints), [v.reason for v in report.endpoints]


async def test_broken_tool_calls_and_a_different_template_are_caught(
    tmp_path: Path, openrouter_sim_factory: SimFactory
) -> None:
    market = degraded_market(
        tmp_path,
        {"chutes": {"tool_schema_error_rate": 0.5}, "together": {"prompt_token_skew": 1.05}},
    )
    sim = await openrouter_sim_factory(market=market, seed=5)
    report = await pr.verify(MODEL, policy=INT4, base_url=sim.url, api_key=KEY)
    assert set(report.failed) == {"chutes", "together"}
    chutes, together = report.verdict("chutes"), report.verdict("together")
    assert chutes is not None
    assert together is not None
    assert "broke the schema" in chutes.reason
    assert chutes.agreement.value == 1.0
    assert "prompt tokens" in together.reason
    assert together.tool_validity.value == 1.0
    # Endpoints without tools are judged on text alone.
    assert report.verdict("parasail").tool_validity is None  # type: ignore[union-attr]


async def test_the_policy_rejects_what_failed_with_the_measured_reason(
    tmp_path: Path, openrouter_sim_factory: SimFactory
) -> None:
    market = degraded_market(tmp_path, {"novita": {"agreement": 0.6}})
    sim = await openrouter_sim_factory(market=market)
    report = await pr.verify(MODEL, policy=INT4, base_url=sim.url, api_key=KEY)
    path = tmp_path / "verify.json"
    report.save(path)
    loaded = pr.VerificationReport.load(path)
    assert loaded == report

    async with pr.Catalog(base_url=sim.url, api_key=KEY) as catalog:
        listing = await catalog.endpoints(MODEL)
    decisions = {
        d.endpoint.slug: d
        for d in pr.ProviderPolicy(exclude_below="int4", verified=loaded).evaluate(listing)
    }
    novita = decisions["novita"]
    assert not novita.allowed
    assert novita.code is pr.DecisionCode.VERIFICATION_FAILED
    assert novita.reason.startswith("failed verification: greedy agreement")
    assert decisions["chutes"].allowed
    assert "passed verification" in decisions["chutes"].reason
    assert decisions["fireworks"].code is pr.DecisionCode.QUANTIZATION_BELOW_MINIMUM
    # A Router under that policy never sends to it.
    async with pr.Router(
        model=MODEL,
        policy=pr.ProviderPolicy(exclude_below="int4", verified=loaded),
        base_url=sim.url,
        api_key=KEY,
    ) as router:
        assert "Novita" not in router.plan.allowed_providers
        assert "novita" not in (await router.chat([{"role": "user", "content": "Hi"}])).provider


def test_a_report_of_another_model_is_ignored_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    report = pr.VerificationReport(
        model="acme/other",
        reference="acme",
        self_agreement=None,
        endpoints=(pr.EndpointVerdict(tag="chutes", provider_name="Chutes", passed=False),),
    )
    endpoint = pr.Endpoint.model_validate(
        {"name": "x", "provider_name": "Chutes", "tag": "chutes", "quantization": "int4",
         "pricing": {"prompt": "0.000001", "completion": "0.000002"}}
    )  # fmt: skip
    assert pr.ProviderPolicy(verified=report).decide(endpoint, model_id=MODEL).allowed
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": 1, "model": MODEL}))
    with pytest.raises(pr.ConfigurationError, match=r"bad\.json is not a verification report"):
        pr.VerificationReport.load(bad)
    with pytest.raises(pr.ConfigurationError, match="verified must be a VerificationReport"):
        pr.ProviderPolicy(verified="verify.json")  # type: ignore[arg-type]


async def test_a_model_without_its_authors_endpoint_needs_a_named_reference(
    openrouter_sim_factory: SimFactory,
) -> None:
    sim = await openrouter_sim_factory()
    policy = pr.ProviderPolicy(exclude_providers=["moonshotai"])
    async with pr.Catalog(base_url=sim.url, api_key=KEY) as catalog:
        listing = await catalog.endpoints(MODEL)
    stripped = listing.model_copy(
        update={"endpoints": tuple(e for e in listing.endpoints if e.slug != "moonshotai")}
    )
    with pytest.raises(pr.ConfigurationError, match="name a reference endpoint"):
        await pr.verify(MODEL, listing=stripped, base_url=sim.url, api_key=KEY)
    with pytest.raises(pr.ConfigurationError, match="no endpoint 'nobody'"):
        await pr.verify(MODEL, reference="nobody", base_url=sim.url, api_key=KEY)
    report = await pr.verify(
        MODEL, policy=policy, listing=stripped, reference="deepinfra", base_url=sim.url,
        api_key=KEY, samples=3, tool_samples=0,
    )  # fmt: skip
    assert report.reference == "deepinfra"
    assert report.failed == ()


async def test_the_users_own_prompts_are_the_canaries(openrouter_sim_factory: SimFactory) -> None:
    sim = await openrouter_sim_factory()
    mine = [MINE[0]["content"], [MINE[1]]]
    await pr.verify(
        MODEL, policy=pr.ProviderPolicy(only=["chutes"]), prompts=mine, samples=2,
        tool_samples=0, base_url=sim.url, api_key=KEY, vendor_rules=False,
    )  # fmt: skip
    chats = [r for r in sim.requests if r.route == "chat"]
    expected = {count_prompt_tokens(pr_messages) for pr_messages in ([m] for m in MINE)}
    assert {r.prompt_tokens for r in chats} == expected
    assert len(chats) == 2 * 3  # chutes once, the reference twice


def test_the_simulated_degradation_is_the_same_streamed_or_not_and_under_a_seed() -> None:
    from provider_router.testing.market.degradation import Serves, request_salt

    serves = Serves(agreement=0.7)
    salt = request_salt(3, "novita", [{"role": "user", "content": "Hi"}])
    whole = serves.text(0, 200, salt)
    assert "".join(serves.text(i, min(i + 7, 200), salt) for i in range(0, 200, 7)) == whole
    assert serves.text(0, 200, salt) == whole
    assert serves.text(0, 200, salt + 1) != whole
    honest = Serves().text(0, 200, salt).split()
    share = agreement(whole.split(), honest)
    assert 0.6 < share < 0.8
    with pytest.raises(ValueError, match=r"agreement must be within 0\.\.1"):
        Serves(agreement=1.5)


def test_a_bad_serves_field_in_a_market_file_is_named(tmp_path: Path) -> None:
    path = degraded_market(tmp_path, {"novita": {"agreement": 2}})
    with pytest.raises(pr.DataFileError, match=r"serves.*agreement"):
        SimulatorServer(market=path)
    path = degraded_market(tmp_path, {"novita": {"honesty": 0.5}})  # type: ignore[dict-item]
    with pytest.raises(pr.DataFileError, match="honesty"):
        SimulatorServer(market=path)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([1.0, 1.0, 1.0], (1.0, 1.0, 1.0)),
        ([0.5, 0.7], (0.6, 0.0, 1.0)),  # t(1) = 12.706: clipped to the bounds
        ([0.6, 0.7, 0.8], (0.7, 0.4516, 0.9484)),
    ],
)
def test_mean_estimate(values: list[float], expected: tuple[float, float, float]) -> None:
    estimate = mean_estimate(values, bounds=(0.0, 1.0))
    assert (estimate.value, estimate.low, estimate.high) == pytest.approx(expected, abs=1e-4)
    assert estimate.n == len(values)


def test_share_estimate_is_wilsons() -> None:
    none = share_estimate(0, 10)
    assert none.value == 0
    assert none.low == 0
    assert none.high == pytest.approx(0.2775, abs=1e-4)
    some = share_estimate(8, 10)
    assert (some.low, some.high) == pytest.approx((0.4902, 0.9433), abs=1e-4)
    with pytest.raises(ValueError, match="no events"):
        share_estimate(0, 0)


def test_agreement_counts_matching_tokens_in_order() -> None:
    assert agreement(["a", "b", "c", "d"], ["a", "b", "c", "d"]) == 1.0
    assert agreement(["a", "x", "c", "d"], ["a", "b", "c", "d"]) == 0.75
    assert agreement(["a", "b"], ["a", "b", "c", "d"]) == 0.5  # stopping early diverges
    assert agreement([], []) == 1.0


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().out


async def test_the_cli_prints_a_line_per_endpoint_saves_the_report_and_exits_1_on_a_failure(
    tmp_path: Path,
    openrouter_sim_factory: SimFactory,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio

    market = degraded_market(tmp_path, {"novita": {"agreement": 0.5}})
    sim = await openrouter_sim_factory(market=market)
    monkeypatch.setenv("OPENROUTER_API_KEY", KEY)
    report = tmp_path / "r.json"
    argv = ["verify", MODEL, "--exclude-below", "int4", "--base-url", sim.url]
    argv += ["--report", str(report), "--tool-samples", "0", "--top-logprobs", "3"]
    code, out = await asyncio.to_thread(run_cli, argv, capsys)
    assert code == 1
    marks = {"pass", "FAIL", "?"}
    lines = {w[1]: w[0] for w in (line.split() for line in out.splitlines()) if w and w[0] in marks}
    assert lines["novita"] == "FAIL"
    assert lines["chutes"] == "pass"
    assert "failed: novita" in out
    data: dict[str, Any] = json.loads(report.read_text())
    assert [v["tag"] for v in data["endpoints"] if v["passed"] is False] == ["novita"]
    assert pr.VerificationReport.load(report).failed == ("novita",)
    # The top-k divergence where logprobs are listed, "not measured" where not, the pass
    # rate on every line; the same in the saved report.
    assert "self-divergence 0.000" in out
    rows = out.splitlines()
    at = {w[1]: i for i, w in enumerate(line.split() for line in rows) if w and w[0] in marks}
    # verdict, endpoint, agreement, divergence, tools, prompt ratio, canaries passed
    novita = re.split(r"\s{2,}", rows[at["novita"]].strip())
    assert novita[3].startswith("0.")  # the divergence, measured
    why = itertools.takewhile(lambda line: line.startswith("   "), rows[at["novita"] + 1 :])
    assert "top-k divergence" in " ".join(line.strip() for line in why)  # the why, below
    assert re.split(r"\s{2,}", rows[at["chutes"]].strip())[-1] == "8/8"  # canaries passed
    unmeasured = "top-k divergence: not measured: Chutes lists no logprobs"
    assert rows[at["chutes"] + 1].strip() == unmeasured
    assert data["top_logprobs"] == 3
    assert data["self_divergence"]["value"] == 0.0
    entry = next(e for e in data["endpoints"] if e["tag"] == "chutes")
    assert entry["unmeasured"] == [unmeasured]
    assert (entry["accepted"], entry["judged"], entry["pass_rate"]["value"]) == (8, 8, 1.0)
    code, out = await asyncio.to_thread(run_cli, [*argv[:-2], "--no-logprobs"], capsys)
    assert "not asked for" in out
    assert json.loads(report.read_text())["top_logprobs"] is None
