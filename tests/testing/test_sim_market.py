"""The market file: the bundled default, and clear errors for bad files."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

from provider_router import DataFileError
from provider_router.testing import Market

TAGS = [
    "chutes",
    "deepinfra",
    "siliconflow",
    "atlas-cloud",
    "together",
    "novita",
    "parasail",
    "moonshotai",
    "venice",
    "fireworks",
    "baseten",
]


def test_default_market_models_kimi_k2_5() -> None:
    market = Market.default()
    model = market.models["moonshotai/kimi-k2.5"]
    assert [e.tag for e in model.endpoints] == TAGS
    by_tag = {e.tag: e for e in model.endpoints}
    chutes = by_tag["chutes"]
    assert (chutes.quantization, chutes.prompt, chutes.completion, chutes.input_cache_read) == (
        "int4",
        Decimal("0.45"),
        Decimal("2.20"),
        Decimal("0.15"),
    )
    assert by_tag["fireworks"].quantization == "nvfp4"
    assert (by_tag["baseten"].quantization, by_tag["baseten"].status, by_tag["baseten"].down) == (
        "fp4",
        -5,
        True,
    )
    assert by_tag["moonshotai"].provider_name == "Moonshot AI"
    assert {e.uptime_last_30m for e in model.endpoints} >= {99.0, 95.6, 100}
    completion = [e.completion for e in model.endpoints if e.quantization in ("int4", "unknown")]
    assert min(completion) == Decimal("2.20")
    assert max(completion) == Decimal("2.85")


def test_listing_prices_are_exact_per_token_strings() -> None:
    body = json.loads(Market.default().endpoints_bodies["moonshotai/kimi-k2.5"])
    chutes = body["data"]["endpoints"][0]
    assert chutes["pricing"] == {
        "prompt": "0.00000045",
        "completion": "0.0000022",
        "input_cache_read": "0.00000015",
        "discount": 0.0,
    }
    assert chutes["name"] == "Chutes | moonshotai/kimi-k2.5-0127"


def test_json_market_and_defaults(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text(
        json.dumps(
            {
                "models": [
                    {
                        "id": "a/b",
                        "endpoints": [
                            {"provider": "Deep Infra", "pricing": {"prompt": 1, "completion": "2"}}
                        ],
                    }
                ]
            }
        )
    )
    market = Market.from_file(path)
    endpoint = market.models["a/b"].endpoints[0]
    assert (endpoint.slug, endpoint.tag, endpoint.prompt_units) == (
        "deepinfra",
        "deepinfra",
        1_000_000,
    )
    assert [p["slug"] for p in json.loads(market.providers_body)["data"]] == ["deepinfra"]


HEAD = "models:\n  - id: a/b\n    endpoints:\n      - provider: X\n"


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        (
            HEAD + "        pricing: {prompt: 1}\n",
            5,
            "pricing.completion: is required",
        ),
        (
            HEAD + "        quantization: int3\n        pricing: {prompt: 1, completion: 1}\n",
            5,
            "quantization: unknown value 'int3'",
        ),
        ("models:\n  - id: nope\n    endpoints: []\n", 2, "models[0].id"),
        ("models:\n  - id: a/b\n    endpoints: []\n", 3, "at least one endpoint"),
        ("models:\n  - id: a/b\n    colour: red\n", 3, "colour: unknown field"),
        (
            HEAD + "        pricing: {prompt: 1, completion: -1}\n",
            5,
            "completion: must be at least 0",
        ),
        (
            HEAD + "        pricing: {prompt: '0.0000000000001', completion: 1}\n",
            5,
            "finer than 1e-12",
        ),
        (
            "models:\n  - id: a/b\n    endpoints:\n"
            "      - {provider: X, pricing: {prompt: 1, completion: 1}}\n"
            "      - {provider: X, pricing: {prompt: 1, completion: 1}}\n",
            5,
            "duplicate endpoint tag 'x'",
        ),
        (
            HEAD + "        supports_tool_choice: [auto, sometimes]\n"
            "        pricing: {prompt: 1, completion: 1}\n",
            5,
            "supports_tool_choice: unknown variant(s) ['sometimes']",
        ),
        ("models: [\n", 2, "invalid YAML"),
        ("models: 3\n", 1, "must be a list"),
    ],
)
def test_bad_market_files_name_file_line_and_field(
    tmp_path: Path, text: str, line: int, fragment: str
) -> None:
    path = tmp_path / "market.yaml"
    path.write_text(text)
    with pytest.raises(DataFileError) as caught:
        Market.from_file(path)
    assert caught.value.line == line, str(caught.value)
    assert str(caught.value).startswith(f"{path}:{line}: ")
    assert fragment in str(caught.value)


def test_missing_market_file(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match="no such file"):
        Market.from_file(tmp_path / "absent.yaml")


def test_discount_is_written_as_real_listings_write_it() -> None:
    """Captured listings send ``"discount":0`` (an integer), never ``0.0``."""
    body = Market.default().endpoints_bodies["moonshotai/kimi-k2.5"]
    assert b'"discount": 0}' in body or b'"discount":0}' in body
    parsed = json.loads(body, parse_float=Decimal)
    for endpoint in parsed["data"]["endpoints"]:
        assert type(endpoint["pricing"]["discount"]) is int
    fixture = Path(__file__).parents[1] / "data" / "fixtures"
    captured = next(fixture.glob("endpoints_google-gemini-2.5-pro-preview_2025-05-23*.json"))
    real = json.loads(captured.read_text(), parse_float=Decimal)
    assert type(real["data"]["endpoints"][0]["pricing"]["discount"]) is int


def test_tool_choice_support_service_tier_and_model_dates_from_the_market_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "market.yaml"
    path.write_text(
        "models:\n  - id: a/b\n    knowledge_cutoff: '2025-01-31'\n    endpoints:\n"
        "      - provider: X\n        pricing: {prompt: 1, completion: 1}\n"
        "        supported_parameters: [tools, tool_choice]\n"
        "        supports_tool_choice: [none, auto]\n        service_tier: flex\n"
        "      - provider: Y\n        pricing: {prompt: 1, completion: 1}\n"
        "        supported_parameters: [tools, tool_choice]\n"
        "      - provider: Z\n        pricing: {prompt: 1, completion: 1}\n"
    )
    market = Market.from_file(path)
    x, y, z = json.loads(market.endpoints_bodies["a/b"])["data"]["endpoints"]
    assert x["supports_tool_choice"] == {
        "none": True,
        "auto": True,
        "required": False,
        "function": False,
    }
    assert x["service_tier"] == "flex"
    assert all(y["supports_tool_choice"].values())
    assert "service_tier" not in y, "a standard endpoint's real listing has no service_tier"
    assert not any(z["supports_tool_choice"].values())
    model = json.loads(market.models_body)["data"][0]
    assert model["knowledge_cutoff"] == "2025-01-31"
    assert model["expiration_date"] is None
    assert json.loads(market.models_count_body) == {"data": {"count": 1}}


def test_the_model_price_is_the_cheapest_stable_endpoints() -> None:
    """BaseTen (down, status -5) matches Chutes' price but prices no cache reads."""
    kimi = json.loads(Market.default().models_body)["data"][0]
    assert kimi["pricing"]["input_cache_read"] == "0.00000015"
