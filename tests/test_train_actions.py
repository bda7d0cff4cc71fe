"""Each train scheduling action alone (gpupool.pool.actions), on a Cycle built by hand."""

from __future__ import annotations

import random
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.pool import ClusterState, Request, get_policy, virtual_inventory
from gpupool.pool.actions import Cycle, allocate, consolidate, reclaim, reclaimable, victim_key
from gpupool.pool.inventory import GPU, Inventory, Node
from gpupool.pool.request import Placement
from gpupool.pool.training import Job, Project, in_quota_split, schedule
from tests.support.jobs import job_request

POLICY = get_policy("best-fit")


def nodes(n: int, gpus: int = 2) -> Inventory:
    return Inventory(
        nodes=tuple(
            Node(f"n{i}", tuple(GPU(g, f"n{i}g{g}", "T4", 16000, True) for g in range(gpus)))
            for i in range(n)
        )
    )


def run(
    state: ClusterState,
    jid: str,
    project: str,
    node: int,
    gpus: list[int],
    milli: int = 1000,
    started: float = 0,
    **kw,
) -> Job:
    req = Request.for_gpus(milli * len(gpus))
    placement = state.placement_on(node, req, gpus)
    state.apply(placement)
    return Job(jid, project, req, submitted=started, started=started, placement=placement, **kw)


def cycle(state: ClusterState, projects: dict, running: list[Job], now: float = 100, **kw) -> Cycle:
    return Cycle(state, projects, running, now, POLICY, random.Random(0), **kw)


# --- victims ------------------------------------------------------------------
def test_victims_lowest_priority_first_then_the_youngest_never_in_quota_or_too_young() -> None:
    state = ClusterState(virtual_inventory(6))
    projects = {"own": Project("own", 1000), "lab": Project("lab", 0), "vip": Project("vip", 0, priority=5)}
    running = [
        run(state, "old", "lab", 0, [0], started=0),
        run(state, "young", "lab", 0, [1], started=50),
        run(state, "keen", "lab", 0, [2], started=60, priority=3),
        run(state, "boss", "vip", 0, [3], started=70),
        run(state, "fresh", "lab", 0, [4], started=95, min_runtime_s=3600),
        run(state, "mine", "own", 0, [5], started=0),
    ]
    c = cycle(state, projects, running)
    order = [j.id for j in reclaimable(running, c.over, projects, now=100)]
    assert order == ["young", "old", "keen", "boss"]  # not "mine" (in quota), not "fresh" (min runtime)
    assert [j.id for j in reclaimable(running, c.over, projects, 100, skip={"young"}, not_of="vip")] == [
        "old",
        "keen",
    ]
    assert sorted(running, key=victim_key(projects))[0].id == "fresh"  # the order alone ignores eligibility


# --- allocate -----------------------------------------------------------------
def test_allocate_admits_in_queue_order_and_hands_only_in_quota_jobs_to_make_room() -> None:
    state = ClusterState(virtual_inventory(1))
    projects = {"own": Project("own", 1000), "lab": Project("lab", 0)}
    c = cycle(state, projects, [run(state, "busy", "lab", 0, [0])])
    asked: list[str] = []
    pending = [
        Job("borrow", "lab", Request.for_gpus(1000), submitted=1),
        Job("mine", "own", Request.for_gpus(1000), submitted=2),
    ]
    allocate(c, pending, make_room=lambda job: asked.append(job.id) or False)
    assert asked == ["mine"] and c.plan.admit == []
    assert [j.id for j in c.blocked] == ["mine"] and c.owed == {"own"}


def test_allocate_keeps_a_pinned_spot_and_respects_limits() -> None:
    state = ClusterState(nodes(2))
    projects = {"p": Project("p", 4000, limit_milli=2000)}
    spot = Placement("n1", (1,), 1000)
    c = cycle(state, projects, [])
    pending = [
        Job("pinned", "p", Request.for_gpus(1000), submitted=0, placement=spot),
        Job("big", "p", Request.for_gpus(2000), submitted=1),
    ]
    allocate(c, pending, make_room=lambda job: False)
    assert [(a.job, a.placement) for a in c.plan.admit] == [("pinned", spot)]  # "big" would pass the limit
    assert c.usage == {"p": 1000}


# --- reclaim ------------------------------------------------------------------
def test_reclaim_preempts_the_fewest_victims_and_holds_the_spot() -> None:
    state = ClusterState(nodes(2))
    projects = {"own": Project("own", 2000), "lab": Project("lab", 0)}
    running = [
        run(state, "a", "lab", 0, [0], started=1),
        run(state, "b", "lab", 1, [0], started=2),
        run(state, "c", "lab", 1, [1], started=3),
    ]
    c = cycle(state, projects, running)
    want = Job("mine", "own", Request.for_gpus(2000), submitted=5)
    assert reclaim(c, want)
    # a alone empties n0: one victim and 99 GPU-s lost, where b and c (n1) would lose 195
    # (before: the youngest first, c then b, two runs stopped)
    assert [p.job for p in c.plan.preempt] == ["a"] and c.preempted == {"a"}
    assert c.usage["own"] == 2000
    assert c.work.node_gpu_free(0) == [0, 0]  # held while a stops


def test_a_reclaim_stops_the_1_gpu_job_not_the_2_gpu_job_started_in_the_same_tick() -> None:
    """The walkthrough's build-first reclaim: two borrowers started together, a 2-GPU and a
    1-GPU job, and one GPU is needed. Before, the 2-GPU job was stopped (victim order only), a
    GPU sat idle and the 2-GPU job waited for "2 free GPUs"."""
    state = ClusterState(nodes(1, gpus=3))
    projects = {"own": Project("own", 1000), "lab": Project("lab", 0)}
    running = [run(state, "a2", "lab", 0, [0, 1], started=10), run(state, "b1", "lab", 0, [2], started=10)]
    c = cycle(state, projects, running)
    assert reclaim(c, Job("mine", "own", Request.for_gpus(1000), submitted=50))
    assert [p.job for p in c.plan.preempt] == ["b1"]  # the 1-GPU job, whatever the ids


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 4), st.integers(0, 100), st.integers(0, 1)), min_size=1, max_size=7),
    st.integers(1, 12),
)
def test_victims_are_the_fewest_gpu_seconds_lost_that_free_what_is_needed(jobs, need) -> None:
    """Any set of over-quota runs (GPUs, start, priority) and any number of GPUs needed: the
    victims free enough, touch a higher priority only when the lower cannot free enough, and
    no other sufficient set within those priorities loses fewer GPU-seconds (brute force)."""
    import itertools

    from gpupool.pool.actions.victims import cheapest_victims, lost_gpu_s

    now = 100.0
    cands = [
        Job(f"j{i}", "lab", Request.for_gpus(g * 1000), submitted=0, started=float(t), priority=p)
        for i, (g, t, p) in enumerate(jobs)
    ]

    def frees(vs) -> bool:
        return sum(v.milli for v in vs) >= need * 1000

    got = cheapest_victims(cands, frees, now, tier=lambda j: j.priority)
    if not frees(cands):
        assert got is None
        return
    assert got is not None and frees(got)
    low = [j for j in cands if j.priority == 0]
    pool = low if frees(low) else cands
    assert all(j in pool for j in got)  # the higher priority only when needed
    best = min(
        sum(lost_gpu_s(j, now) for j in s)
        for r in range(1, len(pool) + 1)
        for s in itertools.combinations(pool, r)
        if frees(s)
    )
    assert sum(lost_gpu_s(j, now) for j in got) == best
    # ties: no equally cheap sufficient set has run for less time since its checkpoints
    run_s = sum(now - j.started for j in got)
    assert all(
        sum(now - j.started for j in s) >= run_s
        for r in range(1, len(pool) + 1)
        for s in itertools.combinations(pool, r)
        if frees(s) and sum(lost_gpu_s(j, now) for j in s) == best
    )


def test_reclaim_waits_for_gpus_already_being_freed() -> None:
    state = ClusterState(nodes(1))
    projects = {"own": Project("own", 1000), "lab": Project("lab", 0)}
    stopping = run(state, "going", "lab", 0, [0], started=1)
    busy = run(state, "busy", "lab", 0, [1], started=2)
    c = cycle(state, projects, [busy], stopping=[stopping])
    assert reclaim(c, Job("mine", "own", Request.for_gpus(1000), submitted=5))
    assert c.plan.preempt == []  # "busy" keeps running


def test_reclaim_gives_up_when_only_in_quota_work_is_in_the_way() -> None:
    state = ClusterState(nodes(1))
    projects = {"own": Project("own", 1000), "lab": Project("lab", 2000)}
    c = cycle(state, projects, [run(state, "x", "lab", 0, [0]), run(state, "y", "lab", 0, [1])])
    assert not reclaim(c, Job("mine", "own", Request.for_gpus(1000), submitted=5))
    assert c.plan.preempt == [] and c.usage.get("own", 0) == 0


# --- consolidate --------------------------------------------------------------
def test_consolidate_moves_a_job_so_that_a_blocked_gang_fits() -> None:
    state = ClusterState(nodes(2))
    projects = {"p": Project("p", 4000)}
    running = [run(state, "r0", "p", 0, [0]), run(state, "r1", "p", 1, [0])]
    c = cycle(state, projects, running)
    c.blocked.append(Job("big", "p", Request.for_gpus(2000), submitted=5))
    consolidate(c)
    assert len(c.plan.move) == 1 and c.plan.preempt == []
    move = c.plan.move[0]
    assert move.for_job == "big" and move.target.gpus == (0, 1) and move.to.node != move.target.node


# --- the hub's "make room for a build workspace" uses the same victims --------
def test_a_build_workspace_stops_the_same_victim_a_reclaim_would(tmp_path) -> None:

    from gpupool.alloc.manager import Workload
    from tests.support.pools import make_training

    svc = make_training(tmp_path, 2, placement=POLICY, projects={"lab": {"guarantee": 0}})
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    try:
        kept = svc.submit(
            job_request(owner="ann", project="lab", name="kept", command=sleeper, priority=5), now=0
        ).id
        svc.tick(now=10)
        low = svc.submit(
            job_request(owner="ann", project="lab", name="low", command=sleeper, priority=0), now=0
        ).id
        svc.tick(now=20)
        assert svc.job(kept).state == svc.job(low).state == "running"
        running = [svc.scheduler_job(r) for r in svc.jobs(state="running")]
        _, over = in_quota_split(svc.projects, running)
        assert reclaimable(running, over, svc.projects, now=30)[0].id == low  # lower priority, older run
        assert svc.make_room_for_build(Workload("build", "bob", ""), Request.for_gpus(1000), now=30)
        assert svc.job(low).state == "preempting" and svc.job(kept).state == "running"
    finally:
        for row in svc.jobs():
            if row.pid:
                svc.runner.preempt(row.pid, 0)


# --- preempt (priorities inside a project) -----------------------------------------
def test_preempt_stops_the_projects_own_lowest_priority_job_for_a_higher_one() -> None:
    state = ClusterState(nodes(1))
    projects = {"p": Project("p", 2000), "q": Project("q", 0)}
    running = [
        run(state, "low", "p", 0, [0], started=50, priority=-5),
        run(state, "mid", "p", 0, [1], started=60, priority=0),
    ]
    pending = [
        Job("urgent", "p", Request.for_gpus(1000), submitted=70, priority=10),
        Job("other", "q", Request.for_gpus(1000), submitted=1),
    ]
    plan = schedule(state, projects, pending, running, now=100, policy=POLICY)
    assert [(p.job, p.for_job) for p in plan.preempt] == [("low", "urgent")] and plan.admit == []
    # an equal priority never preempts
    same = Job("same", "p", Request.for_gpus(1000), submitted=70, priority=-5)
    assert schedule(state, projects, [same], running, now=100, policy=POLICY).preempt == []
    # nor a job beyond the guarantee counting the work of its priority or higher ("mid" at 20)
    projects["p"] = Project("p", 1000)
    above = [running[0], Job(**{**running[1].__dict__, "priority": 20})]
    assert schedule(state, projects, [pending[0]], above, now=100, policy=POLICY).preempt == []


def test_preempt_waits_for_its_own_victims_and_respects_min_runtime() -> None:
    state = ClusterState(nodes(1))
    projects = {"p": Project("p", 1000)}  # "low" fills it; at priority 10 nothing does
    going = run(state, "going", "p", 0, [0], started=10)  # preempted last cycle, in its grace period
    low = run(state, "low", "p", 0, [1], started=20)
    urgent = Job("urgent", "p", Request.for_gpus(1000), submitted=70, priority=10)
    plan = schedule(state, projects, [urgent], [low], now=100, policy=POLICY, stopping=[going])
    assert plan.preempt == [] and plan.admit == []  # GPU 0 is on its way: "low" keeps running
    young = Job(**{**low.__dict__, "min_runtime_s": 3600})
    state.release(going.placement)
    state.apply(Placement("n0", (0,), 1000))  # GPU 0 taken by another young low job
    other = Job(**{**young.__dict__, "id": "young2", "placement": Placement("n0", (0,), 1000)})
    assert schedule(state, projects, [urgent], [young, other], now=100, policy=POLICY).preempt == []
    # the priorities decide who is over quota: the high one fills the guarantee first
    assert in_quota_split(projects, [low, Job("hi", "p", Request.for_gpus(1000), 0, priority=5, started=99)])[
        1
    ] == {"low"}
