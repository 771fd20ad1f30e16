"""The verifier's comparisons on hand-made answers: which canaries a pass rate accepts, and
what "not measured" says when logprobs were asked for and did not come back."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest

import provider_router as pr
from provider_router.checks.judge import Answers, Baseline, judge
from provider_router.client.results import ChatResult, TokenLogprob, ToolCall, Usage

ENDPOINT = pr.Endpoint.model_validate(
    {"name": "x", "provider_name": "Chutes", "tag": "chutes", "quantization": "int4",
     "pricing": {"prompt": "0.000001", "completion": "0.000002"}}
)  # fmt: skip
REFERENCE = pr.Endpoint.model_validate(
    {"name": "m", "provider_name": "Moonshot AI", "tag": "moonshotai", "quantization": "int4",
     "pricing": {"prompt": "0.000001", "completion": "0.000002"}}
)  # fmt: skip
WORDS = " the model writes a short answer"
BASELINE = Baseline(
    agreement=pr.Estimate(1.0, 1.0, 1.0, 4), divergence=pr.Estimate(0.0, 0.0, 0.0, 4)
)
CALL = ToolCall("c1", "get_weather", '{"city": "Paris", "unit": "celsius"}')


def answer(
    text: str = WORDS,
    *,
    prompt_tokens: int = 10,
    cost: str | None = "0.00002",
    logprobs: tuple[TokenLogprob, ...] | None = None,
    calls: tuple[ToolCall, ...] = (),
) -> ChatResult:
    usage = Usage(prompt_tokens, 5, prompt_tokens + 5, cost=None if cost is None else Decimal(cost))
    return ChatResult(
        text, None, "Chutes", "m", "gen-1", "stop", usage, usage.cost, tool_calls=calls,
        logprobs=logprobs,
    )  # fmt: skip


def confident(text: str = WORDS, p: float = 0.9) -> tuple[TokenLogprob, ...]:
    return tuple(TokenLogprob(w, math.log(p), ((w, math.log(p)),)) for w in text.split(" ")[1:])


def reference(n: int = 4, **kwargs: object) -> Answers:
    return Answers(REFERENCE, text=[answer(**kwargs) for _ in range(n)])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("mine", "accepted"),
    [
        (answer(), True),
        (answer(" the model writes quietly sideways purple"), False),  # agreement 0.5
        (answer(WORDS + " <think>"), False),  # a leftover marker
        (answer(cost="0.5"), False),  # billed other than the listing
        (answer(cost=None), True),  # not said: not held against it
        (answer(prompt_tokens=11), False),  # 10 % more prompt tokens: another template
        (None, None),  # failed: not judged at all
    ],
)
def test_which_text_canaries_the_pass_rate_accepts(
    mine: ChatResult | None, accepted: bool | None
) -> None:
    answers = Answers(ENDPOINT, text=[mine, answer(), answer(), answer()], logprobs_note="n/a")
    verdict = judge(answers, reference(), BASELINE, pr.VerifyThresholds(), 6)
    assert verdict.judged == (3 if accepted is None else 4)
    assert verdict.accepted == 3 + (accepted is True)


@pytest.mark.parametrize(
    ("result", "accepted"),
    [
        (answer("", calls=(CALL,)), True),
        (answer("", calls=(CALL, ToolCall("c2", "get_weather", '{"city": 3}'))), False),
        (answer("Sunny, I think."), False),  # no call at all
        (answer("<think>", calls=(CALL,)), False),
    ],
)
def test_which_tool_canaries_the_pass_rate_accepts(result: ChatResult, accepted: bool) -> None:
    answers = Answers(ENDPOINT, text=[answer()] * 3, tools=[result], logprobs_note="n/a")
    verdict = judge(answers, reference(3), BASELINE, pr.VerifyThresholds(), 6)
    assert (verdict.accepted, verdict.judged) == (3 + accepted, 4)
    assert verdict.pass_rate is not None
    assert verdict.pass_rate.value == verdict.accepted / 4


def test_logprobs_asked_for_and_not_returned_are_not_measured_not_failed() -> None:
    answers = Answers(ENDPOINT, text=[answer() for _ in range(4)])  # asked: no note
    verdict = judge(answers, reference(logprobs=confident()), BASELINE, pr.VerifyThresholds(), 6)
    assert verdict.passed is True
    assert verdict.divergence is None
    assert verdict.unmeasured == (
        "top-k divergence: not measured: 0 canaries came back with logprobs from both "
        "sides (4 without), at least 3 needed",
    )


def test_divergence_is_judged_against_the_references_own_and_per_canary() -> None:
    shifted = Answers(ENDPOINT, text=[answer(logprobs=confident(p=0.5)) for _ in range(4)])
    ours = reference(logprobs=confident(p=0.9))
    verdict = judge(shifted, ours, BASELINE, pr.VerifyThresholds(), 6)
    assert verdict.divergence is not None
    assert verdict.divergence.value == pytest.approx(0.4)
    assert verdict.passed is False
    assert verdict.accepted == 0  # every canary diverges beyond the ceiling
    # A reference as noisy with itself raises the ceiling: the same answers pass.
    noisy = Baseline(BASELINE.agreement, pr.Estimate(0.38, 0.36, 0.40, 4))
    verdict = judge(shifted, ours, noisy, pr.VerifyThresholds(), 6)
    assert verdict.passed is True
    assert verdict.accepted == 4
    # Without the reference's own divergence it is measured but not judged.
    verdict = judge(shifted, ours, Baseline(BASELINE.agreement), pr.VerifyThresholds(), 6)
    assert verdict.passed is True
    assert verdict.divergence is not None
    assert "not judged" in verdict.unmeasured[0]
