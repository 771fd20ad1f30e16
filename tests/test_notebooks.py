"""The example notebooks run top to bottom against the local simulator (no network, no key).

They are committed with their outputs (plots visible to anyone browsing the
repository); this test also executes them fresh with nbclient, so a notebook that no
longer runs fails CI. Re-render them with ``make notebooks``.
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
    # A notebook shows a DeprecationWarning its own code raised (IPython's default):
    # an example must not use a name that moved.
    warned = [
        output["text"]
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if output.get("output_type") == "stream" and "DeprecationWarning" in output["text"]
    ]
    assert warned == []
    images = [
        output
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if "image/png" in output.get("data", {})
    ]
    assert len(images) == 2  # each notebook draws two plots


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebooks_are_committed_with_their_plots(name: str) -> None:
    """Someone browsing the repository sees every plot without running anything."""
    notebook = nbformat.read(EXAMPLES / name, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.execution_count is not None for cell in code), f"{name}: run every cell"
    outputs = [output for cell in code for output in cell.outputs]
    assert not [o for o in outputs if o.get("output_type") == "error"], f"{name}: an error"
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 2, f"{name}: commit it with its two plots"
