"""The operator's view of ``run --verify``: ``status``, ``report.html`` and Prometheus say
which checks ran (when, cost), what they excluded and why (with the interval), the rows
flagged per provider, each endpoint's last pass and pass rate, in the CLI's own words; and
``status`` of a dead run, or of a damaged or huge ``verify.json`` or journal, says so in
a line, never a crash. On the local OpenRouter (a Chutes that turns degraded mid-run)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import time
from collections.abc import Awaitable, Callable
from decimal import Decimal
from functools import partial
from html import unescape
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import pytest
from _drift_helpers import Factory, chutes_turning, turning_cli_job
from _job_helpers import run_cli, small_plan, spawn_cli
from _polling import until
from hypothesis import given, settings
from hypothesis import strategies as st

import provider_router as pr
from provider_router.client.metrics import Metrics
from provider_router.jobs import RunSummary, StopReason
from provider_router.jobs.drift_history import DriftCheck, DriftHistory, verification_summary
from provider_router.jobs.observe import drift_view
from provider_router.jobs.observe.drift_view import read_drift_view, verification_lines
from provider_router.jobs.observe.report import write_report
from provider_router.jobs.observe.standard import standard_observers
from provider_router.jobs.observe.status import status_lines
from provider_router.jobs.runner import JobRunner
from provider_router.jobs.store._layout import TIMELINE_FILE
from provider_router.testing.server import DEFAULT_TEST_KEY


async def _drifted_run(
    tmp_path: Path,
    factory: Factory,
    metrics: Metrics | None = None,
    watch: Callable[[asyncio.Task[RunSummary]], Awaitable[None]] | None = None,
) -> tuple[Path, RunSummary, DriftHistory]:
    """A run of 200 prompts, checks every 40 rows, whose Chutes turns degraded after 60
    (``watch``: awaited with the run's task while it runs)."""
    sim, _ = await chutes_turning(tmp_path, factory, checks=2, rows=60)
    out = tmp_path / "out"
    runner = JobRunner(
        small_plan(tmp_path, requests=None, prompts=200),
        out,
        base_url=sim.url,
        api_key=DEFAULT_TEST_KEY,
        verify=True,
        verify_every=40,
        router_options={} if metrics is None else {"metrics": metrics},
        observers=standard_observers(),
    )
    task = asyncio.create_task(runner.run())
    if watch is not None:
        await watch(task)
    summary = await task
    assert summary.reason is StopReason.COMPLETE
    history = DriftHistory.load(out / "verify.json")
    assert list(history.failed) == ["chutes"]
    assert history.flagged > 0
    failing = next(c for c in history.checks if c.failed)
    assert failing.flagged_by == {"Chutes": history.flagged}  # counted per provider
    return out, summary, history


def _endpoint_line(lines: list[str], tag: str) -> str:
    found = [line for line in lines if re.match(rf"  \S.* \({re.escape(tag)}\): ", line)]
    assert len(found) == 1, lines
    return found[0]


async def test_status_of_a_drifted_run_says_what_the_checks_found_in_the_cli_words(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    out, summary, history = await _drifted_run(tmp_path, openrouter_sim_factory)
    lines = status_lines(out, now=time.time())
    assert summary.verification is not None
    said = verification_lines(summary.verification, out)  # what run --verify ended with
    start = lines.index(said[0])
    assert lines[start : start + len(said)] == said
    assert said[1].startswith(f"Excluded Chutes (chutes) at check {history.failed['chutes']}:")
    assert "95% CI" in said[1]  # the measured reason, with its interval
    # Every check listed (they fit): number, trigger, time, cost.
    checks = [line for line in lines if line.startswith("  check ")]
    assert len(checks) == len(history.checks) <= drift_view.SHOWN_CHECKS
    assert checks[0].startswith("  check 0 before the run (")
    assert " UTC, after 0 rows of its run): " in checks[0]
    failed_at = history.failed["chutes"]
    assert [c for c in checks if "failed: chutes" in c] == [
        c for c in checks if c.startswith(f"  check {failed_at} ")
    ]
    # Chutes: excluded, with its reason, its last pass, pass rate and rows flagged.
    chutes = _endpoint_line(lines, "chutes")
    verdict = history.report.verdict("chutes") if history.report else None
    assert verdict is not None
    assert chutes.startswith(f"  Chutes (chutes): excluded at check {failed_at}: {verdict.reason};")
    assert f"last passed check {history.last_pass['chutes']} (" in chutes
    assert f"pass rate {verdict.accepted}/{verdict.judged} (" in chutes
    assert chutes.endswith(f"; {history.flagged:,} rows flagged")
    # Every other endpoint that was measured: allowed, with its own last pass.
    for tag, seq in history.last_pass.items():
        if tag not in history.failed and history.report and tag != history.report.reference:
            line = _endpoint_line(lines, tag)
            assert ": allowed; last passed check " + str(seq) in line
            assert "rows flagged" not in line


async def test_status_of_a_dead_run_still_says_what_verification_excluded(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    out, summary, _ = await _drifted_run(tmp_path, openrouter_sim_factory)
    # As a run killed before it wrote its summary leaves it: no summary, no final line.
    (out / "summary.json").unlink()
    timeline = (out / TIMELINE_FILE).read_text().splitlines()
    (out / TIMELINE_FILE).write_text("\n".join(timeline[:-1]) + "\n")
    lines = status_lines(out, now=time.time())
    assert lines[0].startswith(f"{out}: stopped (killed?)")
    assert summary.verification is not None
    for sentence in verification_lines(summary.verification, out):
        assert sentence in lines
    assert _endpoint_line(lines, "chutes").startswith("  Chutes (chutes): excluded at check ")


async def test_the_report_page_has_a_verification_section_in_the_same_words(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    out, summary, history = await _drifted_run(tmp_path, openrouter_sim_factory)
    page = write_report(out).read_text(encoding="utf-8")
    found = re.search(r'<section data-section="verification">(.*?)</section>', page, re.S)
    assert found is not None
    section = found.group(1)
    paragraphs = [unescape(p) for p in re.findall(r"<p>(.*?)</p>", section)]
    assert summary.verification is not None
    assert paragraphs[:3] == verification_lines(summary.verification, out)
    cells = [unescape(c) for c in re.findall(r"<td>(.*?)</td>", section)]
    row = cells[cells.index("chutes") - 1 : cells.index("chutes") + 5]
    assert row[0] == "Chutes"
    assert row[2].startswith(f"excluded at check {history.failed['chutes']}: greedy agreement")
    assert row[5] == f"{history.flagged:,}"
    assert section.count("<li>check ") == len(history.checks)


async def test_prometheus_counts_the_checks_the_exclusions_and_the_flagged_rows_live(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    metrics = Metrics()
    metrics.serve(0)
    scraped: list[str] = []

    def sample(name: str, **labels: str) -> float | None:
        value = metrics.registry.get_sample_value(f"provider_router_{name}", labels)
        return None if value is None else float(value)

    async def scrape_once_excluded(task: asyncio.Task[RunSummary]) -> None:
        excluded = partial(sample, "verification_excluded_endpoints", provider="Chutes")
        await until(lambda: excluded() == 1 or task.done())
        assert not task.done()  # live: while the run goes on
        host, port = metrics.address or ("", 0)
        with await asyncio.to_thread(urlopen, f"http://{host}:{port}/metrics") as answer:
            scraped.append(answer.read().decode())

    try:
        _, _, history = await _drifted_run(
            tmp_path, openrouter_sim_factory, metrics, scrape_once_excluded
        )
    finally:
        metrics.close()
    assert 'provider_router_verification_excluded_endpoints{provider="Chutes"} 1.0' in (
        scraped[0].splitlines()
    )
    assert 'provider_router_verification_checks{outcome="made"} ' in scraped[0]

    assert sample("verification_checks", outcome="made") == len(history.checks)
    assert sample("verification_checks", outcome="not_made") == 0
    assert sample("verification_excluded_endpoints", provider="Chutes") == 1
    assert sample("verification_flagged_rows", provider="Chutes") == history.flagged
    assert sample("verification_cost_usd") == pytest.approx(float(history.cost))


async def test_the_status_command_prints_the_verification(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    _, out, argv = await turning_cli_job(tmp_path, openrouter_sim_factory, prompts=60)
    code, _, err = await run_cli(*argv, "--verify", "--verify-every", "20")
    assert code == 0, err[-2000:]
    code, text, _ = await run_cli("status", str(out))
    assert code == 0
    said = [line for line in err.splitlines() if line.startswith(("Verification:", "Excluded "))]
    assert said
    for line in said:
        assert line in text.splitlines()


# --- damaged, huge and missing files (no simulator needed) -----------------------------


def _dead_run(tmp_path: Path) -> Path:
    """A run directory as a killed run leaves it: a timeline line, no summary."""
    out = tmp_path / "out"
    out.mkdir()
    (out / TIMELINE_FILE).write_text(json.dumps({"t": time.time(), "pid": -1}) + "\n")
    return out


def _verification(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("verification: ")]


def test_a_run_without_verify_says_nothing_of_it(tmp_path: Path) -> None:
    out = _dead_run(tmp_path)
    (out / "journal.jsonl").write_text('{"op":"ledger","id":"x"}\n')
    lines = status_lines(out, now=time.time())
    assert not [line for line in lines if "verif" in line.replace(str(out), "").lower()]
    assert 'data-section="verification"' not in write_report(out).read_text()


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"{not json", "is not a verification report"),
        (b"\xff\xfe garbage", "is not a verification report"),
        (b"[" * 200_000, "nested too deep"),
        (b'{"version": 1, "model": "m"}', "is not a verification report"),
        (b'{"drift": {"version": 9}}', "is not a verification report"),
    ],
)
def test_a_damaged_verify_json_is_a_line_not_a_crash(
    tmp_path: Path, content: bytes, said: str
) -> None:
    out = _dead_run(tmp_path)
    (out / "verify.json").write_bytes(content)
    lines = _verification(status_lines(out, now=time.time()))
    assert len(lines) == 1
    assert said in lines[0]
    assert "restore it before resuming" in lines[0]
    page = write_report(out).read_text()
    assert '<p class="problem">' in page


def test_a_huge_verify_json_is_not_read(tmp_path: Path) -> None:
    out = _dead_run(tmp_path)
    with (out / "verify.json").open("wb") as handle:  # sparse: nothing written
        handle.truncate(drift_view.VERIFY_READ_LIMIT + 1)
    lines = _verification(status_lines(out, now=time.time()))
    assert len(lines) == 1
    assert f"verification: {out / 'verify.json'} is over 16 MiB" in lines[0]
    assert "not read" in lines[0]


def test_an_exclusion_the_journal_records_without_its_verify_json_is_said(tmp_path: Path) -> None:
    out = _dead_run(tmp_path)
    journal = [
        {"op": "ledger", "id": "x"},
        {"op": "verify", "ts": 1.0, "failed": ["chutes"], "check": 3},
    ]
    (out / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in journal))
    lines = _verification(status_lines(out, now=time.time()))
    assert lines == [
        f"verification: the journal records chutes excluded but {out / 'verify.json'} is "
        "missing: a resume is refused until it is restored"
    ]
    assert read_drift_view(out).journaled == {"chutes": 3}


def test_the_journal_is_read_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = _dead_run(tmp_path)
    note = json.dumps({"op": "verify", "failed": ["chutes"], "check": 1}) + "\n"
    long_line = '{"op":"verify","failed":["' + "x" * (drift_view.JOURNAL_LINE_LIMIT * 2) + '"]}\n'
    torn = '{"op":"verify","failed":["deepinfra"]'  # a torn last line: not an exclusion
    (out / "journal.jsonl").write_text(long_line + note + torn)
    assert read_drift_view(out).journaled == {"chutes": 1}  # the over-long line passed over

    monkeypatch.setattr(drift_view, "JOURNAL_SCAN_LIMIT", 1000)
    (out / "journal.jsonl").write_text('{"op":"ledger","id":"x"}\n' * 100 + note)
    view = read_drift_view(out)
    assert view.journaled == {}
    assert view.problems == [
        f"{out / 'journal.jsonl'} is over 1,000 bytes: only its first 1,000 bytes were "
        "searched for exclusions"
    ]


def _history() -> DriftHistory:
    """A job's history: Chutes excluded at check 1 after passing check 0, 7 rows flagged."""
    verdicts = (
        pr.EndpointVerdict(
            tag="chutes",
            provider_name="Chutes",
            passed=False,
            judged=8,
            accepted=4,
            reasons=("greedy agreement 0.6 (95% CI 0.5–0.7, n=8)",),
        ),
        pr.EndpointVerdict(tag="novita", provider_name="Novita", passed=True, judged=8, accepted=8),
        pr.EndpointVerdict(tag="moonshotai", provider_name="Moonshot AI", passed=True),
    )
    report = pr.VerificationReport(
        model="moonshotai/kimi-k2.5",
        reference="moonshotai",
        self_agreement=None,
        endpoints=verdicts,
    )
    history = DriftHistory(report=report, last_pass={"chutes": 0, "novita": 1})
    history.failed = {"chutes": 1}
    history.checks = [
        DriftCheck(
            0, "start", 0, ("chutes", "novita"), ("chutes", "novita"), (), Decimal("0.02"), 1.7e9
        ),
        DriftCheck(
            1,
            "every",
            40,
            ("chutes", "novita"),
            ("novita",),
            ("chutes",),
            Decimal("0.005"),
            1.7e9 + 60,
            flagged=7,
        ),
    ]
    return history


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict):
        return [path] + [p for k, v in value.items() for p in _leaves(v, (*path, k))]
    if isinstance(value, list):
        return [path] + [p for i, v in enumerate(value) for p in _leaves(v, (*path, i))]
    return [path]


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


def test_an_intact_history_is_said_whole(tmp_path: Path) -> None:
    out = _dead_run(tmp_path)
    _history().save(out / "verify.json")
    lines = status_lines(out, now=time.time())
    assert (
        "Excluded Chutes (chutes) at check 1: greedy agreement 0.6 (95% CI 0.5–0.7, n=8); "
        "it serves nothing more of this job."
    ) in lines
    assert (
        "7 rows are flagged: served by a provider since its last passing check, before it "
        "failed one (drift_flagged: true in the outputs; provider-router export leaves them out)."
    ) in lines
    chutes = _endpoint_line(lines, "chutes")
    assert chutes.startswith("  Chutes (chutes): excluded at check 1: greedy agreement 0.6")
    assert "last passed check 0 (2023-11-14 22:13:20 UTC)" in chutes
    assert chutes.endswith("pass rate 4/8 (95% CI 0.215–0.785); 7 rows flagged")
    assert "  Novita (novita): allowed; last passed check 1 (2023-11-14 22:14:20 UTC); " in (
        _endpoint_line(lines, "novita")
    )
    assert not [line for line in lines if "(moonshotai)" in line]  # the reference


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_any_damage_to_a_history_is_a_line_never_a_crash(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    out = _dead_run(tmp_path_factory.mktemp("run"))
    raw = _history().to_json()
    path = data.draw(st.sampled_from(_leaves(raw)[1:]))
    target = raw
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = data.draw(_JSON)
    (out / "verify.json").write_text(json.dumps(raw))
    lines = status_lines(out, now=time.time())  # never raises
    said = [line for line in lines if line.startswith(("Verification: ", "verification: "))]
    assert len(said) == 1
    write_report(out)  # nor does the page


@pytest.mark.parametrize("endpoints", [["0"], [["chutes"]], "chutes"])
def test_a_report_whose_endpoints_are_not_objects_is_refused_by_name(endpoints: Any) -> None:
    # Found by the test above: an AttributeError escaped, a traceback for a bad file.
    report = _history().report
    assert report is not None
    raw = {**report.to_json(), "endpoints": endpoints}
    with pytest.raises(pr.ConfigurationError, match=r"^verify\.json is not a verification report"):
        pr.VerificationReport.from_json(raw, where="verify.json")


def test_rows_flagged_are_said_per_provider_even_when_one_check_failed_two(
    tmp_path: Path,
) -> None:
    out = _dead_run(tmp_path)
    history = _history()
    assert history.report is not None
    verdicts = {v.tag: v for v in history.report.endpoints}
    failing = dataclasses.replace(verdicts["novita"], passed=False, reasons=("tool calls",))
    history.report = dataclasses.replace(
        history.report, endpoints=(verdicts["chutes"], failing, verdicts["moonshotai"])
    )
    history.failed = {"chutes": 1, "novita": 1}
    check = history.checks[1]
    check.failed, check.passed, check.flagged = ("chutes", "novita"), (), 9
    check.flagged_by = {"Chutes": 7, "Novita": 2}
    history.save(out / "verify.json")
    lines = status_lines(out, now=time.time())
    assert _endpoint_line(lines, "chutes").endswith("; 7 rows flagged")
    assert _endpoint_line(lines, "novita").endswith("; 2 rows flagged")
    summary = verification_lines(verification_summary(history), out)
    assert summary[-1].startswith("9 rows are flagged: served by a provider since its last")
    assert summary[-1] in lines
    # A history an earlier release wrote (no count per provider): together, named so.
    check.flagged_by = {}
    history.save(out / "verify.json")
    assert read_drift_view(out).flagged_by_provider() == {"Chutes + Novita": 9}
    lines = status_lines(out, now=time.time())
    assert "  Chutes + Novita: 9 rows flagged" in lines


def _excluded_and_flagged(out: Path) -> bool:
    try:
        history = DriftHistory.load(out / "verify.json")
    except pr.ConfigurationError:
        return False
    return bool(history.failed) and all(c.flagged is not None for c in history.checks)


@pytest.mark.slow
async def test_status_of_a_run_killed_after_an_exclusion_says_it_all(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    # `run --verify` as a process, SIGKILLed as soon as a check has excluded Chutes and
    # flagged its rows (1,000 prompts: far from done then).
    _, out, argv = await turning_cli_job(tmp_path, openrouter_sim_factory, prompts=1000, speed=400)
    proc = await spawn_cli(*argv, "--verify", "--verify-every", "10")
    await until(lambda: _excluded_and_flagged(out) or proc.returncode is not None)
    assert proc.returncode is None  # still running: killed now
    proc.kill()
    await proc.wait()
    history = DriftHistory.load(out / "verify.json")
    lines = status_lines(out, now=time.time())
    assert lines[0].startswith(f"{out}: stopped (killed?)")
    said = verification_lines(verification_summary(history), out)
    assert said[1].startswith(f"Excluded Chutes (chutes) at check {history.failed['chutes']}: ")
    assert lines[lines.index(said[0]) : lines.index(said[0]) + len(said)] == said
    chutes = _endpoint_line(lines, "chutes")
    assert f"last passed check {history.last_pass['chutes']} (" in chutes
    if history.flagged:
        assert chutes.endswith(f"; {history.flagged:,} row{'s' * (history.flagged > 1)} flagged")
    code, text, _ = await run_cli("status", str(out))
    assert code == 0
    assert said[1] in text.splitlines()


@pytest.mark.parametrize("chunk", [1, 7, 50, 64, 1 << 20])
def test_the_journal_reads_the_same_however_it_is_chunked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    out = _dead_run(tmp_path)
    monkeypatch.setattr(drift_view, "_CHUNK", chunk)
    monkeypatch.setattr(drift_view, "JOURNAL_LINE_LIMIT", 100)
    entries = [
        '{"op":"ledger","id":"x"}',
        '{"op":"verify","ts":1.0,"failed":["chutes"],"check":2}',
        '{"op":"note","text":"' + "verify" * 30 + '"}',  # over the line limit: passed over
        '{"op":"verify","failed":["long' + "g" * 120 + '"],"check":3}',  # over it too
        '{"op":"done","ds":"p","ids":["verify"]}',  # names it, not an entry of it
        '{"op": "verify", "failed": ["deepinfra", "novita"], "check": 4}',
        '{"op":"verify","failed":["torn"]',  # the torn last line of a kill
    ]
    (out / "journal.jsonl").write_text("\n".join(entries))
    assert read_drift_view(out).journaled == {"chutes": 2, "deepinfra": 4, "novita": 4}
