"""A train job's notebook run (gpupool.widgets.execute) as the runner starts and preempts it: the
log carries the user's output as it comes, no kernel transport noise, and a preemption is one
plain line after user code had its SIGTERM to save a checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat

from tests.support.wait import until

LOOP = """
from gpupool.widgets.checkpoint import Checkpoint
import time
ckpt = Checkpoint()
state = ckpt.load(default={"step": 0})
print("started at step", state["step"], flush=True)
while state["step"] < 10_000:
    time.sleep(0.05)
    state["step"] += 1
    if ckpt.preempted:
        ckpt.save(state)
        print("saved at step", state["step"], flush=True)
        ckpt.exit()
"""


def start(tmp_path: Path, code: str) -> tuple[subprocess.Popen, Path]:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(code)]
    nbformat.write(nb, str(tmp_path / "input.ipynb"))
    log = tmp_path / "job.log"
    env = {**os.environ, "GPUPOOL_CHECKPOINT_DIR": str(tmp_path / "checkpoint")}
    with open(log, "wb") as out:  # as the local runner does: its own session, stdout+stderr to the log
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpupool.widgets.execute", "input.ipynb", "output.ipynb"],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    return proc, log


def wait_for(log: Path, text: str) -> str:
    return until(
        lambda: text in (now := log.read_text()) and now, f"{text!r} in the job's log", detail=log.read_text
    )


def test_output_streams_into_the_log_without_transport_warnings(tmp_path: Path) -> None:
    proc, log = start(
        tmp_path, "print('hello from the job', flush=True)\nimport time; time.sleep(1)\nprint('bye')"
    )
    assert proc.wait(60) == 0
    text = log.read_text()
    assert "hello from the job\nbye\n" in text
    assert "WARNING" not in text and "encryption" not in text
    assert not list(tmp_path.glob(".kernel-ipc*"))  # the kernel's sockets are cleaned up


def test_preemption_is_one_line_after_the_checkpoint_is_saved(tmp_path: Path) -> None:
    proc, log = start(tmp_path, LOOP)
    wait_for(log, "started at step 0")
    time.sleep(1)  # a few steps
    os.killpg(proc.pid, signal.SIGTERM)  # what the runner sends on preemption
    assert proc.wait(60) == 143
    text = log.read_text()
    assert "saved at step" in text
    assert "gpupool: this run stopped (SIGTERM)" in text  # why (and what next): the hub's line above it
    assert "Traceback" not in text and "ZMQError" not in text and "DeadKernel" not in text
    saved = json.loads((tmp_path / "checkpoint" / "state.json").read_text())
    assert saved["step"] > 0

    proc, log = start(tmp_path, LOOP)  # the next run resumes from it
    assert f"started at step {saved['step']}" in wait_for(log, "started at step")
    os.killpg(proc.pid, signal.SIGKILL)
