"""The drift module's parts: flagging rows in place, the history in verify.json, options."""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from _job_helpers import small_plan
from hypothesis import given, settings
from hypothesis import strategies as st

import provider_router as pr
from provider_router.jobs.drift import redo_flagging
from provider_router.jobs.drift_history import DriftCheck, DriftHistory, flag_rows
from provider_router.jobs.runner import JobRunner
from provider_router.jobs.store.outputs import encode_record, make_record
from provider_router.planning.plan import Plan


def _row(n: int, provider: str, check: int | None, flagged: bool = False) -> bytes:
    record: dict[str, Any] = dict(
        make_record(
            prompt_id=f"q{n}", dataset="p", messages=[{"role": "user", "content": "hi"}],
            text="drift_flagged\":false} in the text", reasoning=None, finish_reason="stop",
            provider=provider, model="m", served_model="m", generation_id=f"gen-{n}",
            prompt_tokens=1, completion_tokens=1, reasoning_tokens=0, cached_tokens=0,
            cost=Decimal("0.001"), metadata={}, started_at=0.0, finished_at=1.0,
        )
    )  # fmt: skip
    if check is not None:
        record["drift_check"] = check
        record["drift_flagged"] = flagged
    return encode_record(record)  # type: ignore[arg-type]


def test_rows_are_flagged_in_place_from_the_check_number_on(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    rows = [
        _row(0, "Chutes", 0),
        _row(1, "Novita", 1),
        _row(2, "Chutes", 1),
        _row(3, "Chutes", None),  # written without --verify: never patched
        _row(4, "Chutes", 2, flagged=True),  # already flagged
        _row(5, "Chutes", 2),
        _row(6, "Chutes", 3),  # past the committed length: not touched
    ]
    path.write_bytes(b"".join(rows))
    committed = sum(len(r) for r in rows[:-1])
    before = path.stat().st_size
    assert flag_rows(path, committed, {"Chutes": 1}) == 3  # two now, one before
    assert path.stat().st_size == before  # no committed offset moved
    lines = path.read_bytes().splitlines(keepends=True)
    assert [len(line) for line in lines] == [len(r) for r in rows]
    records = [json.loads(line) for line in lines]
    assert [r.get("drift_flagged") for r in records] == [
        False, False, True, None, True, True, False,
    ]  # fmt: skip
    assert records[2]["messages"] == json.loads(rows[2])["messages"]  # only the flag changed
    assert flag_rows(path, committed, {"Chutes": 1}) == 3  # idempotent
    assert path.read_bytes().splitlines(keepends=True) == lines
    assert flag_rows(tmp_path / "missing.jsonl", 10, {"Chutes": 0}) == 0


class _Journal:
    """The journal's part a flagging uses: its rows flushed first (here: on disk already)."""

    def flush(self) -> None:
        pass


async def test_a_flagging_done_again_flags_from_the_earliest_pass_of_the_failed_endpoints(
    tmp_path: Path,
) -> None:
    # Chutes has two endpoints: int4 last passed check 2, fp8 check 5; check 7 failed
    # both, and a kill came during its flagging. Its rows since check 2 are suspect
    # (a row names its provider, not its endpoint), whatever order the tags are in.
    rows = [_row(n, "Chutes", n) for n in range(8)] + [_row(8, "Novita", 0)]
    (tmp_path / "p.jsonl").write_bytes(b"".join(rows))
    verdicts = tuple(
        pr.EndpointVerdict(tag=tag, provider_name="Chutes", passed=False)
        for tag in ("chutes/fp8", "chutes/int4")
    )
    history = DriftHistory(report=pr.VerificationReport("m", "moonshotai", None, verdicts))
    history.last_pass = {"chutes/int4": 2, "chutes/fp8": 5}
    history.failed = {"chutes/int4": 7, "chutes/fp8": 7}
    for failed in (("chutes/int4", "chutes/fp8"), ("chutes/fp8", "chutes/int4")):
        assert history.flag_floors(failed) == {"Chutes": 2}
    assert history.flag_floors(("chutes/int4", "unknown")) == {"Chutes": 2}
    assert history.flag_floors(("chutes/new",)) == {}  # not in the report: nothing to flag
    failing = DriftCheck(7, "every", 100, (), (), ("chutes/int4", "chutes/fp8"), Decimal(0), 0.0)
    failing.flagged = None
    history.checks = [DriftCheck(6, "every", 90, (), (), (), Decimal(0), 0.0), failing]
    assert await redo_flagging(tmp_path, ["p"], history, _Journal()) == [  # type: ignore[arg-type]
        "flagged the rows of check 7 again: 6 row(s) of Chutes (an earlier run was stopped "
        "while flagging them)"
    ]
    records = [json.loads(line) for line in (tmp_path / "p.jsonl").read_bytes().splitlines()]
    assert [r["drift_check"] for r in records if r["drift_flagged"]] == [2, 3, 4, 5, 6, 7]
    assert failing.flagged == 6
    assert history.checks[0].flagged == 0  # a check finished before is left alone
    assert await redo_flagging(tmp_path, ["p"], history, _Journal()) == []  # type: ignore[arg-type]


def test_the_history_round_trips_and_damage_is_named(tmp_path: Path) -> None:
    path = tmp_path / "verify.json"
    assert DriftHistory.load(path).checks == []  # no file yet: nothing checked
    verdicts = (
        pr.EndpointVerdict(tag="chutes", provider_name="Chutes", passed=False, reasons=("bad",)),
        pr.EndpointVerdict(tag="moonshotai", provider_name="Moonshot AI", passed=True),
    )
    report = pr.VerificationReport(
        model="m", reference="moonshotai", self_agreement=None, endpoints=verdicts,
        cost=Decimal("0.02"),
    )  # fmt: skip
    history = DriftHistory()
    history.merge(report)
    history.checks.append(
        DriftCheck(0, "start", 0, ("chutes",), (), ("chutes",), Decimal("0.02"), 1.0, None)
    )
    history.failed = {"chutes": 0}
    history.save(path)
    again = DriftHistory.load(path)
    assert again.checks == history.checks
    assert again.failed == {"chutes": 0}
    assert pr.VerificationReport.load(path).failed == ("chutes",)  # still a report
    # A report `provider-router verify --report` wrote keeps its failures as exclusions.
    report.save(path)
    assert DriftHistory.load(path).failed == {"chutes": -1}
    # A later pass never lifts a failure.
    merged = history.merge(
        pr.VerificationReport("m", "moonshotai", None, (dataclass_replace(verdicts[0]),))
    )
    assert merged.failed == ("chutes",)
    data = history.to_json()
    data["drift"]["checks"] = [{"trigger": "start"}]
    path.write_text(json.dumps(data))
    with pytest.raises(pr.ConfigurationError, match=r"verify.json: its drift history is damaged"):
        DriftHistory.load(path)
    path.write_text("[1]")
    with pytest.raises(pr.ConfigurationError, match=r"verify.json is not a verification report"):
        DriftHistory.load(path)


def dataclass_replace(verdict: pr.EndpointVerdict) -> pr.EndpointVerdict:
    """The verdict, passed."""
    from dataclasses import replace

    return replace(verdict, passed=True, reasons=())


def test_a_negative_verify_every_is_refused(tmp_path: Path) -> None:
    plan = small_plan(tmp_path)
    with pytest.raises(pr.ConfigurationError, match="verify_every must be ≥ 0"):
        JobRunner(plan, tmp_path / "out", verify=True, verify_every=-1)
    data = plan.model_dump(mode="json")
    data["verify_every"] = -5
    with pytest.raises(ValueError, match="verify_every"):
        Plan.model_validate(data)
    data["verify_every"] = 50
    assert JobRunner(Plan.model_validate(data), tmp_path / "out").verify_every == 50
    assert JobRunner(plan, tmp_path / "out").verify_every == 1000
    assert JobRunner(plan, tmp_path / "out", verify_every=0).verify_every is None


_TEXT = st.text(alphabet=st.sampled_from('ab "\\}{:é\n漢'), max_size=30)


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from(["Chutes", "Novita", 'Quo"te', "Ünï"]),
            st.integers(0, 4),
            st.booleans(),
            _TEXT,
        ),
        max_size=25,
    ),
    since=st.dictionaries(st.sampled_from(["Chutes", 'Quo"te', "Ünï"]), st.integers(0, 4)),
)
def test_flagging_keeps_every_row_but_its_flag_whatever_the_rows(
    tmp_path_factory: pytest.TempPathFactory,
    rows: list[tuple[str, int, bool, str]],
    since: dict[str, int],
) -> None:
    path = tmp_path_factory.mktemp("flag") / "p.jsonl"
    encoded = []
    for n, (provider, check, flagged, text) in enumerate(rows):
        record = json.loads(_row(n, provider, check, flagged))
        record["messages"][-1]["content"] = text + '"drift_flagged":false}'
        encoded.append(encode_record(record))
    path.write_bytes(b"".join(encoded))
    count = flag_rows(path, path.stat().st_size, since)
    after = path.read_bytes().splitlines(keepends=True)
    assert [len(line) for line in after] == [len(line) for line in encoded]
    expected = 0
    for line, original, (provider, check, flagged, _) in zip(after, encoded, rows, strict=True):
        now, before = json.loads(line), json.loads(original)
        matches = provider in since and check >= since[provider]
        assert now["drift_flagged"] is (flagged or matches)
        assert {**now, "drift_flagged": flagged} == before  # nothing else changed
        expected += matches
    assert count == expected
    assert flag_rows(path, path.stat().st_size, since) == expected
    assert path.read_bytes().splitlines(keepends=True) == after


def test_the_last_sentences_of_a_run() -> None:
    from provider_router.cli.run import verification_lines

    excluded = {"check": -1, "provider": "Chutes", "reason": "greedy agreement 0.6"}
    lines = verification_lines(
        {"checks": 1, "cost_usd": "0.02", "excluded": {"chutes": excluded}, "flagged_rows": 1},
        Path("runs/b3"),
    )
    assert lines == [
        "Verification: 1 check of the providers against the model's reference, $0.02 from "
        "the budget (runs/b3/verify.json).",
        "Excluded Chutes (chutes) by its report: greedy agreement 0.6; it serves nothing "
        "more of this job.",
        "1 row is flagged: served by a provider since its last passing check, before it "
        "failed one (drift_flagged: true in the outputs; provider-router export leaves them "
        "out).",
    ]
    honest = {"checks": 3, "cost_usd": "0.03", "excluded": {}, "flagged_rows": 0}
    assert verification_lines(honest, Path("d"))[1:] == [
        "No row is flagged: every provider passed every check."
    ]


def _report_json() -> dict[str, Any]:
    report = pr.VerificationReport(
        model="m",
        reference="moonshotai",
        self_agreement=None,
        endpoints=(pr.EndpointVerdict(tag="chutes", provider_name="Chutes", passed=True),),
    )
    history = DriftHistory()
    history.merge(report)
    data: dict[str, Any] = history.to_json()
    return data


def _set(path: tuple[Any, ...], value: object) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        target: Any = data
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value

    return change


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (_set(("endpoints",), ["chutes"]), "endpoints[0] must be an object, got str 'chutes'"),
        (_set(("endpoints",), "chutes"), "endpoints must be a list, got str 'chutes'"),
        (_set(("endpoints", 0, "reasons"), "bad"), "endpoints[0].reasons must be a list"),
        (_set(("endpoints", 0, "agreement"), [1]), "endpoints[0].agreement must be an object"),
        (_set(("thresholds",), [1]), "thresholds must be an object, got an array of 1 items"),
        (_set(("endpoints", 0, "tag"), None), "endpoints[0].tag must be a string, got NoneType"),
        (lambda d: d["endpoints"][0].pop("provider_name"), "endpoints[0].provider_name is missing"),
        (lambda d: d.pop("model"), "model is missing"),
        (_set(("drift",), "x"), "drift must be an object, got str 'x'"),
        (_set(("drift", "checks"), ["x"]), "drift.checks[0] must be an object, got str 'x'"),
        (_set(("drift", "last_pass"), ["x"]), "drift.last_pass must be an object"),
        (_set(("drift", "failed"), {"chutes": "x"}), "drift.failed['chutes'] must be an integer"),
    ],
)
def test_a_verify_json_of_the_wrong_shape_is_named_field_by_field(
    tmp_path: Path, change: Callable[[dict[str, Any]], None], said: str
) -> None:
    """Which field is wrong and what it should be; never Python's own words about it
    (``'str' object has no attribute 'get'``)."""
    path = tmp_path / "verify.json"
    data = _report_json()
    change(data)
    path.write_text(json.dumps(data))
    with pytest.raises(pr.ConfigurationError) as info:
        DriftHistory.load(path)
    message = str(info.value)
    assert message.startswith(str(path))
    assert said in message
    assert "object has no attribute" not in message
    assert "argument after **" not in message
