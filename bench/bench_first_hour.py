"""A new user's first command on a fresh clone: ``make demo``, timed and weighed.

Run: ``python -m bench first_hour`` (``--ref REF``, default ``HEAD``; ``--against REF``
measures another commit in the same run, alternating; ``--rounds N``, default 1;
``--then-test-install`` also times ``make .venv/.installed``, what ``make test``
installs, right after the demo). Each round clones this repository at the commit
into a fresh temporary directory, runs ``make demo`` there and reports its wall time,
the CPU of everything it started, the size of ``.venv`` (allocated blocks, as
``du -s``), and whether the demo printed a report path that exists; then deletes the
clone. The pip cache is the machine's own (a first install anywhere downloads more),
and the machine is shared: compare figures measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str:
    git = shutil.which("git") or "git"
    return subprocess.run([git, *args], capture_output=True, text=True, check=True).stdout  # noqa: S603


def _du_mib(path: Path) -> float:
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except OSError:
                continue
    return total / 2**20


def _timed(command: list[str], cwd: Path) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds of the command's process tree, and its output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)  # noqa: S603
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return wall, cpu, done.stdout


def _report_path(stdout: str) -> Path | None:
    found = re.findall(r"^\s*(file://\S+)\s*$", stdout, flags=re.MULTILINE)
    return Path(unquote(urlsplit(found[-1]).path)) if found else None


def _round(ref: str, then_test_install: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="pr-first-hour-") as tmp:
        clone = Path(tmp) / "clone"
        _git("clone", "--quiet", str(ROOT), str(clone))
        _git("-C", str(clone), "checkout", "--quiet", ref)
        wall, cpu, out = _timed(["make", "demo"], clone)
        report = _report_path(out)
        row: dict[str, Any] = {
            "ref": ref,
            "demo_wall_s": wall,
            "demo_cpu_s": cpu,
            "venv_mib": _du_mib(clone / ".venv"),
            "report": "printed, exists" if report and report.is_file() else "none printed",
            "load": os.getloadavg()[0],
        }
        if then_test_install:
            wall, cpu, _ = _timed(["make", ".venv/.installed"], clone)
            row |= {"test_install_wall_s": wall, "test_install_cpu_s": cpu}
            row["full_venv_mib"] = _du_mib(clone / ".venv")
        shutil.rmtree(clone, ignore_errors=True)
        return row


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench first_hour")
    parser.add_argument("--ref", default="HEAD")
    parser.add_argument("--against", default=None, help="another commit, in alternating rounds")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--then-test-install", action="store_true")
    args = parser.parse_args(argv)
    refs = [args.ref] + ([args.against] if args.against else [])
    refs = [_git("-C", str(ROOT), "rev-parse", "--short", ref).strip() for ref in refs]
    rows: dict[str, list[dict[str, Any]]] = {ref: [] for ref in refs}
    for n in range(args.rounds):
        for ref in refs if n % 2 == 0 else reversed(refs):
            row = _round(ref, args.then_test_install)
            rows[ref].append(row)
            print(
                " ".join(
                    f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
                )
            )
            sys.stdout.flush()
    print("\n| commit | `make demo` wall s | CPU s | `.venv` MiB | report | load |")
    print("|---|---:|---:|---:|---|---:|")
    for ref, found in rows.items():
        med = {
            k: statistics.median(r[k] for r in found)
            for k in ("demo_wall_s", "demo_cpu_s", "venv_mib", "load")
        }
        print(
            f"| {ref} | {med['demo_wall_s']:.1f} | {med['demo_cpu_s']:.1f} | "
            f"{med['venv_mib']:.0f} | {found[0]['report']} | {med['load']:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
