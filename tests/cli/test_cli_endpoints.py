"""`provider-router endpoints` and `demo`, called through ``main(argv)`` against a local server."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from _metadata_server import BUNDLED, Canned, MetadataServer, serve

from provider_router import Catalog, ProviderPolicy, Workload, rank
from provider_router._format import format_usd
from provider_router.catalog.records import ModelEndpoints
from provider_router.cli import main

KIMI = "moonshotai/kimi-k2.5"


@pytest.fixture
def server() -> Iterator[MetadataServer]:
    with serve() as running:
        yield running


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_table_shows_every_endpoint_with_verdict_and_rank(
    server: MetadataServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        capsys, "endpoints", KIMI, "--exclude-below", "int4", "--base-url", server.base_url
    )
    assert code == 0
    # Piped, the table is plain: one line per endpoint, cells two spaces apart, its
    # reason on the line below.
    rows = out.splitlines()
    cells = {tuple(re.split(r"\s{2,}", line.strip())): i for i, line in enumerate(rows)}
    lines = {c[1] if c[0].isdigit() else c[0]: i for c, i in cells.items() if len(c) >= 8}
    assert set(lines) >= {"Chutes", "Fireworks", "BaseTen", "Moonshot AI", "Venice"}
    chutes = re.split(r"\s{2,}", rows[lines["Chutes"]].strip())
    # rank, provider, tag, quant, $/M in, $/M out, uptime, status, verdict, $/1k req
    assert chutes == [
        "1",
        "Chutes",
        "chutes",
        "int4",
        "$0.45",
        "$2.20",
        "99.0%",
        "0 ok",
        "allowed",
        "$4.54",
    ]
    assert "rejected" in rows[lines["Fireworks"]]
    assert "nvfp4 is below the int4 floor" in rows[lines["Fireworks"] + 1]
    assert "-5 down" in rows[lines["BaseTen"]]
    assert "best: Chutes (chutes) at $0.004490 per request" in out


def test_json_output_is_machine_readable_and_exact(
    server: MetadataServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        capsys,
        "endpoints",
        KIMI,
        "--exclude-below",
        "int4",
        "--json",
        "--base-url",
        server.base_url,
        "--prompt-tokens",
        "1000",
        "--completion-tokens",
        "1000",
    )
    assert code == 0
    report = json.loads(out)
    assert report["model"] == KIMI
    assert report["policy"]["exclude_below"] == "int4"
    assert report["workload"] == {"prompt_tokens": 1000, "completion_tokens": 1000}
    by_tag = {e["tag"]: e for e in report["endpoints"]}
    assert by_tag["chutes"]["rank"] == 1
    assert by_tag["chutes"]["cost_per_request"] == "0.00265"  # 1000 × 0.45e-6 + 1000 × 2.2e-6
    assert by_tag["chutes"]["prompt_per_million"] == "0.45"
    assert by_tag["fireworks"]["allowed"] is False
    assert by_tag["fireworks"]["code"] == "quantization_below_minimum"
    assert by_tag["fireworks"]["rank"] is None
    assert by_tag["atlas-cloud"]["quantization"] is None
    assert by_tag["atlas-cloud"]["effective_quantization"] == "int4"
    ranks = [e["rank"] for e in report["endpoints"] if e["allowed"]]
    assert ranks == list(range(1, 10))


def test_policy_flags_reach_the_policy(
    server: MetadataServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        capsys,
        "endpoints",
        KIMI,
        "--json",
        "--base-url",
        server.base_url,
        "--unknown",
        "reject",
        "--exclude-provider",
        "chutes",
        "--min-uptime",
        "99",
        "--allow-down",
    )
    assert code == 0
    by_tag = {e["tag"]: e for e in json.loads(out)["endpoints"]}
    assert by_tag["chutes"]["code"] == "provider_excluded"
    assert by_tag["venice"]["code"] == "quantization_unknown"
    assert by_tag["novita"]["code"] == "uptime_below_minimum"
    assert by_tag["fireworks"]["allowed"] is True  # no floor given
    assert by_tag["baseten"]["code"] == "uptime_below_minimum"  # down is allowed, 72 % is not
    assert {t for t, e in by_tag.items() if e["allowed"]} == {
        "deepinfra",
        "together",
        "moonshotai",
        "parasail",
        "fireworks",
    }


def test_snapshot_flag_works_offline(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "endpoints", KIMI, "--json", "--snapshot", str(BUNDLED))
    assert code == 0
    assert len(json.loads(out)["endpoints"]) == 11


def test_nothing_allowed_is_said_on_stderr(
    server: MetadataServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(
        capsys, "endpoints", KIMI, "--only", "nobody", "--base-url", server.base_url
    )
    assert code == 0
    assert "no endpoint passes the policy" in out
    assert "no endpoint passes the policy" in err


@pytest.mark.parametrize(
    ("canned", "message"),
    [
        (
            Canned(404, b'{"error":{"code":404,"message":"Resource not found"}}'),
            "endpoints: Resource not found: no model",
        ),
        (Canned(200, b"<html>"), "expected an endpoints listing, got a body that is not JSON"),
    ],
)
def test_server_errors_are_one_line_errors(
    server: MetadataServer, capsys: pytest.CaptureFixture[str], canned: Canned, message: str
) -> None:
    server.routes["/models/moonshotai/kimi-k2.5/endpoints"] = canned
    code, out, err = run(capsys, "endpoints", KIMI, "--base-url", server.base_url)
    assert code == 1
    assert out == ""
    assert err.startswith("provider-router: error: ")
    assert message in err
    assert "Traceback" not in err


def test_a_bad_snapshot_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "market.json"
    bad.write_text("{\n  nope\n}")
    code, _, err = run(capsys, "endpoints", KIMI, "--snapshot", str(bad))
    assert code == 1
    assert f"{bad}:2: not valid JSON" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--exclude-below", "int3"], "invalid choice: 'int3'"),
        (["--unknown", "maybe"], "invalid choice: 'maybe'"),
        (["--min-uptime", "120"], "a percentage must be 0..100"),
        (["--prompt-tokens", "-5"], "a token count must be ≥ 0"),
        (["--completion-tokens", "lots"], "not a whole number of tokens"),
        (["--snapshot", "a.json", "--base-url", "http://x"], "not allowed with argument"),
    ],
)
def test_bad_flags_are_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["endpoints", KIMI, *argv])
    assert caught.value.code == 2
    assert message in capsys.readouterr().err


def test_demo_prints_verdicts_and_ranking_offline(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "demo")
    assert code == 0
    # The market comes from the in-process local OpenRouter, read like the real one.
    assert "Local OpenRouter at http://127.0.0.1:" in out
    assert "ProviderPolicy(exclude_below='int4')" in out
    assert "9 allowed" in out
    assert "nvfp4 is below the int4 floor" in out
    assert "best: Chutes (chutes)" in out


def test_the_tables_cost_column_is_the_attribute_of_the_same_name(
    server: MetadataServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """``$/1k ok req`` in the table is ``effective_cost_per_1k_requests``, as the README
    prints it; ``cost_per_1k_requests`` (without failures) reads without padding."""
    code, out, _ = run(
        capsys, "endpoints", KIMI, "--exclude-below", "int4", "--base-url", server.base_url
    )
    assert code == 0
    assert "$/1k ok req" in out
    assert "$/1k req " not in out
    listing = asyncio.run(_listing(server))
    decisions = ProviderPolicy(exclude_below="int4").evaluate(listing)
    best = rank(decisions.allowed, workload=Workload(prompt_tokens=200, completion_tokens=2000))[0]
    chutes = next(line for line in out.splitlines() if line.split()[1:2] == ["Chutes"])
    assert format_usd(best.effective_cost_per_1k_requests) in chutes  # $4.54
    assert str(best.cost_per_1k_requests) == "4.49"  # not 4.49000000
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert "ranked[0].effective_cost_per_1k_requests  # the table's $/1k ok req" in readme


async def _listing(server: MetadataServer) -> ModelEndpoints:
    async with Catalog(base_url=server.base_url) as catalog:
        return await catalog.endpoints(KIMI)
