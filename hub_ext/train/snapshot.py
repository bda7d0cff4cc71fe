"""Snapshot code at submit time: a cell, chosen cells, or a whole saved notebook.

The snapshot is what runs, so a job is reproducible even if the notebook is edited
while it waits in the queue.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path

import nbformat

NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
PARAMETERS_TAG = "injected-parameters"


class SnapshotError(ValueError):
    """The code to promote cannot be taken as asked; the message says why."""


def check_name(name: str) -> str:
    """Job names become folder names: no path tricks, no surprises."""
    if not NAME_OK.match(name or "") or ".." in name:
        raise SnapshotError(
            f"job name {name!r} must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return name


def from_code(code: str | Iterable[str]) -> nbformat.NotebookNode:
    """One code cell per string (a %%train cell body, or chosen cells)."""
    sources = [code] if isinstance(code, str) else list(code)
    if not all(isinstance(s, str) for s in sources):  # the cells are no longer schema-checked one by one
        raise SnapshotError("each cell's source must be text")
    if not any(s.strip() for s in sources):
        raise SnapshotError("there is no code to run: the cell is empty")
    nb = nbformat.v4.new_notebook()
    # the cells are built as plain documents: new_code_cell validates each one against the schema
    # (3 s for 20,000 cells, holding the GIL the hub's loop needs); writing validates them once
    nb.cells = [
        nbformat.from_dict(
            {
                "id": uuid.uuid4().hex[:8],
                "cell_type": "code",
                "metadata": {},
                "execution_count": None,
                "outputs": [],
                "source": s,
            }
        )
        for s in sources
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def from_notebook(path: str | Path, cells: Iterable[int] | None = None) -> nbformat.NotebookNode:
    """A saved notebook, or some of its code cells (0-based indices among code cells)."""
    try:
        nb = nbformat.read(str(path), as_version=4)
    except FileNotFoundError:
        raise SnapshotError(f"notebook {path} not found: save it first") from None
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    if cells is not None:
        wanted = list(cells)
        bad = [i for i in wanted if not 0 <= i < len(code_cells)]
        if bad:
            raise SnapshotError(f"code cells {bad} do not exist; the notebook has {len(code_cells)}")
        code_cells = [code_cells[i] for i in wanted]
    for c in code_cells:
        c.outputs, c.execution_count = [], None
    nb.cells = code_cells
    if not nb.cells:
        raise SnapshotError(f"notebook {path} has no code cells")
    return nb


def with_parameters(nb: nbformat.NotebookNode, params: Mapping[str, object]) -> nbformat.NotebookNode:
    """Prepend a cell that sets the parameters (as papermill does), JSON-encoded values only."""
    if not params:
        return nb
    lines = []
    for key, value in params.items():
        if not key.isidentifier():
            raise SnapshotError(f"parameter name {key!r} is not a Python identifier")
        try:
            plain = json.loads(json.dumps(value, allow_nan=False))
        except (TypeError, ValueError):
            raise SnapshotError(f"parameter {key!r} must be JSON (numbers, strings, lists, dicts)") from None
        lines.append(f"{key} = {plain!r}")  # the repr of JSON values is valid Python
    cell = nbformat.v4.new_code_cell("# Parameters\n" + "\n".join(lines))
    cell.metadata["tags"] = [PARAMETERS_TAG]
    nb.cells.insert(0, cell)
    return nb
