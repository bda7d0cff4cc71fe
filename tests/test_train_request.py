"""A new train job travels as one request (gpupool.train.request.JobRequest), built once by the
API: the embedded back-end records every field of it (the Kubernetes one:
tests/k8s/test_train_service.py and tests/cluster)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from gpupool.store import TrainJob
from gpupool.train.backend import LocalTraining
from gpupool.train.code import JobCode
from gpupool.train.request import JobRequest
from tests.support.pools import make_training


def test_the_local_back_end_records_every_field_of_the_request(tmp_path: Path) -> None:
    svc = make_training(tmp_path, 4, projects={"lab": {"guarantee": 4}})
    job = JobRequest(
        owner="ann",
        project="lab",
        name="elastic",
        num_gpu=4,
        gpu_milli=1000,
        code=JobCode.notebook(b"{}"),
        priority=3,
        min_runtime_s=60.0,
        max_runtime_s=600.0,
        min_gpus=2,
        pools=("dgx", "ws"),
    )
    assert job.least_milli == 2000  # an elastic job starts on its minimum
    row = asyncio.run(LocalTraining(svc).submit(job, now=5.0))
    assert (row.owner, row.project, row.name, row.num_gpu, row.gpu_milli, row.priority) == (
        "ann",
        "lab",
        "elastic",
        4,
        1000,
        3,
    )
    assert (row.min_runtime_s, row.max_runtime_s, row.submitted, row.state) == (60.0, 600.0, 5.0, "queued")
    assert row.command[-2:] == ["input.ipynb", "output.ipynb"]  # the notebook run beside its input
    assert json.loads(Path(row.workdir, "input.ipynb").read_bytes()) == {}
    with svc.pool.store.session() as s:  # one row holds the whole request, as a restarted hub reads it
        stored = s.get_one(TrainJob, row.id)
        assert (stored.min_gpus, stored.max_gpus, stored.pools) == (2, 4, ["dgx", "ws"])


def test_a_user_whose_name_is_longer_than_a_file_name_can_submit_a_job(tmp_path: Path) -> None:
    """A 130-character hub name of 257 bytes logs in; before, every job it submitted failed
    with "File name too long" (its jobs folder is named after it). Two such names sharing a
    prefix keep folders of their own."""
    import sys

    from tests.support.jobs import job_request

    svc = make_training(tmp_path, 1, projects={"lab": {"guarantee": 1}})
    first, second = "é" * 127 + "abc", "é" * 127 + "abd"
    assert len(first) == 130 and len(first.encode()) == 257
    rows = [
        svc.submit(
            job_request(owner=who, project="lab", name="fit", command=[sys.executable, "-c", "pass"]), now=0
        )
        for who in (first, second)
    ]
    from gpupool.train.folders import NAME_MAX, path_component

    folders = [Path(r.workdir).parent for r in rows]
    assert all(f.is_dir() and len(f.name.encode()) <= NAME_MAX for f in folders) and folders[0] != folders[1]
    assert path_component("ann") == "ann"  # a name that fits is its own folder, as before
