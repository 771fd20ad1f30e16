"""A job is one truth: its outputs answer the inputs, model, policy and parameters it has now.

Each finding of the job's identity, reproduced against the local OpenRouter: prompts edited
under their ids are sent again (their old answers moved aside, kept and counted), a resume
with another model or a dropped policy is refused before anything is sent, a prompt file
new to a job is refused unless added, and a directory from before manifests is adopted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Iterable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from _job_helpers import assert_consistent, ledger_spent, read_records, run_cli

from provider_router import JobRefused
from provider_router.jobs import run_plan
from provider_router.jobs.store.digest import RequestDigest
from provider_router.jobs.summary import StopReason
from provider_router.planning.plan import Plan
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

Factory = Callable[..., Awaitable[SimulatorServer]]
MODEL = "moonshotai/kimi-k2.5"
OTHER = "moonshotai/kimi-k3"


def write_questions(path: Path, count: int, edited: Iterable[int] = ()) -> Path:
    """``count`` prompts ``q<n>``; those in ``edited`` carry another, longer text."""
    changed = set(edited)
    with path.open("w") as fh:
        for n in range(count):
            text = f"question {n}"
            if n in changed:
                text = f"an edited question {n}, asked at much greater length than before"
            fh.write(json.dumps({"id": f"q{n}", "prompt": text}) + "\n")
    return path


def single(path: Path, *, budget: str = "10", model: str = MODEL, **options: Any) -> Plan:
    return Plan.single(
        [path],
        model=model,
        budget=Decimal(budget),
        max_tokens=options.pop("max_tokens", 200),
        concurrency=16,
        exclude_below=options.pop("exclude_below", "int4"),
        **options,
    )


def chats(sim: SimulatorServer) -> int:
    return sum(1 for r in sim.requests if r.route == "chat")


async def run(plan: Plan, out: Path, sim: SimulatorServer, **options: Any) -> Any:
    return await run_plan(
        plan, out, api_key=DEFAULT_TEST_KEY, base_url=sim.url, preflight=False, **options
    )


def cli(out: Path, sim: SimulatorServer, *argv: str) -> list[str]:
    return [
        "run", *argv, "--out", str(out), "--base-url", sim.url, "--progress", "off",
        "--no-preflight",
    ]  # fmt: skip


async def test_prompts_edited_under_their_ids_are_sent_again_and_their_old_answers_moved_aside(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(speed=float("inf"), seed=5)
    inputs = write_questions(tmp_path / "p.jsonl", 300)
    out = tmp_path / "out"
    plan = single(inputs)
    first = await run(plan, out, sim)
    assert first.reason is StopReason.COMPLETE
    before = {r["id"]: r for r in read_records(out / "p.jsonl")}
    assert len(before) == 300
    # 50 prompts get new text under the same ids.
    edited = range(0, 300, 6)
    write_questions(inputs, 300, edited)
    sent = chats(sim)

    second = await run(plan, out, sim)

    assert second.reason is StopReason.COMPLETE
    assert chats(sim) - sent == 50, "exactly the 50 edited prompts were sent again"
    rows = {r["id"]: r for r in read_records(out / "p.jsonl")}
    assert len(rows) == len(read_records(out / "p.jsonl")) == 300, "each id once"
    digest = RequestDigest(MODEL, {"max_tokens": 200})
    for n in range(300):
        row, old = rows[f"q{n}"], before[f"q{n}"]
        asked = row["messages"][0]["content"]
        assert row["request_digest"] == digest([{"role": "user", "content": asked}])
        if n in edited:
            assert asked.startswith("an edited question"), "the row answers the new text"
            assert row["generation_id"] != old["generation_id"]
            assert row["usage"]["prompt_tokens"] > old["usage"]["prompt_tokens"]
        else:
            assert row == old, "an unchanged prompt keeps its answer"
    # The 50 old answers are kept, never deleted, and counted in one sentence.
    aside = read_records(out / "set_aside" / "edited" / "p.jsonl")
    assert sorted(r["id"] for r in aside) == sorted(f"q{n}" for n in edited)
    for kept in aside:
        assert kept == before[kept["id"]], "kept whole, as it was"
    said = " ".join(second.summary.recovered)
    assert "50 answers of dataset p no longer answer its inputs" in said, said
    assert "set aside in set_aside/" in said
    assert second.summary.datasets[0].completed == 300
    assert_consistent(out, ["p"])
    assert ledger_spent(out) == sim.simulator.usage
    # Nothing more to do: the next run sends nothing and moves nothing.
    sent = chats(sim)
    third = await run(plan, out, sim)
    assert chats(sim) == sent
    assert not third.summary.recovered
    assert len(read_records(out / "set_aside" / "edited" / "p.jsonl")) == 50


async def test_outputs_for_ids_no_longer_in_the_inputs_are_counted_and_said(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(speed=float("inf"), seed=5)
    inputs = write_questions(tmp_path / "p.jsonl", 12)
    out = tmp_path / "out"
    await run(single(inputs), out, sim)
    lines = inputs.read_text().splitlines()
    inputs.write_text("\n".join(lines[:9]) + "\n")  # q9, q10 and q11 are gone
    sent = chats(sim)
    again = await run(single(inputs), out, sim)
    assert chats(sim) == sent
    said = " ".join(again.summary.recovered)
    assert "3 outputs of dataset p answer prompts no longer in its inputs (q10, q11, q9)" in said
    assert len(read_records(out / "p.jsonl")) == 12, "they stay"


async def budget_stopped_job(tmp_path: Path, sim: SimulatorServer) -> tuple[Path, Path, list[str]]:
    """150 prompts of kimi-k2.5 under ``--exclude-below int4``, stopped by a small budget."""
    inputs = write_questions(tmp_path / "p.jsonl", 150)
    out = tmp_path / "out"
    argv = cli(
        out, sim, str(inputs), "--model", MODEL, "--exclude-below", "int4",
        "--max-tokens", "400", "--concurrency", "8",
    )  # fmt: skip
    code, _, err = await run_cli(*argv, "--budget", "0.03")
    assert code == 3, err
    assert 0 < len(read_records(out / "p.jsonl")) < 150
    return inputs, out, argv


@pytest.mark.parametrize(
    ("change", "said", "way_back"),
    [
        (
            ["--model", OTHER],
            f"model: the job's {MODEL}, this run's {OTHER}",
            f"--model {MODEL}",
        ),
        (
            ["--drop", "--exclude-below"],
            "policy.exclude_below: the job's int4, this run's (none)",
            "--exclude-below int4",
        ),
        (
            ["--max-tokens", "800"],
            "dataset p generation.max_tokens: the job's 400, this run's 800",
            "--max-tokens 400",
        ),
    ],
    ids=["another-model", "dropped-exclude-below", "another-max-tokens"],
)
async def test_a_resume_that_changes_what_the_outputs_answer_is_refused_before_anything_is_sent(
    tmp_path: Path,
    openrouter_sim_factory: Factory,
    change: list[str],
    said: str,
    way_back: str,
) -> None:
    sim = await openrouter_sim_factory(speed=float("inf"), seed=5)
    _, out, argv = await budget_stopped_job(tmp_path, sim)
    rows = (out / "p.jsonl").read_bytes()
    if change[0] == "--drop":
        at = argv.index(change[1])
        resumed = argv[:at] + argv[at + 2 :]
    else:
        at = argv.index(change[0])
        resumed = [*argv[:at], *change, *argv[at + 2 :]]
    requests = len(sim.requests)

    code, _, err = await run_cli(*resumed, "--budget", "1")

    assert code == 2, err
    assert said in err, err
    assert f"Run it with the job's values ({way_back})" in err
    assert "or give this run another --out" in err
    # A larger cap has a third way: send again only the answers cut at the job's.
    assert ("add --redo-truncated" in err) == (change[0] == "--max-tokens"), err
    assert "nothing was sent" in err
    assert len(sim.requests) == requests, "nothing was sent, not even a preflight"
    assert (out / "p.jsonl").read_bytes() == rows
    # The job's own values resume it, and every row answers its one model.
    code, _, err = await run_cli(*argv, "--budget", "1")
    assert code == 0, err
    records = read_records(out / "p.jsonl")
    assert len(records) == 150
    assert {r["model"] for r in records} == {MODEL}


async def test_a_job_without_outputs_takes_the_values_of_its_next_run(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(speed=float("inf"), seed=5)
    inputs = write_questions(tmp_path / "p.jsonl", 4)
    out = tmp_path / "out"
    await run(single(inputs, budget="0.000001"), out, sim)  # stopped before any answer
    assert not read_records(out / "p.jsonl")
    outcome = await run(single(inputs, model=OTHER), out, sim)
    assert outcome.reason is StopReason.COMPLETE
    assert {r["model"] for r in read_records(out / "p.jsonl")} == {OTHER}
    assert json.loads((out / "job.json").read_text())["model"] == OTHER


async def test_another_prompt_file_for_an_existing_job_is_refused_unless_added(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(speed=float("inf"), seed=5)
    first = write_questions(tmp_path / "a.jsonl", 5)
    other = write_questions(tmp_path / "b.jsonl", 3)
    out = tmp_path / "out"
    flags = ["--model", MODEL, "--budget", "5", "--max-tokens", "200", "--exclude-below", "int4"]
    code, _, err = await run_cli(*cli(out, sim, str(first), *flags))
    assert code == 0, err
    requests = len(sim.requests)

    code, _, err = await run_cli(*cli(out, sim, str(other), *flags))
    assert code == 2, err
    assert f"gives it prompt files it does not have: dataset b ({other.resolve()})" in err
    assert "Add them to this job with --add-inputs, or give this run another --out" in err
    # The same name for another file is another file too.
    code, _, err = await run_cli(*cli(out, sim, str(other), "--name", "a", *flags))
    assert code == 2, err
    assert f"dataset a reading {other.resolve()} instead of {first.resolve()}" in err
    assert len(sim.requests) == requests, "nothing was sent"
    assert not (out / "b.jsonl").exists()

    code, _, err = await run_cli(*cli(out, sim, str(other), "--add-inputs", *flags))
    assert code == 0, err
    assert "prompt files added to the job in" in err
    assert len(read_records(out / "b.jsonl")) == 3
    manifest = json.loads((out / "job.json").read_text())
    assert sorted(manifest["datasets"]) == ["a", "b"]


def legacy(out: Path, models: dict[str, str] | None = None) -> None:
    """Make ``out`` look written by the release before manifests: no ``job.json``, no
    ``checked`` entries, rows without a digest (``models``: another model for some ids).
    Rows keep their lengths (JSON whitespace pads them), so the journal still commits them."""
    (out / "job.json").unlink()
    journal = out / "journal.jsonl"
    journal.write_text(
        "".join(
            line for line in journal.read_text().splitlines(keepends=True)
            if '"op":"checked"' not in line
        )
    )  # fmt: skip
    rows = []
    for line in (out / "p.jsonl").read_text().splitlines():
        line = re.sub(r'"request_digest":"[0-9a-f]{32}"', '"request_digest":null' + " " * 30, line)
        record = json.loads(line)
        model = (models or {}).get(record["id"])
        if model is not None:
            was = f'"model":"{MODEL}"'
            line = line.replace(was, f'"model":"{model}"' + " " * (len(MODEL) - len(model)), 1)
        rows.append(line + "\n")
    (out / "p.jsonl").write_text("".join(rows))


async def test_a_job_from_before_manifests_is_adopted_and_its_stale_rows_found(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(speed=float("inf"), seed=5)
    inputs = write_questions(tmp_path / "p.jsonl", 20)
    out = tmp_path / "out"
    await run(single(inputs), out, sim)
    # The old release's job: 2 rows answer kimi-k3 (another model joined the job), and
    # 3 prompts were edited after they were answered.
    legacy(out, {"q4": OTHER, "q9": OTHER})
    write_questions(inputs, 20, edited=[1, 2, 3])
    sent = chats(sim)

    outcome = await run(single(inputs), out, sim)

    assert outcome.reason is StopReason.COMPLETE
    assert chats(sim) - sent == 5, "3 edited, 2 of another model; the 15 others kept"
    said = " ".join(outcome.summary.recovered)
    assert "was written before jobs kept a job.json: it is now the job of" in said, said
    assert "3 because their prompt changed under its id (q1, q2, q3)" in said, said
    assert "2 because they answer another model than the job's (q4, q9)" in said, said
    rows = read_records(out / "p.jsonl")
    assert len(rows) == 20
    assert {r["model"] for r in rows} == {MODEL}
    aside = out / "set_aside"
    assert sorted(r["id"] for r in read_records(aside / "edited" / "p.jsonl")) == [
        "q1", "q2", "q3",
    ]  # fmt: skip
    assert sorted(r["id"] for r in read_records(aside / "other_model" / "p.jsonl")) == [
        "q4", "q9",
    ]  # fmt: skip
    assert json.loads((out / "job.json").read_text())["model"] == MODEL
    sent = chats(sim)
    again = await run(single(inputs), out, sim)
    assert chats(sim) == sent
    assert not again.summary.recovered


async def test_a_job_from_before_manifests_answering_one_other_model_is_refused(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(speed=float("inf"), seed=5)
    inputs = write_questions(tmp_path / "p.jsonl", 4)
    out = tmp_path / "out"
    await run(single(inputs), out, sim)
    legacy(out)
    sent = chats(sim)
    with pytest.raises(JobRefused, match=f"holds outputs of {MODEL} \\(4 rows\\).*--model {MODEL}"):
        await run(single(inputs, model=OTHER), out, sim)
    assert chats(sim) == sent
    assert not (out / "job.json").exists()


async def test_redo_truncated_raises_the_jobs_cap_and_keeps_every_answer_that_ended_on_its_own(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    # The identity check and --redo-truncated together: a larger --max-tokens is the one
    # change of what the job asks that a resume allows, and only with the flag; the
    # answers that were not cut keep their rows (the digest leaves max_tokens out).
    sim = await openrouter_sim_factory(speed=float("inf"), median_completion_tokens=100.0, seed=11)
    inputs = write_questions(tmp_path / "p.jsonl", 40)
    out = tmp_path / "out"
    argv = cli(out, sim, str(inputs), "--model", MODEL, "--max-tokens", "100", "--budget", "5")
    code, _, err = await run_cli(*argv)
    assert code == 0, err
    before = {r["id"]: r for r in read_records(out / "p.jsonl")}
    cut = {pid for pid, r in before.items() if r["finish_reason"] == "length"}
    assert cut, "the seed cuts some answers"
    assert len(cut) < len(before), "and not others"
    at = argv.index("--max-tokens")
    larger = [*argv[: at + 1], "4000", *argv[at + 2 :]]

    code, _, err = await run_cli(*larger)
    assert code == 2, err
    assert "add --redo-truncated" in err, err

    sent = chats(sim)
    code, _, err = await run_cli(*larger, "--redo-truncated")
    assert code == 0, err
    assert chats(sim) - sent == len(cut), "only the cut answers are sent again"
    after = {r["id"]: r for r in read_records(out / "p.jsonl")}
    assert set(after) == set(before)
    for pid, row in after.items():
        if pid in cut:
            assert row["max_tokens"] == 4000
            assert row["generation_id"] != before[pid]["generation_id"]
        else:
            assert row == before[pid], "an answer that ended on its own stays as it was"
    kept = read_records(out / "set_aside" / "truncated" / "p.jsonl")
    assert sorted(r["id"] for r in kept) == sorted(cut)
    assert (
        json.loads((out / "job.json").read_text())["datasets"]["p"]["generation"]["max_tokens"]
        == 4000
    )
