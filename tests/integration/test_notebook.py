"""Executes notebooks/walkthrough.ipynb (as CI does) and checks it shows its figures without errors."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

pytestmark = pytest.mark.slow  # executes the walkthrough notebook in a kernel process

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "walkthrough.ipynb"
CELL_TIMEOUT_SECONDS = 300


def test_walkthrough_executes_and_shows_its_figures() -> None:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    for cell in notebook.cells:  # execute from scratch: stored outputs must not satisfy the test
        if cell.cell_type == "code":
            cell.outputs = []
    client = nbclient.NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT_SECONDS,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )
    client.execute()  # raises CellExecutionError, naming the cell, on any error
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    # curve, policy intervals, the simulated overhead, and the run
    # report's four figures
    assert len(images) >= 6, f"only {len(images)} figures"
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "coci report:" in text and "checkpoints:" in text
    assert "Traceback" not in text
