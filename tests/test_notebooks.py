"""The notebooks as committed: valid, without outputs, the same first code cell, thin."""

from __future__ import annotations

import nbformat
import pytest

from lab_utils.runner import find_notebooks

NOTEBOOKS = find_notebooks()
FIRST_LINES = ("%load_ext autoreload", "%autoreload 2", "from lab_utils import load_config",
               "cfg = load_config()")


def test_there_are_notebooks():
    assert [p.name[:2] for p in NOTEBOOKS][:1] == ["00"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:60]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_cell_has_an_id(path):
    """nbformat 4.5 requires cell ids; nbformat.read adds missing ones silently (and warns
    when a notebook runs), so the file itself is read."""
    import json

    raw = json.loads(path.read_text())
    assert (raw["nbformat"], raw["nbformat_minor"]) >= (4, 5)
    missing = [i for i, c in enumerate(raw["cells"]) if not c.get("id")]
    assert missing == [], f"cells {missing} have no id"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_first_code_cell_and_thin_cells(path):
    nb = nbformat.read(path, as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    assert [ln for ln in code[0].splitlines() if ln.startswith(FIRST_LINES)] != []
    for line in FIRST_LINES:
        assert any(ln.startswith(line) for ln in code[0].splitlines()), line
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    for src in code:
        assert len(src.splitlines()) <= 15, f"cell too long for a thin notebook:\n{src}"
