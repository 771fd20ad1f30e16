"""pr.verify() holds Kimi's endpoints to Moonshot's own rules: fixed sampling parameters
(a request with temperature 1.1 must be refused) and prompt tokens counted as the
reference counts them (docs/policy.md, "Vendor rules")."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from _markets import edited_market

import provider_router as pr
from provider_router.checks.vendor_rules import KIMI_RULES, rules_for
from provider_router.cli import main
from provider_router.testing import SimulatorServer
from provider_router.testing.server import DEFAULT_TEST_KEY as KEY

MODEL = "moonshotai/kimi-k2.5"
SimFactory = Callable[..., Awaitable[SimulatorServer]]
FEW = pr.ProviderPolicy(only=["chutes", "deepinfra", "moonshotai"])
LONG_PROMPTS = [" ".join(["a careful sentence about tea and its history."] * 60)] * 4
"""Canaries of about 600 prompt tokens: a skew of a few tokens stays inside the ±2 %
ratio rule, and only the vendor's equality rule sees it."""


def _edited(tmp_path: Path, slug: str, **fields: Any) -> Path:
    def edit(endpoint: dict[str, Any]) -> None:
        if endpoint["slug"] == slug:
            endpoint.update(fields)

    return edited_market(tmp_path, edit)


def _charged(sim: SimulatorServer) -> Decimal:
    return sum((r.cost for r in sim.requests), Decimal(0))


def test_the_rules_apply_to_kimi_models_only() -> None:
    for model in (MODEL, "moonshotai/kimi-k2.5-0127", "moonshotai/kimi-k3:nitro"):
        assert rules_for(model) is KIMI_RULES, model
    for model in ("moonshotai/kimi-k2-0905", "openai/gpt-4o", "moonshotai/kimi-k2.50"):
        assert rules_for(model) is None, model


async def test_an_endpoint_that_serves_a_forbidden_temperature_fails_and_its_bill_counts(
    tmp_path: Path, openrouter_sim_factory: SimFactory
) -> None:
    market = _edited(tmp_path, "chutes", fixed_parameters={})  # accepts any value
    sim = await openrouter_sim_factory(market=market, seed=3)
    ledger = pr.MemoryLedger(Decimal(1))
    report = await pr.verify(
        MODEL, policy=FEW, base_url=sim.url, api_key=KEY, ledger=ledger, tool_samples=0
    )
    assert report.vendor_rules == KIMI_RULES.name
    assert report.failed == ("chutes",)
    chutes = report.verdict("chutes")
    assert chutes is not None
    assert chutes.params_accepted == (
        "temperature 1.1 in thinking mode",
        "temperature 1.1 in non-thinking mode",
    )
    assert "serves temperature 1.1 in thinking mode and temperature 1.1 in" in chutes.reason
    assert "requires refused" in chutes.reason
    for tag in ("deepinfra", "moonshotai"):
        verdict = report.verdict(tag)
        assert verdict is not None
        assert verdict.passed is True, verdict.reason
        assert verdict.params_accepted == ()
    # The two probes Chutes served are in its cost and on the ledger; refusals are free.
    probes = [r for r in sim.requests if r.max_tokens == 16]
    assert len(probes) == 2 * 3
    served = [r for r in probes if r.tag is not None]
    assert {r.tag for r in served} == {"chutes"}
    assert all(r.outcome == "refused_parameter" and r.cost == 0 for r in probes if r.tag is None)
    assert chutes.cost >= sum((r.cost for r in served), Decimal(0)) > 0
    assert report.cost == _charged(sim) == (await ledger.snapshot()).spent
    # Saved and read back.
    path = tmp_path / "report.json"
    report.save(path)
    again = pr.VerificationReport.load(path)
    assert again == report


async def test_prompt_tokens_off_by_a_few_fail_kimis_rule_not_the_ratio_rule(
    tmp_path: Path, openrouter_sim_factory: SimFactory
) -> None:
    market = _edited(tmp_path, "deepinfra", serves={"prompt_token_skew": 1.005})
    sim = await openrouter_sim_factory(market=market, seed=5)
    kwargs: dict[str, Any] = {
        "policy": FEW,
        "base_url": sim.url,
        "api_key": KEY,
        "prompts": LONG_PROMPTS,
        "samples": 4,
        "tool_samples": 0,
    }
    report = await pr.verify(MODEL, **kwargs)
    deepinfra = report.verdict("deepinfra")
    assert deepinfra is not None
    assert report.failed == ("deepinfra",)
    assert deepinfra.prompt_tokens_unequal == 4
    assert deepinfra.prompt_token_ratio is not None
    assert deepinfra.prompt_token_ratio.value < 1.01, "within the ±2 % ratio rule"
    assert "usage.prompt_tokens differs from the reference's on 4 of 4 canaries" in (
        deepinfra.reason
    )
    assert deepinfra.accepted == 0
    # A tolerance, or no vendor rules, lets it pass.
    lenient = pr.VerifyThresholds(max_prompt_token_difference=5)
    assert (await pr.verify(MODEL, thresholds=lenient, **kwargs)).failed == ()
    blind = await pr.verify(MODEL, vendor_rules=False, **kwargs)
    assert blind.failed == ()
    assert blind.vendor_rules is None


async def test_no_probe_is_sent_for_a_model_without_vendor_rules(
    tmp_path: Path, openrouter_sim_factory: SimFactory
) -> None:
    path = tmp_path / "market.yaml"
    path.write_text(
        "models:\n  - id: a/open\n    endpoints:\n"
        "      - provider: One\n        pricing: {prompt: 1, completion: 2}\n"
        "      - provider: Two\n        pricing: {prompt: 1, completion: 2}\n"
    )
    sim = await openrouter_sim_factory(market=pr.testing.Market.from_file(path))
    report = await pr.verify(
        "a/open", reference="one", base_url=sim.url, api_key=KEY, samples=3, tool_samples=0
    )
    assert report.vendor_rules is None
    assert not any(r.max_tokens == 16 for r in sim.requests)
    assert all(v.params_accepted == () for v in report.endpoints)


def test_reports_without_the_vendor_fields_still_load() -> None:
    old = {
        "version": 1,
        "model": MODEL,
        "reference": "moonshotai",
        "self_agreement": None,
        "endpoints": [{"tag": "chutes", "provider_name": "Chutes", "passed": True}],
    }
    report = pr.VerificationReport.from_json(old)
    assert report.vendor_rules is None
    verdict = report.verdict("chutes")
    assert verdict is not None
    assert (verdict.params_accepted, verdict.prompt_tokens_unequal) == ((), 0)
    with pytest.raises(pr.ConfigurationError, match="max_prompt_token_difference"):
        pr.VerifyThresholds(max_prompt_token_difference=-1)


async def test_the_cli_names_the_rules_and_the_violation(
    tmp_path: Path,
    openrouter_sim_factory: SimFactory,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    market = _edited(tmp_path, "chutes", fixed_parameters={})
    sim = await openrouter_sim_factory(market=market)
    monkeypatch.setenv("OPENROUTER_API_KEY", KEY)
    report = tmp_path / "r.json"
    argv = ["verify", MODEL, "--only", "chutes", "--only", "moonshotai", "--base-url", sim.url]
    argv += ["--tool-samples", "0", "--report", str(report)]

    def run() -> tuple[int, str]:
        code = main(argv)
        return code, capsys.readouterr().out

    code, out = await asyncio.to_thread(run)
    assert code == 1
    assert f"held to {KIMI_RULES.name}" in out
    assert "serves 2 fixed-parameter violation(s)" in out
    entry = next(e for e in json.loads(report.read_text())["endpoints"] if e["tag"] == "chutes")
    assert entry["params_accepted"] == list(KIMI_RULES.probes[i].label for i in range(2))
