"""``provider-router run --plan plan.yaml --ray``: a plan on the session's local cluster."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import pytest

from provider_router.cli import main
from provider_router.jobs.store.outputs import read_outputs
from tests.ledger.conftest import RedisServer
from tests.ray._sim_thread import SimulatorThread
from tests.ray.conftest import CREDITS, KEY, MODEL

pytestmark = [pytest.mark.ray, pytest.mark.redis, pytest.mark.timeout(240)]


TOOL = {
    "type": "function",
    "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
}


def _plan(tmp_path: Path, budget: str) -> Path:
    a = tmp_path / "a.jsonl"
    a.write_text("".join(json.dumps({"id": f"a{i}", "prompt": f"q {i}"}) + "\n" for i in range(30)))
    b = tmp_path / "b.jsonl"
    lines = [json.dumps({"id": f"b{i}", "prompt": f"r {i}", "source": "x"}) for i in range(20)]
    # A line's own request fields go with it (they were dropped on the way to the stage).
    lines[3] = json.dumps({"id": "b3", "prompt": "r 3", "tools": [TOOL], "tool_choice": "auto"})
    b.write_text("\n".join([*lines[:5], "{not json", *lines[5:]]) + "\n")
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        f"model: {MODEL}\nbudget: {budget}\nconcurrency: 16\n"
        "generation: {max_tokens: 256}\n"
        f"datasets:\n  - {{name: a, input: {a}}}\n  - {{name: b, input: {b}}}\n"
    )
    return plan


def _argv(plan: Path, out: Path, redis: RedisServer, sim: SimulatorThread, name: str) -> list[str]:
    return [
        "run",
        "--plan",
        str(plan),
        "--out",
        str(out),
        "--ray",
        "--ray-actors",
        "2",
        "--ledger",
        redis.url,
        "--ledger-name",
        name,
        "--base-url",
        sim.url,
    ]


def _ids(path: Path) -> Counter[str]:
    return Counter(record["id"] for _, record in read_outputs(path))


def _prompts_sent(sim: SimulatorThread) -> int:
    """Chat requests of prompts (not the preflight's 1-token request)."""
    return sum(1 for r in sim.server.requests if r.max_tokens != 1)


@pytest.fixture
def ray_run(
    ray_session: Path,
    redis_server: RedisServer,
    sim: SimulatorThread,
    job_name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[[str], tuple[list[str], Path]]:
    """``make(budget)``: the ``run --ray`` command line of a two-dataset plan, and its DIR."""
    monkeypatch.setenv("OPENROUTER_API_KEY", KEY)

    def make(budget: str) -> tuple[list[str], Path]:
        out = tmp_path / "out"
        return _argv(_plan(tmp_path, budget), out, redis_server, sim, job_name), out

    return make


def test_a_plan_on_ray_writes_the_same_outputs_summary_and_report_and_resumes_free(
    ray_run: Callable[[str], tuple[list[str], Path]],
    sim: SimulatorThread,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv, out = ray_run("5")
    assert main(argv) == 0
    assert _ids(out / "a.jsonl") == Counter({f"a{i}": 1 for i in range(30)})
    assert _ids(out / "b.jsonl") == Counter({f"b{i}": 1 for i in range(20)})
    record = next(r for _, r in read_outputs(out / "b.jsonl") if r["id"] == "b7")
    assert record["metadata"] == {"source": "x"}
    assert record["messages"][0] == {"role": "user", "content": "r 7"}
    assert record["messages"][1]["role"] == "assistant"
    offered = [(r.tools, r.tool_choice) for r in sim.server.requests if r.tools]
    assert offered == [(("lookup",), "auto")], "b3's tools, and only b3's"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reason"] == "complete"
    assert summary["datasets"]["a"]["completed"] == 30
    assert summary["datasets"]["b"]["bad_lines"] == 1
    assert len(summary["bad_lines"]) == 1
    written = sum(
        (Decimal(r["cost"]) for f in ("a", "b") for _, r in read_outputs(out / f"{f}.jsonl")),
        Decimal(0),
    )
    preflight = Decimal(summary["preflight_usd"])
    assert preflight > 0  # run's preflight, paid from the job's ledger
    assert Decimal(summary["spent_usd"]) == written + preflight == sim.charged(CREDITS)
    assert (out / "report.html").is_file()

    sent = _prompts_sent(sim)
    assert main(argv) == 0  # the same command again: nothing left to send
    assert _prompts_sent(sim) == sent
    assert sum(_ids(out / "a.jsonl").values()) == 30
    capsys.readouterr()


def test_a_budget_stop_on_ray_says_how_to_resume_and_the_resume_pays_only_the_rest(
    ray_run: Callable[[str], tuple[list[str], Path]],
    sim: SimulatorThread,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv, out = ray_run("0.02")
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert "To resume: provider-router run" in err
    assert "--budget" in err.split("To resume:")[1]
    first = sum(_ids(out / f).total() for f in ("a.jsonl", "b.jsonl"))
    assert 0 < first < 50
    assert _prompts_sent(sim) == first  # every paid answer was written
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reason"] == "budget_exhausted"
    assert Decimal(summary["spent_usd"]) == sim.charged(CREDITS) <= Decimal("0.02")

    resumed = [*argv[:-2], "--budget", "5", *argv[-2:]]
    assert main(resumed) == 0
    assert _ids(out / "a.jsonl") == Counter({f"a{i}": 1 for i in range(30)})
    assert _ids(out / "b.jsonl") == Counter({f"b{i}": 1 for i in range(20)})
    assert _prompts_sent(sim) == 50  # nothing paid twice
    capsys.readouterr()


def test_ray_needs_a_redis_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OPENROUTER_API_KEY", KEY)
    plan = _plan(tmp_path, "5")
    assert main(["run", "--plan", str(plan), "--out", str(tmp_path / "o"), "--ray"]) == 2
    assert "--ray needs a Redis ledger: --ledger redis://" in capsys.readouterr().err


def test_prompts_edited_under_their_ids_are_sent_again_on_ray_their_old_rows_aside(
    ray_run: Callable[[str], tuple[list[str], Path]],
    sim: SimulatorThread,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv, out = ray_run("5")
    assert main(argv) == 0
    before = {r["id"]: r for _, r in read_outputs(out / "a.jsonl")}
    inputs = tmp_path / "a.jsonl"
    lines = inputs.read_text().splitlines()
    for n in (3, 7):
        lines[n] = json.dumps({"id": f"a{n}", "prompt": f"q {n}, edited at much greater length"})
    inputs.write_text("\n".join(lines) + "\n")
    sent = _prompts_sent(sim)
    capsys.readouterr()

    assert main(argv) == 0

    assert _prompts_sent(sim) == sent + 2, "the two edited prompts, once each"
    assert _ids(out / "a.jsonl") == Counter({f"a{i}": 1 for i in range(30)})
    rows = {r["id"]: r for _, r in read_outputs(out / "a.jsonl")}
    for n in (3, 7):
        assert rows[f"a{n}"]["messages"][0]["content"] == f"q {n}, edited at much greater length"
        assert rows[f"a{n}"]["generation_id"] != before[f"a{n}"]["generation_id"]
    assert rows["a4"] == before["a4"]
    aside = [
        json.loads(line)
        for line in (out / "set_aside" / "edited" / "a.jsonl").read_text().splitlines()
    ]
    assert sorted(r["id"] for r in aside) == ["a3", "a7"]
    assert "2 answers of dataset a no longer answer its inputs" in capsys.readouterr().err


def test_a_key_made_for_the_run_serves_the_actors_and_is_in_no_file_ray_keeps(
    ray_session: Path,
    redis_server: RedisServer,
    job_name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    management = "sk-or-v1-ray-management-key"
    sim = SimulatorThread(
        api_keys=[KEY], management_keys=[management], speed=math.inf, credits=CREDITS
    )
    try:
        monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
        monkeypatch.setenv("OPENROUTER_MANAGEMENT_KEY", management)
        out = tmp_path / "out"
        argv = _argv(_plan(tmp_path, "5"), out, redis_server, sim, job_name)
        assert main([*argv, "--job-key"]) == 0
        made = {
            token: state
            for token, state in sim.server.simulator.account.keys.items()
            if token not in (KEY, management)
        }
        ((token, state),) = made.items()
        assert state.disabled  # disabled once Ray was done
        chats = [r for r in sim.server.requests if r.route == "chat"]
        assert {r.key_label for r in chats} == {state.label}
        assert _ids(out / "a.jsonl") == Counter({f"a{i}": 1 for i in range(30)})
        for root in (ray_session, out):
            assert _files_holding(root, token.encode()) == [], root
        capsys.readouterr()
    finally:
        sim.stop()


def test_a_key_past_its_limit_on_ray_is_a_budget_stop_and_a_working_key_finishes(
    ray_session: Path,
    redis_server: RedisServer,
    job_name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    capped, working = "sk-or-v1-ray-capped-key", "sk-or-v1-ray-working-key"
    sim = SimulatorThread(
        api_keys={capped: "0.01", working: None},
        key_limit_status=403,
        speed=math.inf,
        credits=CREDITS,
    )
    try:
        out = tmp_path / "out"
        argv = _argv(_plan(tmp_path, "5"), out, redis_server, sim, job_name)
        monkeypatch.setenv("OPENROUTER_API_KEY", capped)
        assert main(argv) == 3  # the field's bare 403: the budget's stop, not exit 5
        assert "To resume: provider-router run" in capsys.readouterr().err
        assert any(r.status == 403 for r in sim.server.requests)
        summary = json.loads((out / "summary.json").read_text())
        assert summary["reason"] == "budget_exhausted"
        assert "the API key's limit is used up" in summary["message"]
        assert "raise the key's limit on https://openrouter.ai/settings/keys" in summary["message"]
        assert all(d["this_run"]["failures"] == 0 for d in summary["datasets"].values())
        monkeypatch.setenv("OPENROUTER_API_KEY", working)
        assert main(argv) == 0
        assert _ids(out / "a.jsonl") == Counter({f"a{i}": 1 for i in range(30)})
        assert _ids(out / "b.jsonl") == Counter({f"b{i}": 1 for i in range(20)})
        capsys.readouterr()
    finally:
        sim.stop()


def _files_holding(root: Path, needle: bytes) -> list[Path]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                if needle in path.read_bytes():
                    found.append(path)
            except OSError:
                continue
    return found
