"""One project with a guarantee per node pool (vision: 2 on the DGX, 2 on the workstations):
each guarantee comes back within its pool, borrowing is checked against the project's limit,
and the config refuses what cannot be meant."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from traitlets import TraitError
from traitlets.config import Config

from gpupool.pool import ClusterState, Request, get_policy
from gpupool.pool.inventory import GPU, Inventory, Node
from gpupool.pool.pools import NodePool
from gpupool.pool.training import Job, Project, schedule
from tests.support.jobs import job_request

POLICY = get_policy("best-fit")
POOLS = {
    "workstations": NodePool("workstations", models=frozenset({"A2000"})),
    "dgx": NodePool("dgx", models=frozenset({"H100"})),
}
VISION = Project(
    "vision",
    4000,
    limit_milli=6000,
    pools=("dgx", "workstations"),
    pool_guarantees=(("dgx", 2000), ("workstations", 2000)),
)


def mixed(dgx_nodes: int = 1) -> Inventory:
    """Two workstations with two A2000 each, DGXs with eight H100 each."""
    ws = [
        Node(f"ws{i}", tuple(GPU(g, f"ws{i}g{g}", "A2000", 12000, True) for g in range(2))) for i in range(2)
    ]
    dgx = [
        Node(f"dgx{i}", tuple(GPU(g, f"dgx{i}g{g}", "H100", 80000, True) for g in range(8)))
        for i in range(dgx_nodes)
    ]
    return Inventory(nodes=(*ws, *dgx))


def run(state: ClusterState, jid: str, project: str, node: str, gpus: list[int], started: float = 0) -> Job:
    p = state.placement_on(state.inventory.index_of(node), Request(len(gpus)), gpus)
    state.apply(p)
    return Job(jid, project, Request(len(gpus)), submitted=started, started=started, placement=p)


def test_each_pools_guarantee_is_reclaimed_within_that_pool() -> None:
    """vision already runs its 2 workstation GPUs; its DGX guarantee is still owed, so a
    borrower on the DGX is preempted for it — the workstation use does not count there."""
    state = ClusterState(mixed())
    projects = {"vision": VISION, "lab": Project("lab", 0)}
    running = [run(state, "w", "vision", "ws0", [0, 1]), run(state, "borrow", "lab", "dgx0", list(range(8)))]
    plan = schedule(
        state,
        projects,
        [Job("d", "vision", Request(2), submitted=5)],
        running,
        now=100,
        policy=POLICY,
        pools=POOLS,
    )
    assert [(p.job, p.for_job) for p in plan.preempt] == [("borrow", "d")]
    assert "project vision (pool dgx) needs its guarantee" in plan.preempt[0].reason
    # with a project-wide guarantee of 4 the same job is a borrower (2 used + 2 = 4 is fine,
    # but place it over 4): nothing is reclaimed for a 3rd and 4th job beyond the whole guarantee
    flat = {"vision": Project("vision", 2000, pools=("dgx", "workstations")), "lab": Project("lab", 0)}
    plan = schedule(
        state,
        flat,
        [Job("d", "vision", Request(2), submitted=5)],
        running,
        now=100,
        policy=POLICY,
        pools=POOLS,
    )
    assert plan.preempt == []


def test_a_pool_whose_guarantee_is_used_up_borrows_and_never_reclaims() -> None:
    state = ClusterState(mixed())
    projects = {"vision": VISION, "lab": Project("lab", 0)}
    running = [
        run(state, "d1", "vision", "dgx0", [0, 1]),
        run(state, "w", "vision", "ws0", [0, 1]),
        run(state, "borrow", "lab", "dgx0", [2, 3, 4, 5, 6, 7]),
    ]
    # within its pools' guarantees vision uses 4 of 4: a further job borrows the free A2000s
    plan = schedule(
        state,
        projects,
        [Job("x", "vision", Request(2), submitted=5)],
        running,
        now=100,
        policy=POLICY,
        pools=POOLS,
    )
    assert plan.preempt == [] and [a.placement.node for a in plan.admit] == ["ws1"]
    # and the project's limit (6) caps its pools together
    running.append(run(state, "x", "vision", "ws1", [0, 1]))
    plan = schedule(
        state,
        projects,
        [Job("y", "vision", Request(1), submitted=6)],
        running,
        now=100,
        policy=POLICY,
        pools=POOLS,
    )
    assert plan.admit == [] and plan.preempt == []


def test_a_borrower_in_one_pool_is_reclaimed_by_another_project_but_in_quota_work_is_not() -> None:
    """lab's guarantee is 8 on the DGX; vision runs 2 in-quota and 4 borrowed there: only the
    borrowed ones are preempted for lab, the youngest first."""
    state = ClusterState(mixed())
    projects = {"vision": VISION, "lab": Project("lab", 6000, pools=("dgx",))}
    running = [
        run(state, "in", "vision", "dgx0", [0, 1], started=0),
        run(state, "b1", "vision", "dgx0", [2, 3], started=10),
        run(state, "b2", "vision", "dgx0", [4, 5], started=20),
    ]
    plan = schedule(
        state,
        projects,
        [Job("l", "lab", Request(4), submitted=30)],
        running,
        now=100,
        policy=POLICY,
        pools=POOLS,
    )
    assert sorted(p.job for p in plan.preempt) == ["b2"] or sorted(p.job for p in plan.preempt) == [
        "b1",
        "b2",
    ]
    assert "in" not in {p.job for p in plan.preempt}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    g_dgx=st.integers(1, 8),
    g_ws=st.integers(0, 4),
    ws_used=st.integers(0, 4),
    borrowers=st.lists(st.integers(1, 4), min_size=1, max_size=6),
    size=st.integers(1, 8),
    dgx_nodes=st.integers(1, 2),
)
def test_property_a_job_within_its_pools_guarantee_starts_there_within_two_cycles(
    g_dgx: int, g_ws: int, ws_used: int, borrowers: list[int], size: int, dgx_nodes: int
) -> None:
    """Whatever another project borrows on the DGXs, and whatever vision runs on the
    workstations, a vision job that fits its DGX guarantee gets it back: the first cycle
    preempts only borrowers on the DGXs (never vision's own work, never a workstation), the
    second starts it on a DGX."""
    size = min(size, g_dgx)
    ws_used = min(ws_used, 4)
    projects = {
        "vision": Project(
            "vision",
            (g_dgx + g_ws) * 1000,
            pools=("dgx", "workstations"),
            pool_guarantees=(("dgx", g_dgx * 1000), ("workstations", g_ws * 1000)),
        ),
        "lab": Project("lab", 0),
    }
    state = ClusterState(mixed(dgx_nodes))
    running: list[Job] = []
    for k in range(ws_used):
        running.append(run(state, f"w{k}", "vision", f"ws{k // 2}", [k % 2]))
    slot = 0
    for k, b in enumerate(borrowers):  # lab fills the DGXs from the first GPU on
        node, first = divmod(slot, 8)
        if node >= dgx_nodes or first + b > 8:
            break
        running.append(run(state, f"b{k}", "lab", f"dgx{node}", list(range(first, first + b)), started=k))
        slot += b
    want = Job("want", "vision", Request(size), submitted=50)
    plan = schedule(state, projects, [want], running, now=1000, policy=POLICY, pools=POOLS)
    victims = {p.job for p in plan.preempt}
    assert victims <= {j.id for j in running if j.project == "lab"}
    if plan.admit:
        assert plan.admit[0].placement.node.startswith("dgx")
        return
    assert victims, "neither started nor room made for a job within its DGX guarantee"
    after = state.copy()
    rest = [j for j in running if j.id not in victims]
    for j in running:
        if j.id in victims:
            after.release(j.placement)
    plan = schedule(after, projects, [want], rest, now=1010, policy=POLICY, pools=POOLS)
    assert [a.job for a in plan.admit] == ["want"] and plan.admit[0].placement.node.startswith("dgx")


def config(projects: dict) -> Config:
    c = Config()
    c.TrainPool.node_pools = {"dgx": {"models": ["H100"]}, "workstations": {"models": ["A2000"]}}
    c.TrainPool.projects = projects
    return c


def test_the_config_takes_a_guarantee_per_pool_and_refuses_what_cannot_be_meant() -> None:
    from gpupool.train.config import TrainPool

    tp = TrainPool(config=config({"vision": {"guarantee": {"workstations": 2, "dgx": "4"}, "limit": 8}}))
    vision = tp.project_table()["vision"]
    assert vision.guarantee_milli == 6000 and vision.pools == ("workstations", "dgx")
    assert vision.pool_guarantees == (("workstations", 2000), ("dgx", 4000))
    tp.pool_table()  # the pools exist
    # a pools list orders the guarantees, and may add pools without one (borrowing only)
    tp = TrainPool(config=config({"v": {"guarantee": {"workstations": 1}, "pools": ["dgx", "workstations"]}}))
    assert tp.project_table()["v"].pool_guarantees == (("workstations", 1000),)
    bad = {
        "guarantee per pool is a dict of 1 to 16": {"guarantee": {}},
        r"guarantee\['dgx'\]: not a GPU amount": {"guarantee": {"dgx": "lots"}},
        r"guarantee\['dgx'\] must be >= 0": {"guarantee": {"dgx": -1}},
        r"guarantee\['dgx'\]: more GPUs than any pool has": {"guarantee": {"dgx": "1e999999m"}},
        r"guarantee names pools \['dgx'\] that are not in its pools": {
            "guarantee": {"dgx": 1},
            "pools": ["workstations"],
        },
        "the guarantee is the sum of its pools' guarantees": {
            "guarantee": {"dgx": 4, "workstations": 2},
            "limit": 5,
        },
    }
    for message, spec in bad.items():
        with pytest.raises(TraitError, match=message):
            TrainPool(config=config({"v": spec})).project_table()
    with pytest.raises(TraitError, match=r"pools \['cloud'\] are not in TrainPool.node_pools"):
        TrainPool(config=config({"v": {"guarantee": {"cloud": 1}}})).pool_table()
    with pytest.raises(TraitError, match="guarantee per pool is a dict"):
        TrainPool(config=config({"v": {"guarantee": {f"p{i}": 1 for i in range(17)}}})).project_table()


HUB_CONFIG = """
c.GPUPool.use_nvml = False
c.GPUPool.virtual_gpus = 4
c.TrainPool.tick_s = 0.3
c.TrainPool.grace_s = 1
c.TrainPool.train_gpus = [0, 1, 2, 3]
c.TrainPool.node_pools = {"ws": {"gpus": [0, 1]}, "dgx": {"gpus": [2, 3]}}
c.TrainPool.projects = {"vision": {"guarantee": {"dgx": 1, "ws": 1}, "limit": 4},
                        "lab": {"guarantee": 0, "limit": 4, "pools": ["dgx"]}}
"""


@pytest.mark.hub
def test_a_real_hub_gives_each_pools_guarantee_back_and_shows_it(tmp_path) -> None:
    """lab borrows both DGX GPUs; vision runs a 2-GPU job on the workstations (its guarantee
    there and one borrowed GPU: as much as its whole guarantee), then a job within its DGX
    guarantee: lab's youngest job is preempted for it (the reason names the pool; with one
    project-wide guarantee vision would only borrow), and api/projects (what %%train --help
    prints) shows the guarantee and use per pool."""

    from gpupool.widgets.magics import projects_text
    from tests.conftest import require_chp
    from tests.hubtools import Hub
    from tests.support.wait import until

    require_chp()
    hub = Hub(state=tmp_path, extra_config=HUB_CONFIG, env={"GPUPOOL_CULLER": "0"}).start()
    J = "/services/gpupool/api/jobs"
    try:
        ann, bob = hub.user_token("ann"), hub.user_token("bob")
        sleep = ["sleep", "600"]
        lab = [
            hub.api("POST", J, {"project": "lab", "gpus": 1, "name": f"lab{i}", "command": sleep}, token=bob)[
                "id"
            ]
            for i in range(2)
        ]

        def state(job_id: str, token: str) -> dict:
            return hub.api("GET", f"{J}/{job_id}", token=token)

        until(
            lambda: all(state(j, bob)["state"] == "running" for j in lab),
            "lab borrows the DGX",
            detail=hub.tail,
        )
        ws = hub.api(
            "POST",
            J,
            {"project": "vision", "gpus": 2, "name": "ws", "command": sleep, "pools": ["ws"]},
            token=ann,
        )["id"]
        until(lambda: state(ws, ann)["state"] == "running", "vision's workstation job", detail=hub.tail)
        assert state(ws, ann)["gpu"][0]["gpus"] == [0, 1], state(ws, ann)
        dgx = hub.api(
            "POST", J, {"project": "vision", "gpus": 1, "name": "dgx", "command": sleep}, token=ann
        )["id"]
        until(
            lambda: state(dgx, ann)["state"] == "running",
            "vision's DGX guarantee comes back",
            detail=hub.tail,
        )
        assert state(dgx, ann)["gpu"][0]["gpus"] in ([2], [3])
        preempted = [state(j, bob) for j in lab if state(j, bob)["preemptions"]]
        assert len(preempted) == 1 and "vision (pool dgx)" in preempted[0]["preemption"], preempted
        projects = hub.api("GET", "/services/gpupool/api/projects", token=ann)["projects"]
        vision = next(p for p in projects if p["name"] == "vision")
        assert vision["guarantee_milli"] == 2000 and vision["pools"] == ["dgx", "ws"]
        assert vision["pool_guarantees"] == [
            {"pool": "dgx", "guarantee_milli": 1000, "used_milli": 1000},
            {"pool": "ws", "guarantee_milli": 1000, "used_milli": 2000},
        ]
        assert "2 GPUs guaranteed (dgx 1, ws 1)" in projects_text(projects)
    finally:
        hub.stop()


def test_a_job_pinned_to_a_spot_is_seen_through_that_spots_pool() -> None:
    """A job pinned to the workstations (say, by a reservation) that is within both pools'
    guarantees goes to its workstation part, where its spot is, not to the DGX it prefers."""
    state = ClusterState(mixed())
    projects = {"vision": VISION}
    spot = state.placement_on(state.inventory.index_of("ws1"), Request(2), [0, 1])
    plan = schedule(
        state,
        projects,
        [Job("p", "vision", Request(2), submitted=0, placement=spot)],
        [],
        now=10,
        policy=POLICY,
        pools=POOLS,
    )
    assert [(a.job, a.placement.node) for a in plan.admit] == [("p", "ws1")]


def _per_pool_machine():
    """The second-level state machine (tests/test_train_second_level.py) with project "a"
    guaranteed 3 GPUs on the DGX and 1 on the workstations: whatever is submitted, finished and
    scheduled, nothing is over-allocated, a job runs only on its pools, and no job within its
    pool's guarantee is stopped whole for another project."""
    from gpupool.pool.pool_quotas import split_by_pool
    from gpupool.pool.training import in_quota_split
    from tests.test_train_second_level import POOLS as SL_POOLS
    from tests.test_train_second_level import PROJECTS as SL_PROJECTS
    from tests.test_train_second_level import SecondLevel

    class PerPool(SecondLevel):
        PROJECTS = {
            **SL_PROJECTS,
            "a": Project("a", 4000, pools=("dgx", "ws"), pool_guarantees=(("dgx", 3000), ("ws", 1000))),
        }

        def over_quota(self) -> set[str]:
            parts, _, running, _ = split_by_pool(
                self.PROJECTS, SL_POOLS, self.state.inventory, [], list(self.running.values())
            )
            return in_quota_split(parts, running)[1]

    PerPool.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
    return PerPool.TestCase


TestPerPoolSecondLevel = _per_pool_machine()


def test_the_wait_reason_names_the_pool_whose_guarantee_the_job_gets_back(tmp_path) -> None:
    """lab borrows both DGX GPUs; vision's queued job is within its DGX guarantee, and its
    owner is told so (with one project-wide guarantee the sentence would say vision's whole)."""

    from gpupool.pool import BuildLimits
    from gpupool.train.waiting import explain
    from tests.support.pools import make_training, run_until

    svc = make_training(
        tmp_path,
        4,
        limits=BuildLimits(1000, (1000,), 1000, 2),
        placement=POLICY,
        node_pools={"ws": {"gpus": [0, 1]}, "dgx": {"gpus": [2, 3]}},
        projects={"vision": {"guarantee": {"dgx": 1, "ws": 1}}, "lab": {"guarantee": 0, "pools": ["dgx"]}},
        grace_s=1,
    )
    lab = [
        svc.submit(job_request(owner="bob", project="lab", name=f"l{i}", command=["sleep", "600"]), now=i).id
        for i in range(2)
    ]
    svc.tick(now=10)
    assert all(svc.job(j).state == "running" for j in lab)
    want = svc.submit(job_request(owner="ann", project="vision", name="v", command=["sleep", "600"]), now=11)
    try:
        assert explain(svc, svc.job(want.id)) == (
            "waiting: no node has a free GPU; within its guarantee, project"
            " vision (pool dgx) gets GPUs back from jobs running beyond theirs"
        )
    finally:
        for j in [*lab, want.id]:
            svc.cancel(j, now=20)
        run_until(
            svc,
            lambda: all(svc.job(j).state in ("cancelled", "failed", "succeeded") for j in [*lab, want.id]),
            "the cancelled jobs to end",
            now=30,
        )


def test_a_pool_by_label_is_refused_on_one_machine(tmp_path) -> None:
    """{} is a pool of labelled nodes on Kubernetes; on one machine it would be every GPU."""
    from gpupool.pool import BuildLimits
    from tests.support.pools import make_training

    with pytest.raises(
        ValueError, match=r"TrainPool.node_pools \['ws'\]: on one machine a pool needs models"
    ):
        make_training(
            tmp_path,
            4,
            limits=BuildLimits(1000, (1000,), 1000, 2),
            placement=POLICY,
            node_pools={"ws": {}, "dgx": {"gpus": [2, 3]}},
        )
