"""Promoted code is snapshotted and runs headless with nbclient, parameters injected."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from gpupool.train.snapshot import SnapshotError, check_name, from_code, from_notebook, with_parameters


def execute(tmp_path: Path, nb) -> tuple[subprocess.CompletedProcess, nbformat.NotebookNode]:
    src, out = tmp_path / "input.ipynb", tmp_path / "output.ipynb"
    nbformat.write(nb, str(src))
    result = subprocess.run(
        [sys.executable, "-m", "gpupool.widgets.execute", str(src), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result, nbformat.read(str(out), as_version=4)


def test_a_cell_runs_headless_with_its_parameters(tmp_path: Path) -> None:
    nb = with_parameters(
        from_code("total = sum(range(n))\nprint('total', total, flag, name)"),
        {"n": 10, "flag": True, "name": "it's"},
    )
    result, done = execute(tmp_path, nb)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "total 45 True it's" in result.stdout  # the log shows the output
    assert "[cell 2/2] done" in result.stdout
    assert done.cells[0].metadata["tags"] == ["injected-parameters"]
    assert done.cells[1].outputs[0]["text"] == "total 45 True it's\n"


def test_a_failing_cell_still_writes_the_executed_notebook(tmp_path: Path) -> None:
    result, done = execute(tmp_path, from_code(["x = 1", "1 / 0", "print('never')"]))
    assert result.returncode == 1
    assert "ZeroDivisionError" in result.stdout
    assert done.cells[1].outputs[0]["ename"] == "ZeroDivisionError"
    assert done.cells[2].get("outputs") == []


def test_chosen_cells_of_a_saved_notebook(tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# title"),
        nbformat.v4.new_code_cell("a = 1"),
        nbformat.v4.new_code_cell("b = 2"),
        nbformat.v4.new_code_cell("print(a)"),
    ]
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="old")]
    path = tmp_path / "work.ipynb"
    nbformat.write(nb, str(path))
    picked = from_notebook(path, cells=[0, 2])
    assert [c.source for c in picked.cells] == ["a = 1", "print(a)"]
    assert picked.cells[0].outputs == []
    with pytest.raises(SnapshotError, match=r"code cells \[7\] do not exist; the notebook has 3"):
        from_notebook(path, cells=[7])
    with pytest.raises(SnapshotError, match="save it first"):
        from_notebook(tmp_path / "missing.ipynb")


@pytest.mark.parametrize("name", ["../etc", "a/b", "", ".hidden", "x" * 65, "a..b"])
def test_job_names_cannot_escape_the_jobs_folder(name: str) -> None:
    with pytest.raises(SnapshotError, match="must be 1-64 letters"):
        check_name(name)


def test_bad_parameters_are_explained() -> None:
    with pytest.raises(SnapshotError, match="not a Python identifier"):
        with_parameters(from_code("pass"), {"import os": 1})
    with pytest.raises(SnapshotError, match="must be JSON"):
        with_parameters(from_code("pass"), {"x": object()})
    with pytest.raises(SnapshotError, match="no code to run"):
        from_code("   ")


def test_cells_that_are_not_text_are_refused_with_a_clear_error() -> None:
    # cells are built without a schema check each (a 20,000-cell body took 3 s): the type is checked here
    for bad in ([1, 2], ["x = 1", None], [{"source": "x"}]):
        with pytest.raises(SnapshotError, match="each cell's source must be text"):
            from_code(bad)
