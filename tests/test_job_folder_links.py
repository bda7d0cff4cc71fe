"""The hub (root) never follows a link in a job's folder, which belongs to the job's account:
a job that turns job.log into a symbolic link to a root-only file gets neither the file's
content through the logs API nor a handle to append to it when it is resumed; hard links
and a replaced checkpoint folder are refused the same way. Needs root and the nobody
account (as CI has); skipped elsewhere. From a private clone the jobs take gpupool's files from
the system prefix, as a root hub's do (tests/support/users_code.py)."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from gpupool.pool import BuildLimits
from gpupool.train.service import TrainingService
from tests.support.jobs import job_request
from tests.support.pools import make_training, run_until
from tests.support.users_code import SYSTEM_PYTHON as PYTHON
from tests.support.users_code import users_code, why_no_accounts

WHY_NOT = why_no_accounts("nobody")
pytestmark = pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)
SECRET = "TOP-SECRET-ROOT-ONLY"
DONE = ("succeeded", "failed", "cancelled")


@pytest.fixture
def secret():
    d = Path(tempfile.mkdtemp(prefix="gpupool-secret-"))
    f = d / "secret"
    f.write_text(SECRET + "\n")
    f.chmod(0o600)  # root's alone
    yield f
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def svc(tmp_path: Path, monkeypatch):
    users_code(monkeypatch)  # the wrapper and PYTHONPATH the job's account can read
    root = Path(tempfile.mkdtemp(prefix="gpupool-jobs-"))
    root.chmod(0o755)
    yield make_training(
        tmp_path,
        1,
        limits=BuildLimits(1000, (1000,), 1000, 1),
        python=PYTHON,
        projects={"p": {"guarantee": 1}},
        jobs_root=str(root / "{username}"),
        run_as="owner",
    )
    shutil.rmtree(root, ignore_errors=True)


def finish(svc: TrainingService, job_id: str) -> None:
    run_until(svc, lambda: svc.job(job_id).state in DONE, "the job to end")


def resume(svc: TrainingService, job_id: str) -> None:
    """As after a preemption: the job is queued again and the next cycle starts it."""
    svc._set(job_id, state="queued")
    svc.tick(time.time())


def logs(svc: TrainingService, job_id: str) -> str:
    return "\n".join(asyncio.run(svc.logs(svc.job(job_id), 100))["lines"])


def test_a_job_log_turned_into_a_symlink_is_neither_read_nor_appended_to(svc, secret: Path) -> None:
    script = f"import os\nos.remove('job.log')\nos.symlink({str(secret)!r}, 'job.log')\n"
    job = svc.submit(
        job_request(
            owner="nobody",
            project="p",
            name="link",
            command=[PYTHON, "job.py"],
            files={"job.py": script.encode()},
        )
    )
    finish(svc, job.id)
    assert Path(job.workdir, "job.log").is_symlink()
    shown = logs(svc, job.id)
    assert SECRET not in shown and "not shown" in shown
    resume(svc, job.id)
    row = svc.job(job.id)
    assert row.state == "failed" and "job.log" in row.message
    assert secret.read_text() == SECRET + "\n" and secret.stat().st_uid == 0
    assert svc.pool.store.allocations() == []


def test_a_hard_link_to_a_root_file_is_not_read_and_not_handed_over(svc, secret: Path) -> None:
    job = svc.submit(job_request(owner="nobody", project="p", name="hard", command=[PYTHON, "-c", "pass"]))
    finish(svc, job.id)
    folder = Path(job.workdir)
    # where fs.protected_hardlinks is off, a user may link any file it can see into its folder
    (folder / "job.log").unlink()
    os.link(secret, folder / "job.log")
    os.link(secret, folder / "planted")
    assert SECRET not in logs(svc, job.id)
    resume(svc, job.id)
    assert svc.job(job.id).state == "failed"
    assert secret.stat().st_uid == 0 and secret.read_text() == SECRET + "\n"  # not chowned to the job


def test_a_checkpoint_folder_replaced_by_a_link_is_not_followed(svc, secret: Path) -> None:
    script = (
        f"import os, shutil\nshutil.rmtree('checkpoint')\nos.symlink({str(secret.parent)!r}, 'checkpoint')\n"
    )
    job = svc.submit(
        job_request(
            owner="nobody",
            project="p",
            name="ckpt",
            command=[PYTHON, "job.py"],
            files={"job.py": script.encode()},
        )
    )
    finish(svc, job.id)
    assert svc.job(job.id).state == "succeeded"
    resume(svc, job.id)
    row = svc.job(job.id)
    assert row.state == "failed" and "checkpoint is not a folder" in row.message
    assert secret.parent.stat().st_uid == 0 and secret.stat().st_uid == 0
