"""Every notebook and config example of the README runs as written against `make up`'s demo
config (the embedded hub the tests start is that config)."""

from __future__ import annotations

import re

import pytest

from tests.hubtools import REPO, Hub
from tests.support.wait import until

pytestmark = pytest.mark.hub


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)


def test_the_readme_has_the_examples_this_test_runs() -> None:
    blocks = python_blocks()
    assert any(b.startswith("%%train") for b in blocks) and any("%gpupool" in b for b in blocks)
    assert any("configure(c)" in b for b in blocks) and any("PromoteToTraining" in b for b in blocks)


def test_notebook_examples_run_against_the_demo_hub(hub: Hub, monkeypatch, capsys) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    token = hub.user_token("reader")
    monkeypatch.setenv("GPUPOOL_API_URL", f"http://127.0.0.1:{hub.api_port}/services/gpupool/")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", token)
    shell = InteractiveShell.instance()
    try:
        for block in python_blocks():
            if "configure(c)" in block:
                continue
            # current_notebook() needs a kernel of a running server: tests/test_widgets_jobs.py runs it there
            code = "\n".join(line for line in block.splitlines() if "current_notebook(" not in line)
            result = shell.run_cell(code)
            assert result.success, (block, result.error_in_exec or result.error_before_exec)
        out = capsys.readouterr().out
        assert "%%train:" not in out and "not submitted" not in out, out
        job_id = re.search(r"submitted job ([0-9a-f]{12}) to default", out).group(1)
        shell.run_cell("%train --help")  # as a line: IPython refuses a %%cell magic without a body
        help_text = capsys.readouterr().out
        assert help_text.count("usage: %%train") == 1
        shell.run_cell("%%train --help\nprint('not sent')")
        assert capsys.readouterr().out == help_text  # the same, once, and nothing submitted
        assert re.search(r"^  default\s+2 GPUs guaranteed", help_text, re.M)
        assert re.search(r"^  research\s+1 GPU guaranteed", help_text, re.M)
        shell.run_cell("%%train --gpus 1\nprint(1)\n")
        assert capsys.readouterr().out.strip() == (
            "%%train: the following arguments are required: --project; see %%train --help"
        )
    finally:
        InteractiveShell.clear_instance()

    def succeeded() -> bool:
        job = hub.api("GET", f"/services/gpupool/api/jobs/{job_id}", token=token)
        assert job["state"] in ("queued", "running", "succeeded"), job
        return job["state"] == "succeeded"

    until(succeeded, "the README's job to succeed", timeout=120, every=0.5, detail=hub.tail)
    logs = hub.api("GET", f"/services/gpupool/api/jobs/{job_id}/logs", token=token)
    assert "training for 3 epochs" in "\n".join(logs["lines"])


def test_the_config_example_configures_a_hub() -> None:
    from traitlets.config import Config

    (block,) = [b for b in python_blocks() if "configure(c)" in b]
    c = Config()
    exec(block, {"c": c})  # noqa: S102 - the README's own example
    assert c.GPUPool.group_totals == {"cs101": 2} and c.JupyterHub.spawner_class


def test_the_training_docs_sweep_runs_as_written_against_the_demo_hub(hub: Hub, monkeypatch, capsys) -> None:
    """docs/training.md's sweep example, in a notebook of `make up`'s demo: four jobs, each with
    its final metrics (it once named a project the demo has not and a function it never defined)."""
    from IPython.core.interactiveshell import InteractiveShell

    text = (REPO / "docs" / "training.md").read_text()
    (block,) = re.findall(r"## Sweeps from the notebook\n\n```python\n(.*?)```", text, re.S)
    token = hub.user_token("sweeper")
    monkeypatch.setenv("GPUPOOL_API_URL", f"http://127.0.0.1:{hub.api_port}/services/gpupool/")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", token)
    shell = InteractiveShell.instance()
    try:
        assert shell.run_cell("%load_ext gpupool").success
        result = shell.run_cell(block)
        assert result.success, result.error_in_exec or result.error_before_exec
    finally:
        InteractiveShell.clear_instance()
    out = capsys.readouterr().out
    sweep = re.search(r"submitted sweep (\S+): 4 jobs to default", out)
    assert sweep, out

    def ended() -> list[dict] | None:
        runs = hub.api("GET", f"/services/gpupool/api/sweeps/{sweep.group(1)}", token=token)["runs"]
        return runs if all(r["job"]["state"] in ("succeeded", "failed") for r in runs) else None

    runs = until(ended, "every run of the sweep to end", timeout=240, every=1, detail=hub.tail)
    assert [r["job"]["state"] for r in runs] == ["succeeded"] * 4, runs
    got = {(r["parameters"]["lr"], r["parameters"]["batch"]): r["metrics"] for r in runs}
    assert got[(0.1, 32)] == {"loss": pytest.approx(0.031, abs=1e-3), "acc": pytest.approx(0.969, abs=1e-3)}
