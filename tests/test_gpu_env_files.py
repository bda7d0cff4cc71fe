"""A workspace's processes follow its share's CURRENT GPU: the hub publishes it in a file of its
own (gpupool.gpu.env_files); the start-up code reads it in every Python process, for the
terminals and kernels the server launches, and before each cell. The hub side through a move
and a resume elsewhere is in test_move_service.py and test_parking_core.py; on a real hub, with
a kernel started after a move, in test_move_hub.py."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.alloc.hooks import ServiceHooks, Services
from gpupool.alloc.manager import PoolManager, Workload
from gpupool.gpu.env import STARTUP_DIR
from gpupool.gpu.env_files import GPUEnvFiles, file_name
from gpupool.pool import GPU, BuildLimits, BuildQuotaPolicy, Inventory, Node
from gpupool.pool.request import Placement
from tests.support.disk import small_disk
from tests.support.pools import make_pool

QUOTAS = BuildQuotaPolicy(
    default=BuildLimits(
        quota_milli=1000, sizes_milli=(500, 1000), max_per_workspace_milli=1000, max_workspaces=1
    )
)
INVENTORY = Inventory(
    nodes=(Node("n1", tuple(GPU(i, f"GPU-{i}", "A100", 40960, virtual=True) for i in range(3))),)
)


def published(folder: Path, owner: str, name: str = "") -> dict | None:
    path = folder / file_name(owner, name)
    return json.loads(path.read_text()) if path.exists() else None


def run_python(code: str, env_file: Path | None, workspace: str = "ann/", **extra: str) -> str:
    """A Python process of the workspace, as its server starts one (startup folder on its path,
    started with GPU 0 in its environment)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "CUDA_"))}
    env.update(
        PYTHONPATH=STARTUP_DIR,
        CUDA_VISIBLE_DEVICES="0",
        GPUPOOL_GPU_UUIDS="GPU-0",
        GPUPOOL_WORKSPACE=workspace,
        **extra,
    )
    if env_file is not None:
        env["GPUPOOL_GPU_ENV_FILE"] = str(env_file)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


SEES = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['GPUPOOL_GPU_UUIDS'])"


@pytest.fixture
def files(tmp_path: Path) -> tuple[PoolManager, GPUEnvFiles]:
    pool = make_pool(
        tmp_path, INVENTORY, limits=QUOTAS, hooks=ServiceHooks(lambda: Services(gpu_files=files))
    )
    files = GPUEnvFiles(tmp_path / "gpu-env", pool)
    return pool, files


def test_a_python_process_started_after_a_move_runs_on_the_gpu_the_hub_says(files) -> None:
    pool, pub = files
    pool.reserve_at(Workload("build", "ann", ""), Placement("n1", (2,), 500))
    doc = published(pub.folder, "ann")
    assert (doc["state"], doc["env"]["CUDA_VISIBLE_DEVICES"], doc["env"]["GPUPOOL_GPU_FRACTION"]) == (
        "running",
        "2",
        "0.5",
    )
    assert run_python(SEES, pub.path("ann", "")) == "2 GPU-2"
    # nothing to follow: no file (a server started by an older hub), a file about another
    # workspace, a malformed or oversized one — the environment as started
    assert run_python(SEES, None) == "0 GPU-0"
    assert run_python(SEES, pub.path("ann", ""), workspace="ben/") == "0 GPU-0"
    bad = pub.folder.parent / "bad.json"
    for text in ("{", json.dumps({"workspace": "ann/", "env": ["x"]}), " " * (70 * 1024) + "{}"):
        bad.write_text(text)
        assert run_python(SEES, bad) == "0 GPU-0"
    pool.release(Workload("build", "ann", ""), "stopped")
    assert published(pub.folder, "ann") is None


def test_terminals_and_children_opened_after_a_move_get_the_current_gpu(files) -> None:
    """The Jupyter server started on GPU 2; its share moves to GPU 1 (the hub rewrites the file);
    a terminal the server opens then (terminado's environment for its shell) gets GPU 1."""
    pool, pub = files
    w = Workload("build", "ann", "")
    pool.reserve_at(w, Placement("n1", (2,), 500))
    code = (
        "import os, sys, terminado.management as m; print(os.environ['CUDA_VISIBLE_DEVICES'], flush=True);"
        " sys.stdin.readline(); print(m.TermManagerBase(['sh']).make_term_env()['CUDA_VISIBLE_DEVICES'])"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "CUDA_"))}
    env.update(
        PYTHONPATH=STARTUP_DIR,
        CUDA_VISIBLE_DEVICES="0",
        GPUPOOL_WORKSPACE="ann/",
        GPUPOOL_GPU_ENV_FILE=str(pub.path("ann", "")),
    )
    server = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert server.stdout.readline().strip() == "2"
    pool.release(w, "moved")  # as the mover's switch does, in the hub: the rows, then the file
    pool.reserve_at(w, Placement("n1", (1,), 500))
    server.stdin.write("go\n")
    server.stdin.flush()
    assert server.stdout.readline().strip() == "1"
    assert server.wait(30) == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="group ownership needs root")
def test_the_files_are_the_hubs_readable_by_their_owners_group_only(tmp_path: Path) -> None:
    pool = make_pool(tmp_path, INVENTORY, limits=QUOTAS, hooks=ServiceHooks(lambda: Services(gpu_files=pub)))
    pub = GPUEnvFiles(tmp_path / "gpu-env", pool, gid_of=lambda owner: 4242)
    pool.reserve_at(Workload("build", "ann", ""), Placement("n1", (0,), 500))
    st = os.stat(pub.path("ann", ""))
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, 4242, 0o640)
    assert os.stat(pub.folder).st_mode & 0o777 == 0o711  # passable, not listable
    # a folder someone else may write is not the hub's: nothing is written there
    other = tmp_path / "open"
    other.mkdir(mode=0o777)
    os.chmod(other, 0o777)
    open_pub = GPUEnvFiles(other, pool)
    open_pub.publish("ann", "")
    assert list(other.iterdir()) == []


@pytest.mark.parametrize("spawner, writes", [("local", True), ("kube", False)])
def test_the_hub_publishes_only_where_servers_run_on_its_machine(
    tmp_path: Path, monkeypatch, spawner: str, writes: bool
) -> None:
    """Local servers read the hub's folder; a pod cannot (its GPU is the device plugin's), so a
    Kubernetes hub writes nothing there and looks up no Unix accounts for it."""
    from types import SimpleNamespace

    from traitlets.config import Config

    from gpupool.hub.adapter import HubApp
    from gpupool.settings.config import GPUPool
    from gpupool.spawner.kube import GPUKubeSpawner
    from gpupool.spawner.local import GPULocalProcessSpawner
    from gpupool.wiring.setup import publish_gpus

    monkeypatch.setenv("GPUPOOL_STATE_DIR", str(tmp_path))
    # the pool asks the files the hub hands its root (gpupool.wiring.root.Running.gpu_files)
    pool = make_pool(
        tmp_path, INVENTORY, limits=QUOTAS, hooks=ServiceHooks(lambda: Services(gpu_files=files))
    )
    cls = GPULocalProcessSpawner if spawner == "local" else GPUKubeSpawner
    hub = HubApp(SimpleNamespace(spawner_class=cls, config=Config()))  # the two attributes it reads
    files = publish_gpus(hub, pool, GPUPool(config=Config()))
    pool.reserve_at(Workload("build", "ann", ""), Placement("n1", (1,), 500))
    doc = published(tmp_path / "gpu-env", "ann")
    if writes:
        assert files is not None and doc is not None and doc["env"]["CUDA_VISIBLE_DEVICES"] == "1"
    else:
        assert files is None and doc is None and not (tmp_path / "gpu-env").exists()


def test_a_full_disk_keeps_the_last_whole_file_and_leaves_no_half_one(tmp_path: Path, caplog) -> None:
    """The env files' disk full (a real tmpfs, filled): the new GPU cannot be written, so new
    processes keep reading the last whole file (never a cut one), the spawn or move goes on, the
    hub logs why, and no half-written file is left to take the disk's last bytes."""
    with small_disk(tmp_path / "disk", "64k") as disk:
        pool = make_pool(
            tmp_path, INVENTORY, limits=QUOTAS, hooks=ServiceHooks(lambda: Services(gpu_files=pub))
        )
        pub = GPUEnvFiles(disk / "gpu-env", pool)
        pool.reserve_at(Workload("build", "ann", ""), Placement("n1", (2,), 500))
        assert published(pub.folder, "ann")["env"]["CUDA_VISIBLE_DEVICES"] == "2"
        with open(disk / "filler", "wb", buffering=0) as f, contextlib.suppress(OSError):
            while True:  # the disk fills up
                f.write(b"\0" * 4096)
        with caplog.at_level(logging.ERROR, logger="gpupool"):
            pub.publish("ann", "")  # as after a move or a resume: the write fails, and does not raise
        assert published(pub.folder, "ann")["env"]["CUDA_VISIBLE_DEVICES"] == "2"  # the last whole file
        assert [p.name for p in pub.folder.iterdir()] == [pub.path("ann", "").name]  # no half-written .tmp
        assert any("could not publish the GPU of ann/" in r.getMessage() for r in caplog.records)
