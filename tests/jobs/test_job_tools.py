"""Tool use through a batch run: plan and prompt-line tools, kept calls, SpecForge export."""

from __future__ import annotations

import io
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from _job_helpers import assert_consistent
from pydantic import ValidationError

from provider_router.jobs.runner import JobRunner
from provider_router.jobs.store.outputs import export_conversations, to_conversation
from provider_router.jobs.summary import StopReason
from provider_router.planning.plan import GenerationParams, Plan
from provider_router.planning.prompts import PromptReader, parse_prompt_line
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

Factory = Callable[..., Awaitable[SimulatorServer]]
MODEL = "moonshotai/kimi-k2.5"


def _tool(name: str, field: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {
                "type": "object",
                "properties": {field: {"type": "string"}},
                "required": [field],
            },
        },
    }


WEATHER = _tool("weather", "city")
LOOKUP = _tool("lookup", "term")


def _write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


async def test_tool_calls_are_kept_in_the_output_and_exported_for_specforge(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=5)
    prompts = _write(
        tmp_path / "p.jsonl",
        [
            {"id": "plan-tools", "prompt": "Weather in Florence?"},
            # The line's own tools and choice override the plan's.
            {
                "id": "line-tools",
                "prompt": "Define entropy.",
                "tools": [LOOKUP],
                "tool_choice": {"type": "function", "function": {"name": "lookup"}},
                "topic": "physics",
            },
            {"id": "no-call", "prompt": "Say hi.", "tool_choice": "none"},
        ],
    )
    plan = Plan.model_validate(
        {
            "model": MODEL,
            "budget": "5",
            "generation": {"max_tokens": 400, "tools": [WEATHER], "tool_choice": "required"},
            "datasets": [{"name": "t", "input": str(prompts)}],
        }
    )
    out = tmp_path / "out"
    summary = await JobRunner(plan, out, base_url=sim.url, api_key=DEFAULT_TEST_KEY).run()
    assert summary.reason is StopReason.COMPLETE
    records = {r["id"]: r for r in assert_consistent(out, ["t"])}
    sent = {r.generation_id: r for r in sim.log.chat()}

    first = records["plan-tools"]
    assert first["finish_reason"] == "tool_calls"
    reply = first["messages"][-1]
    assert reply["role"] == "assistant"
    assert [c["function"]["name"] for c in reply["tool_calls"]] == ["weather"] * len(
        reply["tool_calls"]
    )
    assert all(json.loads(c["function"]["arguments"])["city"] for c in reply["tool_calls"])
    assert first["tools"] == [WEATHER]

    second = records["line-tools"]
    assert [c["function"]["name"] for c in second["messages"][-1]["tool_calls"]] == ["lookup"]
    assert second["tools"] == [LOOKUP]
    assert second["metadata"] == {"topic": "physics"}, "request fields are not metadata"
    assert sent[second["generation_id"]].tools == ("lookup",)
    assert sent[first["generation_id"]].tools == ("weather",)

    third = records["no-call"]
    assert third["finish_reason"] in ("stop", "length")
    assert "tool_calls" not in third["messages"][-1]
    assert sent[third["generation_id"]].tool_choice == "none"

    buffer = io.StringIO()
    report = export_conversations([out / "t.jsonl"], buffer)
    exported = {c["id"]: c for c in map(json.loads, buffer.getvalue().splitlines())}
    assert "t/plan-tools" in exported
    assert "t/line-tools" in exported
    conversation = exported["t/plan-tools"]
    # SpecForge's readers take `tools` as JSON text and `tool_calls` on the turn.
    assert json.loads(conversation["tools"]) == [WEATHER]
    turn = conversation["conversations"][-1]
    assert turn["role"] == "assistant"
    assert turn["content"] == ""
    assert turn["tool_calls"] == [
        {"id": c["id"], "type": "function", "function": c["function"]} for c in reply["tool_calls"]
    ]
    assert report.written == len(exported)


def test_a_multi_turn_tool_conversation_exports_every_turn() -> None:
    call = {
        "id": "functions.weather:0",
        "type": "function",
        "function": {"name": "weather", "arguments": {"city": "Rome"}},
    }
    record: Any = {
        "id": "q",
        "dataset": "d",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Rome?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "functions.weather:0", "content": "21 C"},
            {"role": "assistant", "content": "It is 21 C in Rome."},
        ],
        "finish_reason": "stop",
        "tools": [WEATHER],
    }
    conversation, reason = to_conversation(record)
    assert reason is None
    assert conversation is not None
    turns = conversation["conversations"]
    assert [t["role"] for t in turns] == ["system", "user", "assistant", "tool", "assistant"]
    assert turns[2] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "functions.weather:0",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Rome"}'},
            }
        ],
    }
    assert turns[3] == {"role": "tool", "content": "21 C", "tool_call_id": "functions.weather:0"}
    bad = {
        **record,
        "messages": [
            *record["messages"][:2],
            {"role": "assistant", "content": None, "tool_calls": [{"id": "x"}]},
        ],
    }
    assert to_conversation(bad) == (None, "malformed tool_calls")


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ({"prompt": "x", "tools": "weather"}, "`tools` must be a non-empty list"),
        ({"prompt": "x", "tools": []}, "`tools` must be a non-empty list"),
        ({"prompt": "x", "tools": [{"function": {}}]}, "tools[0] must be an object with a `type`"),
        ({"prompt": "x", "tools": [WEATHER], "tool_choice": "always"}, "`tool_choice` must be"),
    ],
)
def test_bad_tools_on_a_prompt_line_name_the_problem(line: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match="tool") as caught:
        parse_prompt_line(json.dumps(line))
    assert problem in str(caught.value)


def test_a_bad_tools_line_is_skipped_and_reported(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "p.jsonl",
        [{"id": "ok", "prompt": "x", "tools": [WEATHER]}, {"id": "bad", "prompt": "y", "tools": 3}],
    )
    reader = PromptReader([path])
    prompts = list(reader)
    assert [p.id for p in prompts] == ["ok"]
    assert prompts[0].request_fields == {"tools": [WEATHER]}
    assert prompts[0].metadata == {}
    assert len(reader.problems) == 1
    assert reader.problems[0].line == 2
    assert "`tools` must be a non-empty list" in str(reader.problems[0])


def test_plan_generation_tools_are_request_fields() -> None:
    params = GenerationParams(tools=[WEATHER], tool_choice="auto", max_tokens=10)
    assert params.request_params() == {"max_tokens": 10, "tools": [WEATHER], "tool_choice": "auto"}
    merged = params.merged(GenerationParams(tool_choice="none"))
    assert merged.tool_choice == "none"
    assert merged.tools == [WEATHER]
    with pytest.raises(ValidationError, match="unknown tool_choice 'always'"):
        GenerationParams(tool_choice="always")
    with pytest.raises(ValidationError, match="needs a 'type'"):
        GenerationParams(tool_choice={"function": {"name": "weather"}})
    with pytest.raises(ValidationError, match="at least 1 item"):
        GenerationParams(tools=[])
