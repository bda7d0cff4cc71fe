"""The spawn form and the workspace environment, without a hub."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpupool.gpu.env import STARTUP_DIR, gpu_env
from gpupool.pool import GPU, Holding, InvalidRequest
from gpupool.spawner.form import parse_choice, parse_form, render_form

H100 = GPU(index=3, uuid="GPU-4f1c", model="NVIDIA H100 80GB HBM3", memory_mib=81559)


def test_form_offers_sizes_and_disables_those_over_the_quota_left() -> None:
    html = render_form([(250, True), (500, False)], [Holding("exp1", 500)], 1000, virtual=True)
    assert 'value="0.25" checked>' in html  # in GPUs, as the REST API takes them
    assert 'value="0.5" disabled>' in html and "over your quota left" in html
    assert "server &#x27;exp1&#x27;: 0.5 GPU" in html
    assert "virtual" in html


def test_form_counts_every_server_and_says_memory_room_and_workspaces() -> None:
    held = [Holding("", 250), Holding("exp1", 500)]
    free = [[250, 1000, 1000, -1]]  # one node: a quarter and two whole GPUs free
    html = render_form(
        [(250, True), (1000, False), (2000, False)],
        held,
        2000,
        virtual=False,
        memory_mib_per_gpu=16384,
        gpu_free=free,
        max_workspaces=3,
        this_server="exp2",
    )
    assert "in use: <b>0.75 GPU</b>" in html and 'workspaces <b class="gpupool-workspaces">2 of 3</b>' in html
    assert html.count("<li>") == 2  # both servers listed
    assert '0.25 GPU <small class="gpupool-facts">(4,096 MiB, room for 9 now)</small>' in html
    assert (
        '2 GPUs <small class="gpupool-facts">(32,768 MiB, room for 1 now)</small> — over your quota left'
        in html
    )
    assert 'value="2" disabled>' in html
    full = render_form([(250, True)], held, 2000, virtual=False, max_workspaces=2, this_server="exp2")
    assert "You run 2 of 2 GPU workspaces allowed" in full and 'value="0.25" disabled>' in full
    no_room = render_form([(1000, True)], [], 2000, virtual=False, gpu_free=[[500, 500]])
    assert "no room in the pool now" in no_room and 'value="1" disabled>' in no_room


def test_form_says_so_when_nothing_fits() -> None:
    html = render_form([(250, False)], [Holding("", 1000)], 1000, virtual=False)
    assert "No size fits your quota now" in html and "checked" not in html


@pytest.mark.parametrize("form", [{}, {"gpus": []}, {"gpus": ["0.25", "0.5"]}])
def test_tampered_form_is_refused(form) -> None:
    with pytest.raises(InvalidRequest, match="choose one GPU size"):
        parse_form(form)


def test_form_value_round_trips_to_milli() -> None:
    assert parse_choice(parse_form({"gpus": ["0.25"]})).milli == 250
    with pytest.raises(InvalidRequest, match="not a GPU amount"):
        parse_choice(parse_form({"gpus": ["0.25; rm -rf /"]}))


def test_env_pins_the_gpu_by_uuid_and_states_the_share() -> None:
    env = gpu_env([H100], 250)
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-4f1c"
    assert env["GPUPOOL_GPU_FRACTION"] == "0.25"
    assert env["GPUPOOL_GPU_MEMORY_MIB"] == str(81559 // 4 - 500)  # less its CUDA context
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.25"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == STARTUP_DIR
    assert "CUDA_MPS_PIPE_DIRECTORY" not in env


def test_env_sets_mps_limits_when_a_daemon_is_configured() -> None:
    env = gpu_env([H100], 500, mps_pipe_directory="/tmp/nvidia-mps")
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={81559 // 2 - 500}M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"


def test_env_for_two_whole_gpus() -> None:
    other = GPU(index=4, uuid="GPU-77aa", model=H100.model, memory_mib=81559)
    env = gpu_env([H100, other], 1000, mps_pipe_directory="/mps")
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-4f1c,GPU-77aa"
    assert env["GPUPOOL_GPU_FRACTION"] == "2"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=81059M,1=81059M"


FAKE_TORCH = textwrap.dedent("""
    import types
    calls = []
    _lazy = []
    def _lazy_call(fn): _lazy.append(fn)
    def _init():  # what torch does on first CUDA use
        for fn in _lazy: fn()
    cuda = types.SimpleNamespace(
        device_count=lambda: 1,
        is_initialized=lambda: False,
        _lazy_call=_lazy_call,
        set_per_process_memory_fraction=lambda f, d: calls.append((f, d)),
        init=_init,
    )
""")


def run_python(tmp_path: Path, code: str, env: dict[str, str]) -> str:
    (tmp_path / "torch.py").write_text(FAKE_TORCH)  # torch itself needs CUDA for this call
    full_env = {**os.environ, **env}
    full_env["PYTHONPATH"] = os.pathsep.join([STARTUP_DIR, str(tmp_path)])
    out = subprocess.run(
        [sys.executable, "-c", code], env=full_env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_torch_is_capped_at_the_share_when_cuda_starts(tmp_path: Path) -> None:
    code = "import torch; print(torch.calls); torch.cuda.init(); print(torch.calls)"
    out = run_python(tmp_path, code, {"GPUPOOL_GPU_FRACTION": "0.25"})
    assert out.splitlines() == ["[]", "[(0.25, 0)]"]  # nothing at import, the cap at CUDA start


def test_no_cap_for_whole_gpus_or_outside_gpupool(tmp_path: Path) -> None:
    code = "import torch; torch.cuda.init(); print(torch.calls)"
    assert run_python(tmp_path, code, {"GPUPOOL_GPU_FRACTION": "1"}) == "[]"
    assert run_python(tmp_path, code, {"GPUPOOL_GPU_FRACTION": ""}) == "[]"


def test_a_budget_refusal_is_one_log_line_not_a_traceback() -> None:
    """JupyterHub logs the spawn form's errors with their traceback; a GPU-hour budget used up
    read in the hub's log like a crash. A refusal is now one line that says why; any other
    error keeps its traceback."""
    import io
    import logging

    from tornado import web

    from gpupool.hub.quiet_refusals import install
    from gpupool.spawner.mixin import http_error
    from gpupool.usage.service import BudgetRefused

    log = logging.getLogger("test-hub-log")
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    log.addHandler(handler)
    install(log)  # as gpupool.wiring.setup does on the hub's log
    try:
        for err in (
            http_error(BudgetRefused("a workspace of 1 GPU is refused: budget used up")),
            web.HTTPError(500),
        ):
            try:
                raise err
            except web.HTTPError:
                log.error("Failed to spawn single-user server with form", exc_info=True)  # JupyterHub's call
    finally:
        log.removeHandler(handler)
    refused, other = out.getvalue().split("Failed to spawn single-user server with form")[1:]
    assert refused.strip() == ": refused: a workspace of 1 GPU is refused: budget used up"
    assert "Traceback" in other
