"""Quantization strings OpenRouter does not list: read for bit width and kind, or rejected.

OpenRouter's enum is closed today, but a new value must never pass a floor just
because we cannot read it (issue #12): ``q4_k_m`` used to be read as "unknown", the
model's native precision assumed, and the endpoint allowed under an int4 floor.
"""

from __future__ import annotations

import string
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from provider_router import DecisionCode, Endpoint, ProviderPolicy, Quantization
from provider_router.catalog.quantization import precision_rank, read_scheme, scheme_tier

KIMI = "moonshotai/kimi-k2.5"  # native int4: the old code assumed int4 for unknown strings
FLOORS = [q for q in Quantization if precision_rank(q) is not None]


def endpoint(quantization: str | None) -> Endpoint:
    raw: dict[str, Any] = {
        "name": f"X | {KIMI}",
        "provider_name": "X",
        "tag": "x",
        "pricing": {"prompt": "0.0000005", "completion": "0.000002"},
        "quantization": quantization,
        "status": 0,
    }
    return Endpoint.model_validate(raw)


def decide(policy: ProviderPolicy, quantization: str | None) -> tuple[bool, DecisionCode, str]:
    decision = policy.decide(endpoint(quantization), model_id=KIMI)
    return decision.allowed, decision.code, decision.reason


@pytest.mark.parametrize(
    ("raw", "bits", "kind", "tier"),
    [
        ("q4_k_m", "4", "int", 2),  # GGUF k-quant: 4-bit integer blocks
        ("Q8_0", "8", "int", 4),
        ("iq3_xxs", "3", "int", 0),
        ("ggml-model-q5_1", "5", "int", 2),  # 5 bits: meets int4, not fp6
        ("w4a16", "4", "int", 2),  # 4-bit weights, 16-bit activations
        ("w8a8", "8", "int", 4),
        ("int3", "3", "int", 0),
        ("uint4", "4", "int", 2),
        ("awq-int4", "4", "int", 2),
        ("mxint8", "8", "int", 4),
        ("mxfp6", "6", "float", 3),
        ("fp5", "5", "float", 2),
        ("float8", "8", "float", 4),
        ("f16", "16", "float", 5),
        ("e4m3", "8", "float", 4),
        ("fp4_e2m1", "4", "float", 1),
        ("fp3.5", "3.5", "float", 0),
        ("4bit", "4", "unknown", 1),  # a 4-bit grid of unstated kind counts as the weaker
        ("exl2-4.65bpw", "4.65", "unknown", 1),
        ("hqq-2bit", "2", "unknown", 0),
        ("w4a16-fp8", "4", "int", 2),  # several widths: the lowest counts
    ],
)
def test_a_string_names_its_bit_width_and_kind(raw: str, bits: str, kind: str, tier: int) -> None:
    scheme = read_scheme(raw)
    assert scheme is not None
    assert (scheme.bits, scheme.kind, scheme_tier(scheme)) == (Decimal(bits), kind, tier)
    assert scheme.raw == raw


@pytest.mark.parametrize(
    "raw", ["awq", "gptq", "gguf", "turbo-v2", "qwen2", "int128", "x7k-@@", "", "   "]
)
def test_a_string_that_names_no_width_is_not_read(raw: str) -> None:
    assert read_scheme(raw) is None


@pytest.mark.parametrize(
    ("raw", "floor", "allowed", "code", "says"),
    [
        ("q4_k_m", "int4", True, DecisionCode.ALLOWED, "'q4_k_m' read as 4-bit integer"),
        ("q4_k_m", "fp6", False, DecisionCode.QUANTIZATION_BELOW_MINIMUM, "below the fp6"),
        ("w4a16", "int4", True, DecisionCode.ALLOWED, "meets the int4 floor"),
        ("w4a16", "int8", False, DecisionCode.QUANTIZATION_BELOW_MINIMUM, "'w4a16'"),
        ("int3", "int4", False, DecisionCode.QUANTIZATION_BELOW_MINIMUM, "3-bit integer"),
        ("int3", "fp4", False, DecisionCode.QUANTIZATION_BELOW_MINIMUM, "below the fp4"),
        ("mxfp6", "int4", True, DecisionCode.ALLOWED, "6-bit float"),
        ("mxfp6", "int8", False, DecisionCode.QUANTIZATION_BELOW_MINIMUM, "below the int8"),
        ("4bit", "int4", False, DecisionCode.QUANTIZATION_BELOW_MINIMUM, "kind not stated"),
        ("x7k-@@", "fp4", False, DecisionCode.QUANTIZATION_UNRECOGNIZED, "'x7k-@@'"),
        ("awq", "int4", False, DecisionCode.QUANTIZATION_UNRECOGNIZED, "unrecognized"),
    ],
)
def test_the_policy_judges_what_it_reads(
    raw: str, floor: str, allowed: bool, code: DecisionCode, says: str
) -> None:
    got_allowed, got_code, reason = decide(ProviderPolicy(floor), raw)
    assert (got_allowed, got_code) == (allowed, code), reason
    assert says in reason
    assert "assumed" not in reason, "an unlisted string is never assumed native"


def test_q4_k_m_no_longer_passes_on_the_models_native_precision() -> None:
    """The finding: Kimi is natively int4, so the old default let q4_k_m pass an fp6 floor."""
    allowed, code, reason = decide(ProviderPolicy("fp6"), "q4_k_m")
    assert not allowed
    assert code == DecisionCode.QUANTIZATION_BELOW_MINIMUM
    assert "'q4_k_m' read as 4-bit integer; is below the fp6 floor" in reason


def test_an_unrecognized_string_is_its_own_verdict_showing_the_raw_string() -> None:
    allowed, code, reason = decide(ProviderPolicy("int4"), "Qx-Turbo")
    assert not allowed
    assert code == DecisionCode.QUANTIZATION_UNRECOGNIZED
    assert reason == (
        "quantization 'Qx-Turbo' is unrecognized (not OpenRouter's list, and it names no bit "
        "width); rejected under the int4 floor"
    )
    assert endpoint("Qx-Turbo").quantization is Quantization.UNRECOGNIZED
    assert endpoint("Qx-Turbo").quantization_raw == "Qx-Turbo"


def test_without_a_floor_an_unrecognized_string_passes_and_says_so() -> None:
    allowed, code, reason = decide(ProviderPolicy(), "Qx-Turbo")
    assert allowed
    assert code == DecisionCode.ALLOWED
    assert "'Qx-Turbo' is unrecognized" in reason
    assert "no floor" in reason


def test_unrecognized_accept_is_an_explicit_choice() -> None:
    allowed, code, reason = decide(ProviderPolicy("int4", unrecognized="accept"), "Qx-Turbo")
    assert allowed
    assert code == DecisionCode.ALLOWED
    assert "accepted (unrecognized='accept')" in reason


def test_unknown_accept_does_not_accept_an_unrecognized_string() -> None:
    allowed, code, _ = decide(ProviderPolicy("int4", unknown="accept"), "Qx-Turbo")
    assert not allowed
    assert code == DecisionCode.QUANTIZATION_UNRECOGNIZED


def test_declared_unknown_and_null_still_follow_unknown() -> None:
    for raw in (None, "unknown"):
        allowed, _, reason = decide(ProviderPolicy("int4"), raw)
        assert allowed, reason
        assert "assumed int4, the native precision" in reason


def test_a_bad_unrecognized_choice_is_a_configuration_error() -> None:
    from provider_router import ConfigurationError

    with pytest.raises(ConfigurationError, match="unrecognized must be one of reject, accept"):
        ProviderPolicy("int4", unrecognized="maybe")  # type: ignore[arg-type]


_KNOWN = {q.value for q in Quantization}


@given(raw=st.text(min_size=0, max_size=24), floor=st.sampled_from(FLOORS))
def test_no_string_is_allowed_under_a_floor_unless_it_proves_the_bits(
    raw: str, floor: Quantization
) -> None:
    """Any string: allowed under a floor only if it is a listed value that meets it, or
    names a bit width whose tier does; never by assumption."""
    if raw.strip().lower() in _KNOWN:
        return  # OpenRouter's own values (and 'unknown') follow their own rules
    decision = ProviderPolicy(floor).decide(endpoint(raw), model_id=KIMI)
    scheme = read_scheme(raw)
    if decision.allowed:
        assert scheme is not None
        assert scheme_tier(scheme) >= (precision_rank(floor) or 0)
    if scheme is None:
        assert not decision.allowed
        assert decision.code is DecisionCode.QUANTIZATION_UNRECOGNIZED
        assert repr(raw) in decision.reason


@given(
    raw=st.text(alphabet=string.ascii_letters + "-_ .@/", min_size=1, max_size=24),
    floor=st.sampled_from(FLOORS),
)
def test_a_random_string_without_digits_is_never_allowed_under_a_floor(
    raw: str, floor: Quantization
) -> None:
    if raw.strip().lower() == Quantization.UNKNOWN.value:
        return
    decision = ProviderPolicy(floor).decide(endpoint(raw), model_id=KIMI)
    assert not decision.allowed
    assert decision.code is DecisionCode.QUANTIZATION_UNRECOGNIZED


def test_the_command_line_sets_unrecognized() -> None:
    from provider_router.cli import build_parser
    from provider_router.cli.endpoints import policy_from_args

    parser = build_parser()
    default = policy_from_args(parser.parse_args(["endpoints", KIMI, "--exclude-below", "int4"]))
    assert default.unrecognized == "reject"
    chosen = parser.parse_args(["endpoints", KIMI, "--unrecognized", "accept"])
    assert policy_from_args(chosen).unrecognized == "accept"
