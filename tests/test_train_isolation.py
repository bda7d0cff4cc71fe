"""A job runs as its owner's Unix account: it cannot read another user's job files (needs root
and two system accounts, as in CI; skipped elsewhere). From a private clone the jobs take
gpupool's files from the system prefix, as a root hub's do (tests/support/users_code.py)."""

from __future__ import annotations

import pwd
import shutil
import tempfile
from pathlib import Path

import pytest

from gpupool.pool import BuildLimits
from gpupool.train.service import TrainingService
from tests.support.jobs import job_request
from tests.support.pools import make_training, run_until
from tests.support.users_code import SYSTEM_PYTHON, users_code, why_no_accounts

WHY_NOT = why_no_accounts("nobody", "daemon")
pytestmark = pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)

PEEK = """
import os
print("uid", os.getuid())
try:
    open({path!r}).read()
    print("read it")
except PermissionError:
    print("denied")
open("mine.txt", "w").write("ok")
"""


@pytest.fixture
def root_dir(monkeypatch):
    users_code(monkeypatch)  # the wrapper the jobs' accounts can read, wherever the clone lives
    d = Path(tempfile.mkdtemp(prefix="gpupool-jobs-"))
    d.chmod(0o755)  # other accounts must reach their own job folders below it
    yield d
    shutil.rmtree(d, ignore_errors=True)


def service(root: Path, tmp_path: Path) -> TrainingService:
    return make_training(
        tmp_path,
        2,
        limits=BuildLimits(1000, (1000,), 1000, 1),
        python=SYSTEM_PYTHON,
        projects={"p": {"guarantee": 2}},
        jobs_root=str(root / "{username}"),
        run_as="owner",
    )


def finish(svc: TrainingService, job_id: str) -> str:
    run_until(svc, lambda: svc.job(job_id).state in ("succeeded", "failed"), "the job to end")
    return Path(svc.job(job_id).workdir, "job.log").read_text()


def test_jobs_run_as_their_owner_and_cannot_read_each_other(root_dir: Path, tmp_path: Path) -> None:
    svc = service(root_dir, tmp_path)
    first = svc.submit(
        job_request(
            owner="nobody",
            project="p",
            name="first",
            command=[SYSTEM_PYTHON, "job.py"],
            files={"job.py": PEEK.format(path="/etc/shadow").encode()},
        )
    )
    log = finish(svc, first.id)
    assert f"uid {pwd.getpwnam('nobody').pw_uid}" in log and "denied" in log
    folder = Path(first.workdir)
    assert folder.stat().st_uid == pwd.getpwnam("nobody").pw_uid and folder.stat().st_mode & 0o777 == 0o700
    assert (folder / "mine.txt").read_text() == "ok"

    second = svc.submit(
        job_request(
            owner="daemon",
            project="p",
            name="second",
            command=[SYSTEM_PYTHON, "job.py"],
            files={"job.py": PEEK.format(path=str(folder / "mine.txt")).encode()},
        )
    )
    log = finish(svc, second.id)
    assert f"uid {pwd.getpwnam('daemon').pw_uid}" in log and "denied" in log


def test_run_as_owner_refuses_users_without_an_account(root_dir: Path, tmp_path: Path) -> None:
    svc = service(root_dir, tmp_path)
    with pytest.raises(PermissionError, match="has no Unix account"):
        svc.submit(job_request(owner="no-such-user-xyz", project="p", name="x", command=["true"]))
    assert svc.jobs() == []
