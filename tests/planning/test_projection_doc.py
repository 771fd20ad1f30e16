"""docs/projection.md quotes what the committed ``pilot_then_run.ipynb`` shows.

The notebook is committed with its outputs; the doc's "Projected against actual"
section must say the same numbers (a re-rendered notebook with new numbers fails
here until the doc is updated from it).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")

ROOT = Path(__file__).parents[2]


def _outputs() -> str:
    notebook = nbformat.read(ROOT / "examples" / "pilot_then_run.ipynb", as_version=4)
    texts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            texts.append(output.get("text") or output.get("data", {}).get("text/plain", ""))
    return re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(texts))


def _section() -> str:
    doc = (ROOT / "docs" / "projection.md").read_text()
    return " ".join(doc[doc.index("## Projected against actual") :].split())  # reflow-proof


def test_the_doc_quotes_the_notebooks_pilot_projection_and_run() -> None:
    shown, doc = _outputs(), _section()
    pilot = re.search(
        r"spent \$([0-9.]+)\n.*mean (\d+), 95% CI (\d+)–(\d+), p10 (\d+), p90 (\d+)", shown
    )
    assert pilot is not None
    cost, mean, low, high, p10, p90 = pilot.groups()
    assert (
        f"measured {mean} output tokens per response (95 % CI {low}–{high}, p10 {p10}, p90 {p90})"
        in doc
    )
    assert f"spent ${cost}" in doc
    needs = re.search(r"expected routing mix: the full plan needs (\$[0-9.]+)", shown)
    fits = re.findall(r"largest uniform target per dataset that fits: ([0-9.]+k)", shown)
    assert needs is not None
    assert fits
    assert f"the plan needs {needs.group(1)}" in doc
    assert f"{fits[-1]} output tokens per dataset fits (routing mix)" in doc
    run = re.search(r"run \w+: spent (\$[0-9.]+) of", shown)
    assert run is not None
    assert f"spent {run.group(1)} of $1.50" in doc
    rows = re.findall(
        r"^(b\d|total)\s+([\d,]+)/([\d,]+)\s+([\d,]+)/([\d,]+)\s+"
        r"(\$[0-9.]+) \((\$[0-9.]+)–(\$[0-9.]+)\)\s+(\$[0-9.]+)\s+([-+][0-9.]+)%",
        shown,
        flags=re.MULTILINE,
    )
    assert [r[0] for r in rows] == ["b3", "b4", "total"]
    for name, rp, ra, tp, ta, cp, lo, hi, actual, error in rows:
        sign = "−" if error.startswith("-") else "+"
        line = (
            f"| {name} | {rp} / {ra} | {tp} / {ta} | {cp} ({lo}–{hi}) | {actual} | "
            f"{sign}{error[1:]} % |"
        )
        assert line in doc, line
