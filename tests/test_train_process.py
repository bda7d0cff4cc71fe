"""Real processes: a job preempted and resumed several times ends with exactly the result
of an uninterrupted run; cancel and max runtime end it for good."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpupool.train.service import TrainingService
from gpupool.train.waiting import last_preemption
from tests.support.jobs import job_request
from tests.support.pools import make_training, run_until

JOB = textwrap.dedent("""
    import time
    from gpupool.widgets.checkpoint import Checkpoint
    ckpt = Checkpoint()
    state = ckpt.load(default={"step": 0, "total": 0})
    while state["step"] < 40:
        state["total"] += state["step"] ** 2
        state["step"] += 1
        time.sleep(0.02)
        if ckpt.preempted:
            ckpt.save(state)
            ckpt.exit()
    ckpt.save(state)
    print("RESULT", state["total"])
""")
EXPECTED = sum(i * i for i in range(40))


def service(tmp_path: Path, projects: dict, gpus: int = 1, grace: float = 5.0) -> TrainingService:
    return make_training(tmp_path, gpus, projects=projects, grace_s=grace)


def submit(svc: TrainingService, *, owner: str, project: str, max_runtime_s: float = 0.0):
    return svc.submit(
        job_request(
            owner=owner,
            project=project,
            name="count",
            command=[sys.executable, "job.py"],
            files={"job.py": JOB.encode()},
            max_runtime_s=max_runtime_s,
        )
    )


def result(svc: TrainingService, job_id: str) -> str:
    log = Path(svc.job(job_id).workdir, "job.log").read_text()
    return [line for line in log.splitlines() if line.startswith("RESULT")][-1]


def test_preempted_three_times_and_resumed_gives_the_uninterrupted_result(tmp_path: Path) -> None:
    # one GPU; 'lab' borrows it beyond a zero guarantee, 'paper' has a guarantee of 1
    svc = service(tmp_path, {"lab": {"guarantee": 0}, "paper": {"guarantee": 1}})
    borrower = submit(svc, owner="ann", project="lab").id
    for _ in range(3):
        run_until(svc, lambda: svc.job(borrower).state == "running" and svc.job(borrower).runs > 0)
        time.sleep(0.2)  # let it make some progress
        owner = submit(svc, owner="bob", project="paper", max_runtime_s=0).id
        # the guarantee comes back within a cycle plus the grace period: ann's job is preempted
        run_until(svc, lambda owner=owner: svc.job(owner).state in ("running", "succeeded"))
        assert svc.job(borrower).state == "queued"  # kept its place, waiting to resume
        line = last_preemption(svc.pool, svc.job(borrower))  # what the job monitor shows, in one line
        saved = any(Path(svc.job(borrower).workdir, "checkpoint").iterdir())  # SIGTERM may beat the handler
        assert (
            line.startswith("preempted at ")
            and "so that project paper gets its guarantee back; "
            + (
                "resumes from the checkpoint saved at "
                if saved
                else "restarts from the beginning: no checkpoint"
            )
            in line
        ), line
        run_until(svc, lambda owner=owner: svc.job(owner).state == "succeeded")
    run_until(svc, lambda: svc.job(borrower).state == "succeeded")
    job = svc.job(borrower)
    assert (job.preemptions, job.runs) == (3, 4)
    assert result(svc, borrower) == f"RESULT {EXPECTED}"
    kinds = [e.kind for e in svc.pool.store.events(limit=200) if e.name == borrower]
    assert kinds.count("preempt") == 3 and kinds.count("resume") == 3
    assert svc.pool.store.allocations() == []  # every GPU given back


# runs until the test lets it end (a file in its folder), however slow the machine is
UNTIL_RELEASED = "import os, time\nwhile not os.path.exists('release'):\n    time.sleep(0.02)\n"


def test_in_quota_jobs_are_never_preempted(tmp_path: Path) -> None:
    svc = service(tmp_path, {"a": {"guarantee": 1}, "b": {"guarantee": 1}})
    first = svc.submit(
        job_request(
            owner="ann",
            project="a",
            name="hold",
            command=[sys.executable, "job.py"],
            files={"job.py": UNTIL_RELEASED.encode()},
        )
    ).id
    run_until(svc, lambda: svc.job(first).state == "running")
    second = submit(svc, owner="bob", project="b").id
    for _ in range(20):
        svc.tick(time.time())
    assert svc.job(first).state == "running" and svc.job(second).state == "queued"
    assert svc.job(first).preemptions == 0
    Path(svc.job(first).workdir, "release").touch()
    run_until(svc, lambda: svc.job(second).state == "succeeded")  # the queue goes on once it ends


@pytest.mark.parametrize("how", ["cancel", "max-runtime"])
def test_cancel_and_max_runtime_end_a_run_for_good(tmp_path: Path, how: str) -> None:
    svc = service(tmp_path, {"a": {"guarantee": 1}}, grace=0.5)
    job = submit(svc, owner="ann", project="a", max_runtime_s=0.3 if how == "max-runtime" else 0).id
    run_until(svc, lambda: svc.job(job).state == "running")
    if how == "cancel":
        svc.cancel(job)
    run_until(svc, lambda: svc.job(job).state in ("cancelled", "failed", "succeeded"))
    row = svc.job(job)
    assert row.state == ("cancelled" if how == "cancel" else "failed")
    if how == "max-runtime":
        assert row.message == "stopped at its max runtime"
    assert svc.pool.store.allocations() == []


def test_build_workspaces_come_first_in_one_pool(tmp_path: Path) -> None:
    from gpupool.pool import NoCapacity

    svc = service(tmp_path, {"lab": {"guarantee": 0}, "own": {"guarantee": 1}}, grace=0.5)
    borrower = submit(svc, owner="ann", project="lab").id
    run_until(svc, lambda: svc.job(borrower).state == "running")
    with pytest.raises(NoCapacity, match=r"Making room for 1 GPU: preempting job \w+ of project lab, ~1 s"):
        svc.pool.reserve_build("bob", [], "", 1000)
    assert svc.job(borrower).state == "preempting"
    run_until(svc, lambda: svc.job(borrower).state == "queued")
    assert svc.pool.reserve_build("bob", [], "", 1000).total_milli == 1000  # the retry gets the GPU
    for _ in range(5):
        svc.tick(time.time())
    assert svc.job(borrower).state == "queued"  # waits: the workspace keeps its GPU


def test_in_quota_train_jobs_are_not_preempted_for_a_workspace(tmp_path: Path) -> None:
    from gpupool.pool import NoCapacity

    svc = service(tmp_path, {"own": {"guarantee": 1}})
    job = submit(svc, owner="ann", project="own").id
    run_until(svc, lambda: svc.job(job).state == "running")
    with pytest.raises(NoCapacity, match="no GPU has room"):
        svc.pool.reserve_build("bob", [], "", 1000)
    assert svc.job(job).state == "running"


def test_a_run_that_ends_hands_its_share_to_the_next_job_in_the_same_tick(tmp_path: Path) -> None:
    """A tick plans with the rows it settled, not those it read before: the queued job of a
    project at its limit starts in the very tick that sees the project's running job end."""
    svc = make_training(tmp_path, 2, projects={"lab": {"guarantee": 1, "limit": 1}})
    quick = [sys.executable, "-c", "pass"]
    first = svc.submit(job_request(owner="ann", project="lab", name="first", command=quick), now=0)
    second = svc.submit(job_request(owner="ann", project="lab", name="second", command=quick), now=1)
    svc.tick(now=10)
    assert svc.job(first.id).state == "running" and svc.job(second.id).state == "queued"  # the limit
    run_until(svc, lambda: svc.job(first.id).state != "running", "the first run ends", now=20)
    assert svc.job(first.id).state == "succeeded"
    assert svc.job(second.id).state == "running"  # in that same tick, not the next
    run_until(svc, lambda: svc.job(second.id).state == "succeeded", "the second run ends", now=30)
