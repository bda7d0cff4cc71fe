"""Elastic jobs: start with what fits above their minimum, grow onto idle GPUs, shrink before
an in-quota job is refused."""

from __future__ import annotations

from gpupool.pool import ClusterState, Request, get_policy
from gpupool.pool.inventory import GPU, Inventory, Node
from gpupool.pool.training import Job, Project, schedule
from tests.support.jobs import job_request

POLICY = get_policy("best-fit")


def node8() -> Inventory:
    return Inventory(nodes=(Node("dgx", tuple(GPU(g, f"g{g}", "H100", 80000, True) for g in range(8))),))


def running(state: ClusterState, jid: str, project: str, gpus: list[int], **kw) -> Job:
    req = Request(len(gpus))
    p = state.placement_on(0, req, gpus)
    state.apply(p)
    return Job(jid, project, req, submitted=0, started=0, placement=p, **kw)


def test_an_elastic_job_starts_with_the_largest_size_that_fits_above_its_minimum() -> None:
    state = ClusterState(node8())
    projects = {"lab": Project("lab", 8000), "other": Project("other", 8000)}
    busy = running(state, "busy", "other", [0, 1, 2])
    elastic = Job("e", "lab", Request(2), submitted=1, min_gpus=2, max_gpus=8)
    plan = schedule(state, projects, [elastic], [busy], now=10, policy=POLICY)
    assert [(a.job, len(a.placement.gpus)) for a in plan.admit] == [("e", 5)]
    # never below its minimum, never above its project's limit
    projects["lab"] = Project("lab", 0, limit_milli=3000)
    plan = schedule(state, projects, [elastic], [busy], now=10, policy=POLICY)
    assert [(a.job, len(a.placement.gpus)) for a in plan.admit] == [("e", 3)]
    full = running(state, "full", "other", [3, 4, 5, 6])
    assert schedule(state, projects, [elastic], [busy, full], now=10, policy=POLICY).admit == []


def test_it_shrinks_to_its_minimum_before_an_in_quota_job_is_refused() -> None:
    state = ClusterState(node8())
    projects = {"lab": Project("lab", 2000), "own": Project("own", 4000)}
    e = running(state, "e", "lab", list(range(8)), min_gpus=2, max_gpus=8)
    want = Job("mine", "own", Request(4), submitted=5)
    plan = schedule(state, projects, [want], [e], now=100, policy=POLICY)
    # lab is within its guarantee of 2 only with 2 GPUs: no reclaim takes it all, it shrinks
    assert [(r.job, r.to.gpus) for r in plan.resize] == [("e", (0, 1))] and plan.preempt == []
    assert plan.admit == []  # "mine" starts once e has stopped; its room is held meanwhile
    # not within its min runtime
    young = Job(**{**e.__dict__, "started": 90, "min_runtime_s": 3600})
    assert schedule(state, projects, [want], [young], now=100, policy=POLICY).resize == []


def test_it_grows_onto_idle_gpus_only_when_nobody_waits() -> None:
    state = ClusterState(node8())
    projects = {"lab": Project("lab", 2000), "other": Project("other", 4000)}
    e = running(state, "e", "lab", [0, 1], min_gpus=2, max_gpus=4)
    plan = schedule(state, projects, [], [e], now=100, policy=POLICY)
    assert [(r.job, r.to.gpus) for r in plan.resize] == [("e", (0, 1, 2, 3))]
    waiting = Job("w", "other", Request(8), submitted=50)  # cannot start now, but waits
    assert schedule(state, projects, [waiting], [e], now=100, policy=POLICY).resize == []
    capped = {"lab": Project("lab", 2000, limit_milli=3000), "other": projects["other"]}
    plan = schedule(state, capped, [], [e], now=100, policy=POLICY)
    assert [len(r.to.gpus) for r in plan.resize] == [3]  # up to its project's limit
    done = Job(**{**e.__dict__, "max_gpus": 2})
    assert schedule(state, projects, [], [done], now=100, policy=POLICY).resize == []


def test_the_hub_resizes_a_real_elastic_job_which_sees_its_size(tmp_path) -> None:
    """Four GPUs, one taken: an elastic job (1-4 GPUs) starts on 3 and prints GPUPOOL_GPUS=3;
    an in-quota job of another project needs 2: the elastic job restarts on 1; once that job
    ends and nobody waits, it grows back to 3."""
    import sys
    from pathlib import Path

    from tests.support.pools import make_training, run_until

    svc = make_training(
        tmp_path, 4, placement=POLICY, projects={"lab": {"guarantee": 1}, "own": {"guarantee": 3}}, grace_s=1
    )
    pool = svc.pool
    job = [
        sys.executable,
        "-c",
        "import os, time\nprint('GPUPOOL_GPUS', os.environ['GPUPOOL_GPUS'], flush=True)\n"
        "while not os.path.exists('stop'): time.sleep(0.05)",
    ]

    def sizes(job_id: str) -> list[str]:
        log = Path(svc.job(job_id).workdir, "job.log").read_text()
        # whole lines only: the run may be writing its next one while the test reads
        return [
            line.split()[1]
            for line in log.splitlines(keepends=True)
            if line.startswith("GPUPOOL_GPUS") and line.endswith("\n")
        ]

    try:
        busy = svc.submit(job_request(owner="bob", project="own", name="busy", command=job), now=0).id
        svc.tick(now=1)
        e = svc.submit(
            job_request(owner="ann", project="lab", name="elastic", num_gpu=4, command=job, min_gpus=1), now=2
        ).id
        svc.tick(now=3)
        run_until(svc, lambda: sizes(e) == ["3"], "the elastic job runs on 3 GPUs", now=4)
        assert svc.job(e).num_gpu == 3 and svc.job(busy).state == "running"
        mine = svc.submit(
            job_request(owner="bob", project="own", name="mine", num_gpu=2, command=job), now=5
        ).id
        run_until(svc, lambda: svc.job(mine).state == "running", "the in-quota job runs", now=100)
        run_until(svc, lambda: sizes(e) == ["3", "1"], "the elastic job restarts on 1 GPU", now=101)
        assert (
            svc.job(e).num_gpu == 1
            and "shrunk to 1 GPUs"
            in [ev.message for ev in pool.store.events(limit=50) if ev.kind == "preempt"][0]
        )
        Path(svc.job(mine).workdir, "stop").touch()
        run_until(svc, lambda: svc.job(mine).state == "succeeded", "the in-quota job ends", now=200)
        run_until(svc, lambda: sizes(e) == ["3", "1", "3"], "the elastic job grows back to 3", now=300)
    finally:
        for row in svc.jobs():
            Path(row.workdir, "stop").touch()
