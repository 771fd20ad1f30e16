"""The precision order and the native-precision registry."""

from __future__ import annotations

import pytest

from provider_router import (
    ConfigurationError,
    NativePrecisionRegistry,
    Quantization,
    precision_rank,
)
from provider_router.catalog.quantization import parse_quantization

Q = Quantization


@pytest.mark.parametrize(
    ("lower", "higher"),
    [
        (Q.FP4, Q.INT4),
        (Q.MXFP4, Q.INT4),
        (Q.NVFP4, Q.INT4),
        (Q.INT4, Q.FP6),
        (Q.FP6, Q.INT8),
        (Q.FP8, Q.FP16),
        (Q.MXFP8, Q.BF16),
        (Q.INT8, Q.BF16),
        (Q.BF16, Q.FP32),
    ],
)
def test_precision_order(lower: Quantization, higher: Quantization) -> None:
    low, high = precision_rank(lower), precision_rank(higher)
    assert low is not None
    assert high is not None
    assert low < high


@pytest.mark.parametrize(
    "tier", [(Q.FP4, Q.MXFP4, Q.NVFP4), (Q.INT8, Q.FP8, Q.MXFP8), (Q.FP16, Q.BF16)]
)
def test_members_of_a_bit_width_tier_compare_equal(tier: tuple[Quantization, ...]) -> None:
    assert len({precision_rank(q) for q in tier}) == 1


def test_every_known_value_is_ranked_and_unknown_is_not() -> None:
    for q in Quantization:
        assert (precision_rank(q) is None) == (q in (Q.UNKNOWN, Q.UNRECOGNIZED))
    assert precision_rank(None) is None


@pytest.mark.parametrize("value", ["unknown", "unrecognized", "fp3", "", "int 4", "q4_k_m"])
def test_user_input_must_name_a_ranked_precision(value: str) -> None:
    with pytest.raises(
        ConfigurationError, match=r"exclude_below must be one of fp4, mxfp4, nvfp4, int4, .*got"
    ):
        parse_quantization(value, what="exclude_below")


def test_user_input_is_case_insensitive() -> None:
    assert parse_quantization(" INT4 ") is Q.INT4
    assert parse_quantization(Q.NVFP4) is Q.NVFP4


def test_builtin_registry_knows_the_int4_kimi_models() -> None:
    registry = NativePrecisionRegistry.builtin()
    assert registry.lookup("moonshotai/kimi-k2.5") is Q.INT4
    assert registry.lookup("moonshotai/kimi-k2-thinking") is Q.INT4
    assert registry.lookup("MoonshotAI/Kimi-K2.5:exacto") is Q.INT4  # variants, any case
    assert registry.lookup("moonshotai/kimi-k2-0905") is None  # a 16-bit-era model
    assert registry.resolve("moonshotai/kimi-k2.5") == (Q.INT4, True)
    assert registry.resolve("meta-llama/llama-3.3-70b") == (Q.BF16, False)


def test_registry_is_immutable_and_extendable() -> None:
    base = NativePrecisionRegistry.builtin()
    extended = base.with_model("deepseek/deepseek-v3", "fp8")
    assert extended.lookup("deepseek/deepseek-v3") is Q.FP8
    assert base.lookup("deepseek/deepseek-v3") is None
    assert len(extended) == len(base) + 1
    assert "deepseek/deepseek-v3" in extended
    assert extended != base
    assert extended == base.with_model("deepseek/deepseek-v3", Q.FP8)
    assert hash(extended) == hash(base.with_model("deepseek/deepseek-v3", Q.FP8))
    strict = base.with_default(None)
    assert strict.resolve("unlisted/model") == (None, False)
    assert "default=None" in repr(strict)


def test_registry_rejects_unranked_precisions() -> None:
    with pytest.raises(ConfigurationError, match="native precision of a/b must be one of"):
        NativePrecisionRegistry({"a/b": "unknown"})
    with pytest.raises(ConfigurationError, match="default precision must be one of"):
        NativePrecisionRegistry(default="fp5")
