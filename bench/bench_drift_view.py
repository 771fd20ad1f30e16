"""``provider-router status`` of a long ``run --verify`` job: what reading its drift costs.

::

    python -m bench drift_view [--checks 20000] [--journal-mib 300] [--rounds 3]

Writes a job directory with a ``verify.json`` of ``--checks`` checks (nine endpoints)
and a journal of ``--journal-mib`` MiB of ``done`` entries, then times ``status`` in a
fresh process each round, and its peak RSS: of that directory, of one with the journal
only (a job without ``--verify``) and of one with neither (the baseline, same run).
The journal is searched up to ``JOURNAL_SCAN_LIMIT`` (256 MiB); ``verify.json`` is
read up to ``VERIFY_READ_LIMIT`` (16 MiB).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path

import provider_router as pr
from provider_router.jobs.drift_history import DriftCheck, DriftHistory

_MEASURE = """
import re, sys, time
from pathlib import Path
from provider_router.jobs.observe.status import status_lines
t = time.perf_counter()
lines = status_lines(Path(sys.argv[1]), now=time.time())
seconds = time.perf_counter() - t
# VmHWM, not ru_maxrss: Linux carries the parent's ru_maxrss across fork and exec.
hwm = re.search(r"VmHWM:\\s+(\\d+) kB", Path("/proc/self/status").read_text()).group(1)
print(seconds, hwm, len(lines))
"""


def _job(directory: Path, checks: int, journal_mib: int) -> None:
    directory.mkdir()
    (directory / "timeline.ndjson").write_text(json.dumps({"t": time.time(), "pid": -1}) + "\n")
    tags = [f"e{i}" for i in range(9)]
    verdicts = tuple(
        pr.EndpointVerdict(tag=t, provider_name=t.upper(), passed=True, judged=20, accepted=20)
        for t in tags
    )
    report = pr.VerificationReport(
        model="moonshotai/kimi-k2.5", reference="e0", self_agreement=None, endpoints=verdicts
    )
    history = DriftHistory(report=report, last_pass=dict.fromkeys(tags, checks - 1))
    history.checks = [
        DriftCheck(n, "every", n * 1000, ("e0", "e1"), ("e0", "e1"), (), Decimal("0.005"), 1.7e9)
        for n in range(checks)
    ]
    history.save(directory / "verify.json")
    entry = {"op": "done", "ds": "b3", "ids": ["q-17"] * 20, "end": [5123] * 20}
    line = (json.dumps(entry, separators=(",", ":")) + "\n").encode()
    with (directory / "journal.jsonl").open("wb") as handle:
        for _ in range((journal_mib << 20) // len(line)):
            handle.write(line)


def _measure(directory: Path) -> tuple[float, float, int]:
    done = subprocess.run(  # noqa: S603 - our own fixed command
        [sys.executable, "-c", _MEASURE, str(directory)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    seconds, rss, lines = done.stdout.split()
    return float(seconds), int(rss) / 1024, int(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench drift_view")
    parser.add_argument("--checks", type=int, default=20_000)
    parser.add_argument("--journal-mib", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        job, bare, plain = Path(tmp) / "job", Path(tmp) / "bare", Path(tmp) / "plain"
        _job(job, args.checks, args.journal_mib)
        for directory in (bare, plain):
            directory.mkdir()
            (directory / "timeline.ndjson").write_bytes((job / "timeline.ndjson").read_bytes())
        (plain / "journal.jsonl").hardlink_to(job / "journal.jsonl")
        sizes = {p.name: p.stat().st_size / (1 << 20) for p in job.iterdir()}
        print(
            f"verify.json {sizes['verify.json']:.1f} MiB ({args.checks:,} checks), "
            f"journal {sizes['journal.jsonl']:.0f} MiB"
        )
        cases = (
            ("a timeline only", bare),
            ("the journal, no verify.json (a job without --verify)", plain),
            ("the journal and verify.json", job),
        )
        for name, directory in cases:
            runs = [_measure(directory) for _ in range(args.rounds)]
            seconds = statistics.median(r[0] for r in runs)
            rss = max(r[1] for r in runs)
            print(f"status of {name}: {seconds:.3f} s median, peak RSS {rss:.0f} MiB")
    return 0
