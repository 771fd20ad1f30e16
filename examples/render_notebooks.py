"""Execute the example notebooks in place, so they are committed with their plots.

    make notebooks      # or: .venv/bin/python examples/render_notebooks.py

Each runs against the local OpenRouter in a scratch directory (nothing is written
beside the notebooks but the notebooks themselves).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import nbclient
import nbformat

EXAMPLES = Path(__file__).parent
NOTEBOOKS = ("cost_projection.ipynb", "pilot_then_run.ipynb")


def render(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as scratch:
        nbclient.NotebookClient(
            notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": scratch}}
        ).execute()
    nbformat.write(notebook, path)
    print(f"rendered {path}")


if __name__ == "__main__":
    for name in sys.argv[1:] or NOTEBOOKS:
        render(EXAMPLES / name)
