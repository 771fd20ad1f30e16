"""Plans from YAML, TOML and flags; every bad plan names the file, line and field."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from provider_router import ConfigurationError, DataFileError
from provider_router.planning.plan import (
    DEFAULT_BATCH_MAX_TOKENS,
    MAX_CONCURRENCY,
    Plan,
    load_plan,
)

YAML_PLAN = """\
model: moonshotai/kimi-k2.5
budget: 100
concurrency: 2000
policy: {exclude_below: int4}
generation: {max_tokens: 8192, temperature: 0.6, reasoning: high}
datasets:
  - name: b3
    inputs: [prompts/magicoder.jsonl]
    target_output_tokens: 7000000
  - name: b4
    input: prompts/oci.jsonl
    max_requests: 20000
    generation: {max_tokens: 4096}
"""

TOML_PLAN = """\
model = "moonshotai/kimi-k2.5"
budget = "100.50"

[policy]
exclude_below = "int4"

[[datasets]]
name = "b3"
input = "b3.jsonl"
target_output_tokens = 1000
"""


def test_yaml_plan(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(YAML_PLAN)
    plan = load_plan(path)
    assert plan.model == "moonshotai/kimi-k2.5"
    assert plan.budget == Decimal(100)
    assert plan.concurrency == 2000
    assert plan.policy == {"exclude_below": "int4"}
    b3, b4 = plan.datasets
    assert b3.inputs == (tmp_path / "prompts/magicoder.jsonl",)
    assert b3.target_output_tokens == 7_000_000
    assert b4.inputs == (tmp_path / "prompts/oci.jsonl",)
    assert b4.max_requests == 20000
    assert plan.params_for(b3).request_params() == {
        "max_tokens": 8192,
        "temperature": 0.6,
        "reasoning": {"effort": "high"},
    }
    assert plan.params_for(b4).max_tokens == 4096
    assert plan.params_for(b4).temperature == 0.6


def test_toml_plan_gives_the_same_model(tmp_path: Path) -> None:
    path = tmp_path / "plan.toml"
    path.write_text(TOML_PLAN)
    plan = load_plan(path)
    assert plan.budget == Decimal("100.50")
    assert plan.datasets[0].inputs == (tmp_path / "b3.jsonl",)
    assert plan.params_for(plan.datasets[0]).max_tokens == DEFAULT_BATCH_MAX_TOKENS


def test_single_dataset_from_flags_matches_a_plan_file(tmp_path: Path) -> None:
    flags = Plan.single(
        [tmp_path / "b3.jsonl"],
        model="moonshotai/kimi-k2.5",
        budget=Decimal("100.50"),
        exclude_below="int4",
        target_output_tokens=1000,
    )
    path = tmp_path / "plan.toml"
    path.write_text(TOML_PLAN)
    assert flags == load_plan(path)


def test_overrides_replace_file_values(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(YAML_PLAN)
    plan = load_plan(path).with_overrides(
        budget=Decimal(5), max_tokens=100, exclude_below="fp8", target_output_tokens=50
    )
    assert plan.budget == Decimal(5)
    assert plan.generation.max_tokens == 100
    assert plan.policy == {"exclude_below": "fp8"}
    assert {d.target_output_tokens for d in plan.datasets} == {50}
    # A dataset's own max_tokens still wins over the plan default.
    assert plan.params_for(plan.dataset("b4")).max_tokens == 4096


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        (
            "model: m\ndatasets:\n  - name: a\n    input: x\n    max_requests: 0\n",
            5,
            "max_requests",
        ),
        ("model: m\nbudget: -3\ndatasets:\n  - {name: a, input: x}\n", 2, "budget must be more"),
        ("model: m\ndatasets:\n  - {name: 'bad name', input: x}\n", 3, "must be 1-64 letters"),
        ("model: m\ndatasets:\n  - {name: a, input: x}\n  - {name: a, input: y}\n", None, "twice"),
        ("model: m\ndatasets: []\n", 2, "datasets"),
        ("model: m\ndatasets:\n  - {name: a, input: x, colour: red}\n", 3, "colour"),
        (
            "model: m\ngeneration: {reasoning: loud}\ndatasets:\n  - {name: a, input: x}\n",
            2,
            "loud",
        ),
        ("datasets:\n  - {name: a, input: x}\n", None, "model"),
        ("model: m\ndatasets:\n  - {name: a, input: x, inputs: [y]}\n", 3, "not both"),
        ("model: [unclosed\n", 2, "not valid YAML"),
        ("- just\n- a list\n", 1, "must be a mapping"),
        (
            "model: m\nledger: redis://h:6379/0\nworkers_share: b3\nledger_name: b3\n"
            "datasets: [{name: a, input: x}]\n",
            3,
            "workers_share: the Redis-streams fleet was removed: run the plan on Ray",
        ),
        (
            "model: m\nledger: redis://h:6379/0\ndatasets: [{name: a, input: x}]\n",
            None,
            "ledger_name",
        ),
    ],
)
def test_bad_yaml_plans_name_file_line_and_field(
    tmp_path: Path, text: str, line: int | None, message: str
) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    with pytest.raises(DataFileError) as info:
        load_plan(path)
    assert message in str(info.value)
    assert info.value.path == path
    if line is not None:
        assert info.value.line == line, str(info.value)


def test_bad_toml_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "plan.toml"
    path.write_text('model = "m"\nbudget = = 3\n')
    with pytest.raises(DataFileError, match="not valid TOML") as info:
        load_plan(path)
    assert info.value.line == 2


def test_unknown_extension_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match=r"\.yaml, \.yml or \.toml"):
        load_plan(tmp_path / "plan.json")
    with pytest.raises(DataFileError, match="cannot read plan file"):
        load_plan(tmp_path / "missing.yaml")


def test_flags_without_a_prompts_file() -> None:
    with pytest.raises(ConfigurationError, match=r"PROMPTS\.jsonl"):
        Plan.single([], model="m", budget=Decimal(1))


def test_dataset_name_from_an_awkward_file_name(tmp_path: Path) -> None:
    plan = Plan.single([tmp_path / "my prompts (v2).jsonl"], model="m", budget=None)
    assert plan.datasets[0].name == "my-prompts-v2"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("{name: a, inputs: []}", "inputs: give at least one prompt file"),
        ("{name: a, input: x, max_requests: -3}", "max_requests: Input should be greater than 0"),
        ("p.jsonl", "datasets.0: Input should be a valid dictionary"),
        ("{name: a}", "datasets.0.inputs: Field required"),
    ],
)
def test_an_invalid_dataset_entry_is_the_one_problem_said(
    tmp_path: Path, entry: str, message: str
) -> None:
    """The entry's own problem, and no "Tuple should have at least 1 item" about the
    datasets list, which is not empty."""
    path = tmp_path / "plan.yaml"
    path.write_text(f"model: m\nbudget: 1\ndatasets:\n  - {entry}\n")
    with pytest.raises(DataFileError) as info:
        load_plan(path)
    said = str(info.value)
    assert message in said
    assert "Tuple should have" not in said
    assert "problems" not in said  # one problem, said once
    assert info.value.line == 4


def test_a_plan_without_datasets_says_so(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text("model: m\ndatasets: []\n")
    with pytest.raises(DataFileError, match="datasets: a plan needs at least one dataset"):
        load_plan(path)


@pytest.mark.parametrize("concurrency", [99_999_999_999, MAX_CONCURRENCY + 1])
def test_concurrency_is_bounded(tmp_path: Path, concurrency: int) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(f"model: m\nconcurrency: {concurrency}\ndatasets:\n  - {{name: a, input: x}}\n")
    with pytest.raises(DataFileError) as info:
        load_plan(path)
    assert f"concurrency: {concurrency:,} requests in flight is more than" in str(info.value)
    assert f"{MAX_CONCURRENCY:,}" in str(info.value)
    assert info.value.line == 2
    with pytest.raises(ConfigurationError, match="requests in flight is more than"):
        Plan.single([tmp_path / "x.jsonl"], model="m", budget=None, concurrency=concurrency)
    ok = tmp_path / "ok.yaml"
    ok.write_text(
        f"model: m\nconcurrency: {MAX_CONCURRENCY}\ndatasets:\n  - {{name: a, input: x}}\n"
    )
    assert load_plan(ok).concurrency == MAX_CONCURRENCY


def test_a_plan_remembers_where_each_dataset_is(tmp_path: Path) -> None:
    """So a refusal found later (a ``route: batch`` without a Batch API endpoint) can
    name the file and the line, as a refusal while reading it does."""
    path = tmp_path / "plan.yaml"
    path.write_text(
        "model: m\nbudget: 1\ndatasets:\n  - {name: a, input: x}\n  - name: b\n"
        "    input: y\n    route: batch\n"
    )
    plan = load_plan(path)
    assert plan.where("b", "route") == f"{path}:7"
    assert plan.where("a", "route") == f"{path}:4"  # the entry itself
    assert plan.where(None, "budget") == f"{path}:2"
    again = plan.with_overrides(budget=Decimal(2))
    assert again.where("b", "route") == f"{path}:7"
    left = plan.model_copy(update={"datasets": plan.datasets[1:]})  # a route took `a`
    assert left.where("b", "route") == f"{path}:7"
    assert Plan.single([tmp_path / "x.jsonl"], model="m", budget=None).where("x") is None
