"""Priorities inside a project, through the hub's training service with real runs."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support.jobs import job_request
from tests.support.pools import make_training, run_until

UNTIL_TOLD = [sys.executable, "-c", "import os, time\nwhile not os.path.exists('stop'): time.sleep(0.05)"]


def test_a_higher_priority_job_preempts_its_projects_lower_one_which_resumes_after(tmp_path: Path) -> None:
    svc = make_training(tmp_path, 1, projects={"lab": {"guarantee": 1}}, grace_s=1)
    try:
        low = svc.submit(
            job_request(owner="ann", project="lab", name="sweep", command=UNTIL_TOLD, priority=0), now=0
        ).id
        svc.tick(now=1)
        assert svc.job(low).state == "running"
        urgent = svc.submit(
            job_request(owner="bob", project="lab", name="deadline", command=UNTIL_TOLD, priority=10), now=2
        ).id
        svc.tick(now=3)
        assert svc.job(low).state == "preempting" and "priority 10" in svc.job(low).message
        run_until(svc, lambda: svc.job(urgent).state == "running", "the urgent job runs", now=4)
        assert svc.job(low).state == "queued" and svc.job(low).preemptions == 1
        Path(svc.job(urgent).workdir, "stop").touch()  # the urgent one ends: the low one resumes
        run_until(svc, lambda: svc.job(low).state == "running", "the preempted job runs again", now=5)
        assert svc.job(low).runs == 2
        # and a job of the same priority never preempts
        same = svc.submit(
            job_request(owner="cy", project="lab", name="same", command=UNTIL_TOLD, priority=0), now=6
        ).id
        for now in (7, 8):
            svc.tick(now)
        assert svc.job(low).state == "running" and svc.job(same).state == "queued"
    finally:
        for row in svc.jobs():
            Path(row.workdir, "stop").touch()
