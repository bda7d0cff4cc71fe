"""Priorities inside a project, through the hub's training service with real runs."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from traitlets.config import Config

from gpupool.manager import PoolManager
from gpupool.pool import BuildLimits, BuildQuotaPolicy, get_policy, virtual_inventory
from gpupool.store import Store
from gpupool.train.config import TrainPool
from gpupool.train.service import TrainingService

UNTIL_TOLD = [sys.executable, "-c", "import os, time\nwhile not os.path.exists('stop'): time.sleep(0.05)"]


def test_a_higher_priority_job_preempts_its_projects_lower_one_which_resumes_after(tmp_path: Path) -> None:
    c = Config()
    c.TrainPool.projects = {"lab": {"guarantee": 1}}
    c.TrainPool.jobs_root = str(tmp_path / "jobs" / "{username}")
    c.TrainPool.grace_s = 1
    pool = PoolManager(virtual_inventory(1), Store(f"sqlite:///{tmp_path}/pool.sqlite"),
                       BuildQuotaPolicy(BuildLimits(1000, (250, 1000), 1000, 2)), get_policy("best-fit"))
    svc = TrainingService(pool, TrainPool(config=c))

    def tick_until(cond, now: float) -> None:
        deadline = time.monotonic() + 30
        while not cond():
            assert time.monotonic() < deadline, [j.to_json() for j in svc.jobs()]
            svc.tick(now)
            time.sleep(0.05)

    try:
        low = svc.submit("ann", "lab", "sweep", 1, 1000, UNTIL_TOLD, priority=0, now=0).id
        svc.tick(now=1)
        assert svc.job(low).state == "running"
        urgent = svc.submit("bob", "lab", "deadline", 1, 1000, UNTIL_TOLD, priority=10, now=2).id
        svc.tick(now=3)
        assert svc.job(low).state == "preempting" and "priority 10" in svc.job(low).message
        tick_until(lambda: svc.job(urgent).state == "running", now=4)
        assert svc.job(low).state == "queued" and svc.job(low).preemptions == 1
        Path(svc.job(urgent).workdir, "stop").touch()  # the urgent one ends: the low one resumes
        tick_until(lambda: svc.job(low).state == "running", now=5)
        assert svc.job(low).runs == 2
        # and a job of the same priority never preempts
        same = svc.submit("cy", "lab", "same", 1, 1000, UNTIL_TOLD, priority=0, now=6).id
        for now in (7, 8):
            svc.tick(now)
        assert svc.job(low).state == "running" and svc.job(same).state == "queued"
    finally:
        for row in svc.jobs():
            Path(row.workdir, "stop").touch()
