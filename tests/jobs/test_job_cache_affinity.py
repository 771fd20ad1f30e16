"""A plan's ``cache_affinity``: each conversation of a batch run is pinned to one
endpoint (one-tag ``only``, ``session_id``, no ``order``) and its later turns read the
provider's cache."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

from provider_router.jobs.observe.report import write_report
from provider_router.jobs.runner import JobRunner
from provider_router.jobs.summary import StopReason
from provider_router.planning.plan import Plan
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

Factory = Callable[..., Awaitable[SimulatorServer]]
SYSTEM = {"role": "system", "content": "You regenerate careful training data. " * 40}


def _turns(conversation: int, turns: int) -> list[dict[str, Any]]:
    lines = []
    messages: list[dict[str, Any]] = [SYSTEM]
    for turn in range(turns):
        messages = [*messages, {"role": "user", "content": f"c{conversation} q{turn}?"}]
        lines.append({"id": f"c{conversation}-t{turn}", "messages": messages})
        messages = [*messages, {"role": "assistant", "content": f"answer {turn} " * 30}]
    return lines


async def _run(tmp_path: Path, sim: SimulatorServer, affinity: bool) -> None:
    lines = [line for turn in range(3) for c in range(2) for line in _turns(c, 3)[turn : turn + 1]]
    prompts = tmp_path / f"p{affinity}.jsonl"
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    plan = Plan.model_validate(
        {
            "model": "moonshotai/kimi-k2.5",
            "budget": "5",
            "concurrency": 1,
            "cache_affinity": affinity,
            "policy": {"exclude_below": "int4"},
            "generation": {"max_tokens": 50},
            "datasets": [{"name": "d", "input": str(prompts)}],
        }
    )
    out = tmp_path / f"out{affinity}"
    runner = JobRunner(plan, out, base_url=sim.url, api_key=DEFAULT_TEST_KEY)
    summary = await runner.run()
    assert summary.reason is StopReason.COMPLETE
    saved = json.loads((out / "summary.json").read_text())["cache_saved_usd"]
    assert Decimal(saved) == summary.cache_saved
    if affinity:
        assert summary.cache_saved > 0, "what caching saved is reported"
        page = write_report(out).read_text()
        assert "prompt caching saved $" in page


async def test_a_plan_with_cache_affinity_pins_each_conversation(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(completion_tokens=20)
    await _run(tmp_path, sim, affinity=True)
    chats = [r for r in sim.log.chat() if r.status == 200 and r.max_tokens == 50]
    assert len(chats) == 6
    for record in chats:
        assert record.routing is not None
        assert "order" not in record.routing
        assert len(record.routing["only"]) == 1
    later = [r for r in chats[2:]]
    assert all(r.cached_tokens > 0 for r in later), "later turns read their conversation"

    plain = await openrouter_sim_factory(completion_tokens=20)
    await _run(tmp_path, plain, affinity=False)
    # Unpinned: each attempt goes where admission sends it (the best endpoint with room).
    unpinned = [r for r in plain.log.chat() if r.max_tokens == 50]
    assert all((r.routing or {}).get("only") == ["chutes"] for r in unpinned)
