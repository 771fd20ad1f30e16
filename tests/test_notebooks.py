"""The example notebooks run top to bottom against the local simulator (no network, no key).

They are committed with outputs cleared; this test executes them fresh with nbclient,
so what a user opens is never stale and a notebook that breaks fails CI.
"""

from __future__ import annotations

from pathlib import Path

import pytest

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")

EXAMPLES = Path(__file__).parent.parent / "examples"
NOTEBOOKS = ["cost_projection.ipynb", "pilot_then_run.ipynb"]


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_top_to_bottom(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    notebook = nbformat.read(EXAMPLES / name, as_version=4)
    # The kernel inherits this environment: make sure it picks the local simulator.
    monkeypatch.delenv("PROVIDER_ROUTER_MARKET", raising=False)
    client = nbclient.NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    )
    client.execute()
    errors = [
        output
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if output.get("output_type") == "error"
    ]
    assert errors == []
    images = [
        output
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if "image/png" in output.get("data", {})
    ]
    assert len(images) == 2  # each notebook draws two plots


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebooks_are_committed_without_outputs(name: str) -> None:
    notebook = nbformat.read(EXAMPLES / name, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{name}: clear outputs before committing"
            assert cell.execution_count is None, f"{name}: clear execution counts"
