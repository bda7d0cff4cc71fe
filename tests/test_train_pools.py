"""Node pools: projects use only their pools' GPUs, in their order of preference."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from traitlets import TraitError
from traitlets.config import Config

from gpupool.pool import ClusterState, Request, get_policy
from gpupool.pool.inventory import GPU, Inventory, Node
from gpupool.pool.pools import NodePool
from gpupool.pool.training import Job, Project, schedule
from tests.support.jobs import job_request
from tests.support.wait import until

POLICY = get_policy("best-fit")
POOLS = {
    "workstations": NodePool("workstations", models=frozenset({"A2000"})),
    "dgx": NodePool("dgx", models=frozenset({"H100"})),
}


def mixed() -> Inventory:
    """Two workstations with two A2000 each, one DGX with eight H100."""
    ws = [
        Node(f"ws{i}", tuple(GPU(g, f"ws{i}g{g}", "A2000", 12000, True) for g in range(2))) for i in range(2)
    ]
    dgx = Node("dgx0", tuple(GPU(g, f"dgx0g{g}", "H100", 80000, True) for g in range(8)))
    return Inventory(nodes=(*ws, dgx))


def test_jobs_go_to_their_preferred_pool_first_and_never_outside_their_pools() -> None:
    state = ClusterState(mixed())
    projects = {
        "vision": Project("vision", 8000, pools=("dgx", "workstations")),
        "teach": Project("teach", 4000, pools=("workstations",)),
    }
    pending = [Job(f"v{i}", "vision", Request.for_gpus(1000), submitted=i) for i in range(10)]
    pending += [Job(f"t{i}", "teach", Request.for_gpus(1000), submitted=20 + i) for i in range(4)]
    plan = schedule(state, projects, pending, [], now=0, policy=POLICY, pools=POOLS)
    where = {a.job: a.placement.node for a in plan.admit}
    assert [where[f"v{i}"] for i in range(8)] == ["dgx0"] * 8  # the DGX first
    assert {where.get("v8"), where.get("v9")} <= {"ws0", "ws1", None}  # then the workstations
    assert all(where[j].startswith("ws") for j in where if j.startswith("t"))  # never the DGX
    assert len(plan.admit) == 12  # 8 H100 + 4 A2000: everything there is
    own = Job("own", "vision", Request.for_gpus(1000), submitted=0, pools=("workstations",))
    plan = schedule(ClusterState(mixed()), projects, [own], [], now=0, policy=POLICY, pools=POOLS)
    assert plan.admit[0].placement.node.startswith("ws")  # a job's own choice comes before its project's


def test_a_gang_job_only_fits_where_its_pool_has_room_and_consolidation_moves_stay_in_pools() -> None:
    state = ClusterState(mixed())
    projects = {"vision": Project("vision", 8000, pools=("dgx",)), "teach": Project("teach", 4000)}
    running = []
    for g in (0, 1, 2, 3, 4, 5, 6):  # "teach" (any pool) sits on seven H100s
        p = state.placement_on(2, Request.for_gpus(1000), [g])
        state.apply(p)
        running.append(Job(f"r{g}", "teach", Request.for_gpus(1000), submitted=0, started=0, placement=p))
    big = Job("big", "vision", Request.for_gpus(8000), submitted=1)
    plan = schedule(state, projects, [big], running, now=100, policy=POLICY, pools=POOLS)
    assert plan.admit == []
    # teach is in quota for 4 GPUs, borrowing 3: those are reclaimed; the in-quota ones move to
    # the workstations (they may use any pool), never onto another H100
    assert len(plan.preempt) + len(plan.move) == 7 and len(plan.preempt) == 3
    assert all(m.to.node.startswith("ws") for m in plan.move)


def test_pools_are_checked_against_projects() -> None:
    from gpupool.train.config import TrainPool

    c = Config()
    c.TrainPool.node_pools = {"dgx": {"models": ["H100"]}}
    c.TrainPool.projects = {"v": {"guarantee": 1, "pools": ["dgx", "cloud"]}}
    with pytest.raises(TraitError, match=r"pools \['cloud'\] are not in TrainPool.node_pools"):
        TrainPool(config=c).pool_table()
    c.TrainPool.node_pools = {"dgx": {"gpus": ["0"]}}
    with pytest.raises(TraitError, match="gpus a list of GPU indices"):
        TrainPool(config=c).pool_table()
    c.TrainPool.node_pools = {"dgx": {"models": ["H100"]}, "cloud": {"nodes": ["n1"], "gpus": [0]}}
    assert TrainPool(config=c).pool_table()["cloud"].has("n1", 0, "T4")


def test_the_hub_runs_a_projects_jobs_on_its_pools_gpus(tmp_path: Path) -> None:
    """One machine with two A2000 (GPUs 0-1) and two H100 (GPUs 2-3): "vision" prefers the
    H100s, "teach" may only use the A2000s; real runs get those GPUs in CUDA_VISIBLE_DEVICES."""

    from tests.support.pools import make_training, run_until

    gpus = tuple(GPU(g, f"GPU-{g}", "A2000" if g < 2 else "H100", 12000, True) for g in range(4))
    svc = make_training(
        tmp_path,
        Inventory(nodes=(Node("localhost", gpus),)),
        placement=POLICY,
        node_pools={"workstations": {"models": ["A2000"]}, "dgx": {"gpus": [2, 3]}},
        projects={
            "vision": {"guarantee": 3, "pools": ["dgx", "workstations"]},
            "teach": {"guarantee": 1, "pools": ["workstations"]},
        },
    )
    go = tmp_path / "go"  # runs hold their GPUs until the test says so: placements never race exits
    show = [
        sys.executable,
        "-c",
        "import os, sys, time; print('GPUS', os.environ['CUDA_VISIBLE_DEVICES'], flush=True)\n"
        "while not os.path.exists(sys.argv[1]): time.sleep(0.05)",
        str(go),
    ]
    ids = [
        svc.submit(job_request(owner="ann", project="vision", name=f"v{i}", command=show), now=i).id
        for i in range(3)
    ]
    ids.append(svc.submit(job_request(owner="bob", project="teach", name="t", command=show), now=5).id)
    ids.append(
        svc.submit(
            job_request(owner="ann", project="vision", name="low-end", command=show, pools=("workstations",)),
            now=6,
        ).id
    )
    svc.tick(now=10)
    assert [svc.job(i).state for i in ids] == ["running"] * 4 + ["queued"]  # 4 GPUs, 4 in quota
    logs = [Path(svc.job(i).workdir, "job.log") for i in ids]
    # every run says its GPU before any ends: once one ends, low-end is in quota and a run that
    # had not printed yet may be moved for it (consolidation), and would print its new GPU first
    until(lambda: all("GPUS " in log.read_text() for log in logs[:4]), "the four runs to say their GPU")
    go.touch()
    run_until(svc, lambda: all(svc.job(i).state == "succeeded" for i in ids), "every run to succeed", now=11)
    seen = [log.read_text().split("GPUS ")[1].split()[0] for log in logs]
    assert sorted(seen[:2]) == ["2", "3"] and seen[2] in ("0", "1")  # H100s first, then an A2000
    assert seen[3] in ("0", "1") and seen[3] != seen[2]
    assert seen[4] in ("0", "1")  # its own choice: an A2000, though vision prefers the H100s


def test_guarantees_per_pool_are_one_project_per_pool_under_a_department() -> None:
    """vision has 2 H100 guaranteed and 2 A2000 guaranteed: two projects, one per pool, under
    a department that caps them together. A borrower on the DGX is reclaimed for vision's DGX
    guarantee even though vision already runs on its workstation GPUs."""
    from gpupool.pool.training import Department

    state = ClusterState(mixed())
    projects = {
        "vision-dgx": Project("vision-dgx", 2000, pools=("dgx",), department="vision"),
        "vision-ws": Project("vision-ws", 2000, pools=("workstations",), department="vision"),
        "lab": Project("lab", 0),
    }
    departments = {"vision": Department("vision", 4000, limit_milli=6000)}
    running = []
    for node, gpus, jid, project in (
        ("ws0", [0, 1], "w", "vision-ws"),
        ("dgx0", list(range(8)), "borrow", "lab"),
    ):
        p = state.placement_on(state.inventory.index_of(node), Request(len(gpus)), gpus)
        state.apply(p)
        running.append(Job(jid, project, Request(len(gpus)), submitted=0, started=0, placement=p))
    want = Job("d", "vision-dgx", Request(2), submitted=5)
    plan = schedule(
        state, projects, [want], running, now=100, policy=POLICY, pools=POOLS, departments=departments
    )
    assert [(p.job, p.for_job) for p in plan.preempt] == [("borrow", "d")]
    # beyond its workstation guarantee a job borrows the free workstation, never the DGX
    more = [Job(f"w{i}", "vision-ws", Request(1), submitted=6 + i) for i in range(3)]
    plan = schedule(
        state, projects, more, running, now=100, policy=POLICY, pools=POOLS, departments=departments
    )
    assert plan.preempt == [] and sorted(a.placement.node for a in plan.admit) == ["ws1", "ws1"]
