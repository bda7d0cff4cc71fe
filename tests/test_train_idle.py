"""Idle train jobs: warned in their log, then stopped (failed, "idle GPU"), measured by the idle
culler's own sampler (the file sampler standing in for NVML)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from traitlets import TraitError
from traitlets.config import Config

from gpupool.idle_culler.policy import IdleTracker
from gpupool.train.config import TrainPool
from gpupool.train.idle import IdleClock, IdleRule
from tests.support.jobs import job_request
from tests.support.pools import make_training, run_until

UNTIL_TOLD = [sys.executable, "-c", "import os, time\nwhile not os.path.exists('stop'): time.sleep(0.05)"]


def test_the_clock_warns_once_then_stops_and_forgets_busy_or_unknown_runs() -> None:
    rule = IdleRule(idle_s=600, warn_s=120)
    clock = IdleClock()
    run = {("j", 1): rule}
    assert clock.step(run, {"j": 0.0}, now=0) == []
    assert clock.step(run, {"j": 0.5}, now=470) == []
    assert clock.step(run, {"j": 0.0}, now=480) == [("j", "warn", 480)]
    assert clock.step(run, {"j": 0.0}, now=500) == []  # warned once
    assert clock.step(run, {"j": 0.0}, now=600) == [("j", "stop", 600)]
    for busy in ({"j": 80.0}, {"j": None}, {}):  # busy again, or no data: the clock starts over
        clock.step(run, {"j": 0.0}, now=0)
        clock.step(run, busy, now=100)
        assert clock.step(run, {"j": 0.0}, now=650) == []
    clock.step(run, {"j": 0.0}, now=700)
    assert clock.step({("j", 2): rule}, {"j": 0.0}, now=1400) == []  # a resumed run starts over


@pytest.mark.parametrize(
    "threshold, reading",
    [(1.0, 1.0), (1.0, 0.99), (1.0, 1.5), (5.0, 5.0), (5.0, 4.0), (0.0, 0.0)],
)
def test_a_job_is_idle_exactly_when_a_workspace_would_be(threshold: float, reading: float) -> None:
    """One meaning of c.IdleCuller.util_threshold_pct: strictly below is idle, at it is use, for
    a workspace (the culler's windows) and a train job (its clock) alike."""
    tracker = IdleTracker(window_s=30, threshold_pct=threshold)
    for s in range(0, 700, 10):
        tracker.add(s, reading)
    workspace_idle = tracker.idle_s > 0
    clock, run = IdleClock(), {("j", 1): IdleRule(idle_s=600, warn_s=60, util_pct=threshold)}
    clock.step(run, {"j": reading}, now=0)
    job_stopped = clock.step(run, {"j": reading}, now=600) == [("j", "stop", 600)]
    assert job_stopped == workspace_idle == (reading < threshold)


def test_idle_gpu_s_is_checked_per_project() -> None:
    c = Config()
    c.TrainPool.projects = {"a": {"guarantee": 1, "idle_gpu_s": 3600}, "b": {"guarantee": 1}}
    assert set(TrainPool(config=c).idle_rules()) == {"a"}
    for bad in (-1, "soon", 10 * 86400, float("nan")):
        c.TrainPool.projects = {"a": {"guarantee": 1, "idle_gpu_s": bad}}
        with pytest.raises(TraitError, match="idle_gpu_s"):
            TrainPool(config=c).idle_rules()


def test_an_idle_job_is_warned_in_its_log_then_stopped_as_failed_idle_gpu(tmp_path: Path) -> None:
    from gpupool.idle_culler.sampler import FileSampler
    from gpupool.wiring.setup import job_gpu_use

    svc = make_training(
        tmp_path,
        3,
        projects={"lab": {"guarantee": 2, "idle_gpu_s": 1800}, "free": {"guarantee": 1}},
        idle_warn_s=600,
        grace_s=1,
    )
    pool = svc.pool
    samples = tmp_path / "samples.json"
    svc.gpu_use = job_gpu_use(FileSampler(str(samples)), pool)
    try:
        hung = svc.submit(job_request(owner="ann", project="lab", name="hung", command=UNTIL_TOLD), now=0).id
        busy = svc.submit(job_request(owner="ann", project="lab", name="busy", command=UNTIL_TOLD), now=0).id
        other = svc.submit(
            job_request(owner="bob", project="free", name="other", command=UNTIL_TOLD), now=0
        ).id
        svc.tick(now=1)
        samples.write_text(
            json.dumps(
                {
                    f"ann/{hung}": {"util_pct": 0},
                    f"ann/{busy}": {"util_pct": 97},
                    f"bob/{other}": {"util_pct": 0},
                }
            )
        )
        for now in (10, 600, 1210):
            svc.tick(now)
        assert "it will be stopped in 10 min" in svc.job(hung).message
        assert "idle for 20 min" in Path(svc.job(hung).workdir, "job.log").read_text()
        svc.tick(now=1810)
        assert svc.job(hung).state == "preempting"
        run_until(svc, lambda: svc.job(hung).state != "preempting", "the idle job to stop", now=1811)
        row = svc.job(hung)
        assert (row.state, row.message) == ("failed", "idle GPU")
        assert svc.job(busy).state == "running"  # it uses its GPU
        assert svc.job(other).state == "running"  # its project has no idle rule (off by default)
        kinds = [e.kind for e in pool.store.events(limit=50) if e.name == hung]
        assert kinds.count("idle-warning") == 1 and kinds.count("idle-stop") == 1
    finally:
        for row in svc.jobs():
            Path(row.workdir, "stop").touch()
