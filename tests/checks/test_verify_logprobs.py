"""Top-k divergence in pr.verify(): the client reads logprobs, the distance is a lower bound
of the true one, prefixes are aligned, and endpoints without logprobs say "not measured"."""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from _markets import degraded_market, edited_market
from hypothesis import given
from hypothesis import strategies as st

import provider_router as pr
from provider_router.checks.judge import aligned_positions, canary_divergence, top_k_distance
from provider_router.client.results import TokenLogprob, parse_logprobs
from provider_router.testing import SimulatorServer
from provider_router.testing.server import DEFAULT_TEST_KEY as KEY

MODEL = "moonshotai/kimi-k2.5"
INT4 = pr.ProviderPolicy(exclude_below="int4")
SimFactory = Callable[..., Awaitable[SimulatorServer]]
HI = [{"role": "user", "content": "hi"}]


def tok(token: str, *top: tuple[str, float]) -> TokenLogprob:
    """A position whose alternatives are given as probabilities (the first is chosen)."""
    pairs = tuple((t, math.log(p)) for t, p in top) or ((token, 0.0),)
    return TokenLogprob(token, dict(pairs)[token], pairs)


# --- the client reads them -------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_the_router_returns_the_logprobs_an_endpoint_sent(
    stream: bool, openrouter_sim_factory: SimFactory
) -> None:
    sim = await openrouter_sim_factory(seed=3)
    policy = pr.ProviderPolicy(only=["moonshotai"])
    async with pr.Router(MODEL, policy=policy, base_url=sim.url, api_key=KEY) as router:
        params: dict[str, Any] = {"max_tokens": 6, "logprobs": True, "top_logprobs": 3}
        if stream:
            async with router.stream(HI, **params) as chunks:
                async for _ in chunks:
                    pass
            result = chunks.result
        else:
            result = await router.chat(HI, **params)
        assert result is not None
        assert result.logprobs is not None
        assert len(result.logprobs) == 6
        assert "".join(t.token for t in result.logprobs) == result.text
        assert all(len(t.top) == 3 and t.top[0] == (t.token, t.logprob) for t in result.logprobs)
        plain = await router.chat(HI, max_tokens=6)
        assert plain.logprobs is None


def test_malformed_logprob_entries_are_left_out_not_raised() -> None:
    raw = {
        "content": [
            {"token": " a", "logprob": -0.5, "bytes": None, "top_logprobs": [
                {"token": " a", "logprob": -0.5}, {"token": " b", "logprob": "x"},
                {"token": 3, "logprob": -1.0}, {"token": " c", "logprob": -2.0},
            ]},
            {"token": " b", "logprob": float("nan")},
            {"token": " c", "logprob": 0.5},
            {"token": " d", "logprob": True},
            "junk",
            {"token": " e", "logprob": -1},
        ]
    }  # fmt: skip
    parsed = parse_logprobs(raw)
    assert parsed == (
        TokenLogprob(" a", -0.5, ((" a", -0.5), (" c", -2.0))),
        TokenLogprob(" e", -1.0, ()),
    )
    assert parse_logprobs(None) is None
    assert parse_logprobs({"content": None}) is None
    assert parse_logprobs([1]) is None


# --- the distance ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (tok(" a", (" a", 0.6), (" b", 0.3)), tok(" a", (" a", 0.6), (" b", 0.3)), 0.0),
        # the same shared tokens, mass moved between them
        (tok(" a", (" a", 0.6), (" b", 0.3)), tok(" a", (" a", 0.4), (" b", 0.3)), 0.2),
        # a greedy token the other side does not list: at most its remainder 0.1 there
        (tok(" a", (" a", 0.6), (" b", 0.3)), tok(" c", (" c", 0.6), (" b", 0.3)), 0.5),
        # no alternatives (top_logprobs 0): different chosen tokens still show
        (tok(" a", (" a", 0.9)), tok(" c", (" c", 0.9)), 0.8),
    ],
)
def test_top_k_distance_table(a: TokenLogprob, b: TokenLogprob, expected: float) -> None:
    assert top_k_distance(a, b) == pytest.approx(expected)
    assert top_k_distance(b, a) == pytest.approx(expected)


@st.composite
def _distribution(draw: st.DrawFn) -> dict[str, float]:
    weights = draw(st.lists(st.floats(0.01, 1.0), min_size=8, max_size=8))
    total = math.fsum(weights)
    return {f" w{i}": w / total for i, w in enumerate(weights)}


def _top(distribution: dict[str, float], k: int) -> TokenLogprob:
    ranked = sorted(distribution.items(), key=lambda item: (-item[1], item[0]))[:k]
    pairs = tuple((t, math.log(p)) for t, p in ranked)
    return TokenLogprob(pairs[0][0], pairs[0][1], pairs)


@given(_distribution(), _distribution(), st.integers(1, 8), st.integers(1, 8))
def test_the_distance_never_exceeds_the_full_vocabularys(
    p: dict[str, float], q: dict[str, float], k: int, j: int
) -> None:
    true = 0.5 * math.fsum(abs(p[t] - q[t]) for t in p)
    measured = top_k_distance(_top(p, k), _top(q, j))
    assert 0.0 <= measured <= true + 1e-9
    if k == j == 8:  # everything listed: the bound is the distance
        assert measured == pytest.approx(true)


def test_prefixes_align_up_to_and_including_the_first_different_token() -> None:
    same = [tok(" x"), tok(" y"), tok(" z")]
    other = [tok(" x"), tok(" q"), tok(" z")]
    assert aligned_positions(same, same, 64) == 3
    assert aligned_positions(same, other, 64) == 2
    assert aligned_positions(same, same, 1) == 1
    assert aligned_positions(same, same[:2], 64) == 2
    assert aligned_positions([], same, 64) == 0
    assert canary_divergence([], same, 64) is None
    # Positions after the first difference are never compared: the third differs
    # wildly, but its prefix is not the reference's.
    wild = [tok(" x"), tok(" q", (" q", 0.9)), tok(" w", (" w", 0.99))]
    assert canary_divergence(wild, same, 64) == pytest.approx(
        (0.0 + top_k_distance(wild[1], same[1])) / 2
    )


# --- in verify() ---------------------------------------------------------------------------


async def test_a_degraded_endpoint_fails_on_divergence_alone(
    tmp_path: Path, openrouter_sim_factory: SimFactory
) -> None:
    market = degraded_market(tmp_path, {"novita": {"agreement": 0.7}})
    sim = await openrouter_sim_factory(market=market, seed=11)
    blind = pr.VerifyThresholds(min_agreement_ratio=0.0)  # agreement cannot fail
    report = await pr.verify(
        MODEL, policy=INT4, base_url=sim.url, api_key=KEY, thresholds=blind, vendor_rules=False
    )  # the canaries alone in the request log

    assert report.failed == ("novita",)
    novita = report.verdict("novita")
    assert novita is not None
    assert novita.divergence is not None
    assert report.self_divergence is not None
    assert novita.divergence.low > report.self_divergence.value + blind.max_divergence_excess
    assert novita.reasons == (novita.reason,)
    assert "top-k divergence" in novita.reason
    # Asked for exactly where both the endpoint and the reference list logprobs.
    for record in sim.requests:
        if record.routing is None or record.tools:
            continue
        tag = record.routing["only"][0]
        lists = tag in {"moonshotai", "deepinfra", "together", "novita"}
        assert record.logprobs == (5 if lists else None), tag


async def test_endpoints_without_logprobs_say_not_measured_and_are_judged_on_the_rest(
    tmp_path: Path, openrouter_sim_factory: SimFactory
) -> None:
    market = degraded_market(tmp_path, {"chutes": {"agreement": 0.7}})
    sim = await openrouter_sim_factory(market=market, seed=11)
    report = await pr.verify(MODEL, policy=INT4, base_url=sim.url, api_key=KEY)

    chutes, atlas = report.verdict("chutes"), report.verdict("atlas-cloud")
    assert chutes is not None
    assert atlas is not None
    for verdict in (chutes, atlas):
        assert verdict.divergence is None
        assert verdict.unmeasured == (
            f"top-k divergence: not measured: {verdict.provider_name} lists no logprobs",
        )
    assert chutes.passed is False
    assert "greedy agreement" in chutes.reason
    assert atlas.passed is True  # not a fail either
    measured = report.verdict("deepinfra")
    assert measured is not None
    assert measured.unmeasured == ()
    assert measured.divergence is not None
    assert measured.divergence.value == 0.0
    assert measured.passed is True


async def test_a_reference_without_logprobs_measures_no_divergence(
    tmp_path: Path, openrouter_sim_factory: SimFactory
) -> None:
    def no_logprobs_at_moonshot(endpoint: dict[str, Any]) -> None:
        if endpoint["slug"] == "moonshotai":
            params = endpoint["supported_parameters"]
            endpoint["supported_parameters"] = [p for p in params if "logprobs" not in p]

    sim = await openrouter_sim_factory(
        market=edited_market(tmp_path, no_logprobs_at_moonshot), seed=2
    )
    report = await pr.verify(MODEL, policy=INT4, base_url=sim.url, api_key=KEY)
    assert report.self_divergence is None
    assert all(v.divergence is None for v in report.endpoints)
    deepinfra = report.verdict("deepinfra")
    assert deepinfra is not None
    assert deepinfra.passed is True
    assert deepinfra.unmeasured == (
        "top-k divergence: not measured: the reference Moonshot AI lists no logprobs",
    )
    assert all(r.logprobs is None for r in sim.requests)


async def test_top_logprobs_none_asks_for_none_and_says_so(
    openrouter_sim_factory: SimFactory,
) -> None:
    sim = await openrouter_sim_factory(seed=2)
    report = await pr.verify(MODEL, policy=INT4, base_url=sim.url, api_key=KEY, top_logprobs=None)
    assert report.top_logprobs is None
    assert all("top_logprobs=None" in v.unmeasured[0] for v in report.endpoints)
    assert all(r.logprobs is None for r in sim.requests)


@pytest.mark.parametrize("bad", [-1, 21, True])
async def test_a_bad_top_logprobs_is_refused_before_any_request(bad: int) -> None:
    with pytest.raises(pr.ConfigurationError, match="top_logprobs"):
        await pr.verify(MODEL, top_logprobs=bad, base_url="http://127.0.0.1:9")


# --- saved -------------------------------------------------------------------------------


def test_a_report_saved_before_logprobs_still_loads(tmp_path: Path) -> None:
    old = {
        "version": 1, "model": MODEL, "reference": "moonshotai", "self_agreement": None,
        "endpoints": [{"tag": "chutes", "provider_name": "Chutes", "passed": True}],
    }  # fmt: skip
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    report = pr.VerificationReport.load(path)
    chutes = report.verdict("chutes")
    assert chutes is not None
    assert (chutes.divergence, chutes.unmeasured, chutes.pass_rate) == (None, (), None)
    assert report.self_divergence is None
    old["endpoints"][0] |= {"accepted": 5, "judged": 4}  # type: ignore[index]
    path.write_text(json.dumps(old))
    with pytest.raises(pr.ConfigurationError, match="accepted 5 of only 4"):
        pr.VerificationReport.load(path)
