"""``run --ray`` does what ``run`` does on one machine: targets, stops, locks, preflight,
progress, metrics, --own-key; and refuses a batch-route dataset (#22)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from provider_router.cli import main
from provider_router.client.metrics import Metrics
from provider_router.jobs.observe.live import progress_lines
from provider_router.jobs.store._journal_file import lock_directory, lock_held, unlock
from provider_router.jobs.store.outputs import read_outputs
from provider_router.planning.plan import load_plan
from tests._polling import wait_until
from tests.ledger.conftest import RedisServer
from tests.ray._sim_thread import SimulatorThread
from tests.ray.conftest import CREDITS, KEY, MODEL

pytestmark = [pytest.mark.ray, pytest.mark.redis, pytest.mark.timeout(240)]

MAX_TOKENS = 256


def _write_plan(tmp_path: Path, budget: str = "5", count: int = 30, **dataset: Any) -> Path:
    source = tmp_path / "a.jsonl"
    source.write_text(
        "".join(json.dumps({"id": f"a{i}", "prompt": f"q {i}"}) + "\n" for i in range(count))
    )
    extra = "".join(f", {k}: {v}" for k, v in dataset.items())
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        f"model: {MODEL}\nbudget: {budget}\nconcurrency: 8\n"
        f"generation: {{max_tokens: {MAX_TOKENS}}}\n"
        f"datasets:\n  - {{name: a, input: {source}{extra}}}\n"
    )
    return plan


def _ids(path: Path) -> Counter[str]:
    if not path.is_file():
        return Counter()
    return Counter(record["id"] for _, record in read_outputs(path))


def _prompts_sent(sim: SimulatorThread) -> int:
    return sum(1 for r in sim.server.requests if r.max_tokens != 1)


class _Setup:
    def __init__(self, redis: RedisServer, name: str, tmp_path: Path) -> None:
        self.redis, self.name, self.tmp_path = redis, name, tmp_path
        self.out = tmp_path / "out"

    def argv(self, plan: Path, sim: SimulatorThread, *extra: str) -> list[str]:
        return [
            "run", "--plan", str(plan), "--out", str(self.out), "--ray", "--ray-actors", "2",
            "--ledger", self.redis.url, "--ledger-name", self.name, "--base-url", sim.url,
            *extra,
        ]  # fmt: skip


@pytest.fixture
def setup(
    ray_session: Path,
    redis_server: RedisServer,
    job_name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> _Setup:
    monkeypatch.setenv("OPENROUTER_API_KEY", KEY)
    return _Setup(redis_server, job_name, tmp_path)


@pytest.fixture
def slow_sim() -> Iterator[SimulatorThread]:
    """The local OpenRouter at 20x its realistic latency: answers take a fraction of a second
    to a few seconds, so requests are in flight when the test acts."""
    server = SimulatorThread(api_keys=[KEY], speed=20.0, credits=CREDITS)
    try:
        yield server
    finally:
        server.stop()


def test_a_dataset_stops_at_its_output_token_target(
    setup: _Setup, sim: SimulatorThread, capsys: pytest.CaptureFixture[str]
) -> None:
    target = 1200
    plan = _write_plan(setup.tmp_path, count=60, target_output_tokens=target)
    assert main(setup.argv(plan, sim)) == 0  # was: refused ("not supported with --ray yet")
    records = [r for _, r in read_outputs(setup.out / "a.jsonl")]
    tokens = sum(r["usage"]["completion_tokens"] for r in records)
    summary = json.loads((setup.out / "summary.json").read_text())
    assert summary["reason"] == "complete"
    assert summary["datasets"]["a"]["output_tokens"] == tokens >= target
    # Each request in flight is priced at its cap before lengths are known, so the last
    # one admitted could not take the dataset past target + one request's cap.
    assert tokens < target + MAX_TOKENS
    assert len(records) < 60  # the rest was never sent
    assert _prompts_sent(sim) == len(records)
    capsys.readouterr()


def test_a_target_the_prompts_cannot_reach_exits_6_as_run_does(
    setup: _Setup, sim: SimulatorThread, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = _write_plan(setup.tmp_path, count=5, target_output_tokens=10**6)
    assert main(setup.argv(plan, sim)) == 6
    summary = json.loads((setup.out / "summary.json").read_text())
    assert summary["reason"] == "target_not_reached"
    assert "its prompts ran out at" in summary["message"]
    assert sum(_ids(setup.out / "a.jsonl").values()) == 5
    capsys.readouterr()


def test_a_first_ctrl_c_lets_requests_in_flight_finish_and_keeps_every_paid_answer(
    setup: _Setup, slow_sim: SimulatorThread, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = _write_plan(setup.tmp_path, count=80)
    argv = setup.argv(plan, slow_sim)
    interrupted = threading.Event()

    def interrupt_when_busy() -> None:
        wait_until(lambda: _prompts_sent(slow_sim) >= 12, 120)
        os.kill(os.getpid(), signal.SIGINT)
        interrupted.set()

    thread = threading.Thread(target=interrupt_when_busy, daemon=True)
    thread.start()
    code = main(argv)
    thread.join(5)
    assert interrupted.is_set()
    assert code == 130
    err = capsys.readouterr().err
    assert "Stopping: no new requests; letting those in flight finish" in err
    assert "To resume: provider-router run" in err
    written = sum(_ids(setup.out / "a.jsonl").values())
    # Every request sent came back and was written: none was cut (was: Ray shut down on
    # the first Ctrl-C, and the answers in flight were paid for and lost).
    assert 12 <= written == _prompts_sent(slow_sim) < 80
    summary = json.loads((setup.out / "summary.json").read_text())
    assert summary["reason"] == "interrupted"
    assert Decimal(summary["spent_usd"]) == slow_sim.charged(CREDITS)
    assert Decimal(summary["reserved_usd"]) == 0

    assert main(argv) == 0  # the resume sends only the rest
    assert _ids(setup.out / "a.jsonl") == Counter({f"a{i}": 1 for i in range(80)})
    assert _prompts_sent(slow_sim) == 80
    capsys.readouterr()


def test_a_second_run_on_the_same_directory_is_refused_as_run_refuses_it(
    setup: _Setup, sim: SimulatorThread, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = _write_plan(setup.tmp_path)
    setup.out.mkdir()
    fd = lock_directory(setup.out)  # what a running `run` or `run --ray` holds
    try:
        assert main(setup.argv(plan, sim)) == 1
    finally:
        unlock(fd)
    assert "another provider-router process is using" in capsys.readouterr().err
    assert _prompts_sent(sim) == 0
    assert not (setup.out / "a.jsonl").exists()


def test_the_run_holds_the_directory_lock_while_it_runs(
    setup: _Setup, slow_sim: SimulatorThread, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = _write_plan(setup.tmp_path, count=16)
    seen: list[bool | None] = []

    def look() -> None:
        wait_until(lambda: _prompts_sent(slow_sim) >= 4, 120)
        seen.append(lock_held(setup.out))  # what `provider-router status` asks

    thread = threading.Thread(target=look, daemon=True)
    thread.start()
    assert main(setup.argv(plan, slow_sim)) == 0
    thread.join(5)
    assert seen == [True]
    assert lock_held(setup.out) is False
    capsys.readouterr()


@pytest.mark.parametrize("route", ["batch", "auto"])
def test_a_batch_route_dataset_is_refused_before_anything_is_sent(
    setup: _Setup, sim: SimulatorThread, capsys: pytest.CaptureFixture[str], route: str
) -> None:
    plan = _write_plan(setup.tmp_path, route=route)
    assert main(setup.argv(plan, sim)) == 2  # was: run sync on Ray, silently
    err = capsys.readouterr().err
    assert f"dataset 'a' has route: {route}: the Batch API route runs on one machine" in err
    assert f"{plan}:6: dataset 'a'" in err  # the plan file and the dataset's line
    assert _prompts_sent(sim) == 0
    assert not (setup.out / "a.jsonl").exists()


def test_a_failed_preflight_sends_no_prompt(
    setup: _Setup, sim: SimulatorThread, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = _write_plan(setup.tmp_path)
    plan.write_text(plan.read_text() + "policy: {only: [nobody-serves-this]}\n")
    assert main(setup.argv(plan, sim)) == 1
    err = capsys.readouterr().err
    assert "the preflight failed; no prompt was sent (--no-preflight skips it)" in err
    assert sim.server.requests == []  # not even the preflight's request: no endpoint allowed
    assert not (setup.out / "a.jsonl").exists()


def test_progress_and_metrics_show_what_run_shows(
    setup: _Setup, sim: SimulatorThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rich.console import Console

    from provider_router.jobs.observe import live as progress
    from provider_router.ray.plan_run import RayPlanRun

    monkeypatch.setattr(progress, "_PLAIN_INTERVAL", 0.2)
    plan = load_plan(_write_plan(setup.tmp_path)).with_overrides(
        ledger=setup.redis.url, ledger_name=setup.name
    )
    lines: list[str] = []

    class Recorder(Console):
        def print(self, *objects: Any, **kwargs: Any) -> None:
            lines.append(" ".join(str(o) for o in objects))

    metrics = Metrics()
    run = RayPlanRun(
        plan, setup.out, base_url=sim.url, actors=2, metrics=metrics,
        console=Recorder(), progress="plain",
    )  # fmt: skip
    summary = run.run()
    assert summary.reason.value == "complete"
    assert any(line.startswith("  dataset=a, done=") for line in lines)  # run's plain lines
    final = run.driver.progress()
    (a,) = final.datasets
    assert (a.completed, a.total, a.output_tokens) == (30, 30, summary.datasets[0].output_tokens)
    assert a.cost == summary.datasets[0].cost
    assert (a.run.requests, a.run.output_tokens) == (30, a.output_tokens)  # this run's rates
    assert any("done=30/30" in line for line in progress_lines(final))
    sample = metrics.registry.get_sample_value
    served = sum(
        sample("provider_router_requests_total", {"provider": p, "outcome": "success"}) or 0
        for p in summary.providers
    )
    assert served == 30
    assert sample("provider_router_spent_usd") == float(summary.spent)
    assert sample("provider_router_budget_limit_usd") == 5.0
    assert sample("provider_router_in_flight") == 0


def test_own_key_records_the_account_baseline_before_spending(
    setup: _Setup, sim: SimulatorThread, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = _write_plan(setup.tmp_path)
    assert main(setup.argv(plan, sim, "--own-key")) == 0
    account = json.loads((setup.out / "account.json").read_text())  # was: --own-key ignored
    summary = json.loads((setup.out / "summary.json").read_text())
    # As run's: the baseline is taken after the preflight, before the first prompt.
    assert Decimal(account["spent"]) == Decimal(summary["preflight_usd"]) > 0
    assert Decimal(account["usage"]) >= 0
    capsys.readouterr()


def test_a_second_ctrl_c_stops_at_once_and_the_resume_loses_nothing(
    setup: _Setup, slow_sim: SimulatorThread
) -> None:
    """In a process of its own (its own local cluster): the hard stop kills Ray's actors."""
    plan = _write_plan(setup.tmp_path, count=80)
    argv = [sys.executable, "-m", "provider_router", *setup.argv(plan, slow_sim, "--lease", "2")]
    env = {**os.environ, "OPENROUTER_API_KEY": KEY, "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True) as proc:  # noqa: S603
        assert proc.stderr is not None
        wait_until(lambda: _prompts_sent(slow_sim) >= 12, 180)
        proc.send_signal(signal.SIGINT)
        for line in proc.stderr:  # the first Ctrl-C is taken ...
            if line.startswith("Stopping: no new requests"):
                break
        proc.send_signal(signal.SIGINT)  # ... and the second stops at once
        rest = proc.stderr.read()
        assert proc.wait(120) == 130
    assert "To resume: provider-router run" in rest
    written = _ids(setup.out / "a.jsonl")
    assert all(n == 1 for n in written.values())

    # The resume recovers the killed requests' reservations and sends only the rest.
    resume = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)  # noqa: S603
    assert resume.returncode == 0, resume.stderr[-2000:]
    assert _ids(setup.out / "a.jsonl") == Counter({f"a{i}": 1 for i in range(80)})
    summary = json.loads((setup.out / "summary.json").read_text())
    assert Decimal(summary["reserved_usd"]) == 0
    # What the cut requests cost was settled from OpenRouter's records, never guessed low.
    assert Decimal(summary["spent_usd"]) >= slow_sim.charged(CREDITS)
