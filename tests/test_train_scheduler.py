"""The pure train scheduler, cycle by cycle with time as an argument (hypothesis)."""

from __future__ import annotations

import random

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from gpupool.pool import ClusterState, Request, get_policy, virtual_inventory
from gpupool.pool.inventory import GPU, Inventory, Node
from gpupool.pool.training import Department, Job, Project, in_quota_split, schedule

PROJECTS = {
    "a": Project("a", guarantee_milli=2000, weight=2.0),
    "b": Project("b", guarantee_milli=1000, weight=1.0),
    "c": Project("c", guarantee_milli=0, weight=1.0, limit_milli=2000),
}


def cluster() -> Inventory:
    return Inventory(
        nodes=tuple(
            Node(f"n{i}", tuple(GPU(g, f"n{i}g{g}", "T4", 16000, True) for g in range(2))) for i in range(2)
        )
    )


class TrainMachine(RuleBasedStateMachine):
    """Jobs arrive and finish; each cycle's plan is carried out; invariants after each."""

    @initialize()
    def setup(self) -> None:
        self.state = ClusterState(cluster())
        self.pending: dict[str, Job] = {}
        self.running: dict[str, Job] = {}
        self.now = 0.0
        self.n = 0
        self.preempted_in_quota = False
        self.waited: dict[str, int] = {}

    @rule(project=st.sampled_from(sorted(PROJECTS)), gpus=st.sampled_from([250, 500, 1000, 2000]))
    def submit(self, project: str, gpus: int) -> None:
        self.n += 1
        req = Request.for_gpus(gpus)
        self.pending[f"j{self.n}"] = Job(f"j{self.n}", project, req, submitted=self.now)

    @rule(data=st.data())
    def finish(self, data) -> None:
        if self.running:
            job = self.running.pop(data.draw(st.sampled_from(sorted(self.running))))
            self.state.release(job.placement)

    @rule()
    def cycle(self) -> None:
        self.now += 10
        _, over = in_quota_split(PROJECTS, self.running.values())
        plan = schedule(
            self.state,
            PROJECTS,
            list(self.pending.values()),
            list(self.running.values()),
            self.now,
            get_policy("best-fit"),
            random.Random(1),
        )
        for a in plan.admit:
            job = self.pending.pop(a.job)
            # raises on any over-allocation, including onto GPUs whose preempted jobs still run
            self.state.apply(a.placement)
            self.running[job.id] = Job(
                job.id, job.project, job.request, job.submitted, started=self.now, placement=a.placement
            )
        for p in plan.preempt:
            if p.job not in over:
                self.preempted_in_quota = True
            job = self.running.pop(p.job)
            self.state.release(job.placement)  # stopped by the next cycle
            # requeued with its original submit time
            self.pending[job.id] = Job(job.id, job.project, job.request, job.submitted)
        for m in plan.move:  # consolidation: stop, then both jobs are pinned to their planned spots
            job = self.running.pop(m.job)
            self.state.release(job.placement)
            self.pending[job.id] = Job(job.id, job.project, job.request, job.submitted, placement=m.to)
            blocked = self.pending[m.for_job]
            self.pending[m.for_job] = Job(
                blocked.id, blocked.project, blocked.request, blocked.submitted, placement=m.target
            )
        usage, _ = in_quota_split(PROJECTS, self.running.values())
        for job in self.pending.values():
            # a job that fits its project's guarantee, and could fit the cluster at all
            fits = usage.get(job.project, 0) + job.milli <= PROJECTS[job.project].guarantee_milli
            self.waited[job.id] = self.waited.get(job.id, 0) + 1 if fits else 0

    @invariant()
    def never_over_allocated(self) -> None:
        assert ((self.state.gpu_free >= 0) & (self.state.gpu_free <= 1000)).all()

    @invariant()
    def in_quota_jobs_are_never_preempted(self) -> None:
        assert not self.preempted_in_quota

    @invariant()
    def limits_hold(self) -> None:
        usage, _ = in_quota_split(PROJECTS, self.running.values())
        assert usage.get("c", 0) <= 2000

    @invariant()
    def in_quota_demand_is_served_within_two_cycles(self) -> None:
        # one cycle to preempt borrowers, the next to start on the freed GPUs
        assert all(w <= 2 for w in self.waited.values()), self.waited


TrainMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestTrainScheduler = TrainMachine.TestCase


def test_idle_gpus_are_lent_in_proportion_to_weight() -> None:
    state = ClusterState(virtual_inventory(6))
    projects = {"heavy": Project("heavy", 0, weight=2.0), "light": Project("light", 0, weight=1.0)}
    pending = [Job(f"{p}{i}", p, Request.for_gpus(1000), submitted=i) for i in range(6) for p in projects]
    plan = schedule(state, projects, pending, [], 0.0, get_policy("best-fit"))
    admitted = [a.job for a in plan.admit]
    assert len(admitted) == 6
    assert sum(j.startswith("heavy") for j in admitted) == 4  # 2:1 of the six idle GPUs


def test_reclaim_takes_the_youngest_lowest_priority_borrower_and_respects_min_runtime() -> None:
    state = ClusterState(virtual_inventory(2))
    projects = {"own": Project("own", 1000), "lab": Project("lab", 0)}
    policy = get_policy("best-fit")
    running = []
    for i, (started, prio, min_rt) in enumerate([(0, 0, 0), (50, 0, 0)]):
        placement = policy.choose(state, Request.for_gpus(1000), random.Random(0))
        state.apply(placement)
        running.append(
            Job(
                f"lab{i}",
                "lab",
                Request.for_gpus(1000),
                submitted=started,
                priority=prio,
                started=started,
                placement=placement,
                min_runtime_s=min_rt,
            )
        )
    want = Job("mine", "own", Request.for_gpus(1000), submitted=60)
    plan = schedule(state, projects, [want], running, now=100, policy=policy)
    assert [p.job for p in plan.preempt] == ["lab1"]  # the youngest borrower
    young_protected = [running[0], Job(**{**running[1].__dict__, "min_runtime_s": 3600})]
    plan = schedule(state, projects, [want], young_protected, now=100, policy=policy)
    assert [p.job for p in plan.preempt] == ["lab0"]  # the young one is within its min runtime


def test_nobody_is_admitted_onto_gpus_whose_jobs_are_being_preempted() -> None:
    state = ClusterState(virtual_inventory(2))
    projects = {"own": Project("own", 500), "lab": Project("lab", 0)}
    policy = get_policy("best-fit")
    running = []
    for i in range(2):
        placement = policy.choose(state, Request.for_gpus(1000), random.Random(0))
        state.apply(placement)
        running.append(
            Job(f"lab{i}", "lab", Request.for_gpus(1000), submitted=i, started=i, placement=placement)
        )
    pending = [
        Job("mine", "own", Request.for_gpus(500), submitted=5),
        Job("more", "lab", Request.for_gpus(500), submitted=6),
    ]
    plan = schedule(state, projects, pending, running, now=100, policy=policy)
    assert [p.job for p in plan.preempt] == ["lab1"]
    assert plan.admit == []  # lab1 still holds its GPU during its grace period
    for a in plan.admit:
        state.apply(a.placement)


def two_gpu_nodes(n: int) -> Inventory:
    return Inventory(
        nodes=tuple(
            Node(f"n{i}", tuple(GPU(g, f"n{i}g{g}", "T4", 16000, True) for g in range(2))) for i in range(n)
        )
    )


def test_the_free_half_of_a_reclaimed_node_waits_for_the_job_it_was_reclaimed_for() -> None:
    """A 2-GPU in-quota job needs node n0: one GPU free, one held by a borrower. The borrower
    is preempted and the free GPU must not go to another borrower meanwhile — else next cycle
    the job is short again and another job is preempted (churn, lost work)."""
    state = ClusterState(two_gpu_nodes(2))
    projects = {"own": Project("own", 2000), "lab": Project("lab", 0)}
    policy = get_policy("best-fit")
    running = []
    for i, (node, gpu, started) in enumerate([("n0", 0, 9), ("n1", 0, 0), ("n1", 1, 1)]):
        placement = state.placement_on(state.inventory.index_of(node), Request.for_gpus(1000), [gpu])
        state.apply(placement)
        running.append(
            Job(
                f"lab{i}",
                "lab",
                Request.for_gpus(1000),
                submitted=started,
                started=started,
                placement=placement,
            )
        )
    pending = [
        Job("mine", "own", Request.for_gpus(2000), submitted=5),
        Job("borrow", "lab", Request.for_gpus(1000), submitted=1),
    ]
    plan = schedule(state, projects, pending, running, now=100, policy=policy)
    assert [(p.job, p.for_job) for p in plan.preempt] == [("lab0", "mine")]
    assert plan.admit == []  # without the hold, "borrow" takes n0's free GPU


def test_a_project_waiting_for_its_guarantee_does_not_borrow_meanwhile() -> None:
    """Had "extra" borrowed n1's free GPU now, it would count toward the guarantee before
    "mine" next cycle, push "mine" over it, and the node reclaimed for "mine" would be lost."""
    state = ClusterState(two_gpu_nodes(2))
    projects = {"own": Project("own", 3000), "lab": Project("lab", 0)}
    policy = get_policy("best-fit")
    running = []
    for i in range(2):  # the lab borrows all of n0
        placement = state.placement_on(0, Request.for_gpus(1000), [i])
        state.apply(placement)
        running.append(
            Job(f"lab{i}", "lab", Request.for_gpus(1000), submitted=i, started=i, placement=placement)
        )
    placement = state.placement_on(1, Request.for_gpus(1000), [0])
    state.apply(placement)
    running.append(Job("own0", "own", Request.for_gpus(1000), submitted=0, started=0, placement=placement))
    pending = [
        Job("mine", "own", Request.for_gpus(2000), submitted=5),  # 1 + 2 <= 3: in quota
        Job("extra", "own", Request.for_gpus(1000), submitted=6),
    ]  # then 3 + 1 > 3: borrows
    plan = schedule(state, projects, pending, running, now=100, policy=policy)
    assert sorted(p.job for p in plan.preempt) == ["lab0", "lab1"]
    assert plan.admit == []
    # once the lab's jobs have stopped, "mine" comes first and "extra" may borrow n1's GPU
    for job in running[:2]:
        state.release(job.placement)
    plan = schedule(state, projects, pending, running[2:], now=200, policy=policy)
    assert sorted(a.job for a in plan.admit) == ["extra", "mine"]


def test_consolidation_moves_a_job_when_only_fragmentation_blocks_another() -> None:
    inv = Inventory(
        nodes=tuple(
            Node(f"n{i}", tuple(GPU(g, f"n{i}g{g}", "T4", 16000, True) for g in range(2))) for i in range(2)
        )
    )
    state = ClusterState(inv)
    projects = {"p": Project("p", 4000)}  # the blocked job is within its guarantee
    policy = get_policy("best-fit")
    running = []
    for i, node in enumerate(("n0", "n1")):
        from gpupool.pool.request import Placement

        placement = Placement(node, (0,), 1000)
        state.apply(placement)
        running.append(Job(f"r{i}", "p", Request.for_gpus(1000), submitted=i, started=0, placement=placement))
    big = Job("big", "p", Request.for_gpus(2000), submitted=5)
    plan = schedule(state, projects, [big], running, now=100, policy=policy)
    assert plan.admit == [] and len(plan.move) == 1
    move = plan.move[0]
    assert move.for_job == "big" and move.to.node != move.target.node
    # carry it out: the moved job stops, both are pinned, and the next cycle starts both
    moved = next(r for r in running if r.id == move.job)
    state.release(moved.placement)
    still = [r for r in running if r.id != move.job]
    pending = [
        Job(big.id, "p", big.request, big.submitted, placement=move.target),
        Job(moved.id, "p", moved.request, moved.submitted, placement=move.to),
    ]
    plan = schedule(state, projects, pending, still, now=200, policy=policy)
    assert {a.job: a.placement for a in plan.admit} == {"big": move.target, moved.id: move.to}
    for a in plan.admit:
        state.apply(a.placement)


def test_no_consolidation_of_jobs_within_their_min_runtime() -> None:
    from gpupool.pool.request import Placement

    state = ClusterState(
        Inventory(
            nodes=tuple(
                Node(f"n{i}", tuple(GPU(g, f"n{i}g{g}", "T4", 16000, True) for g in range(2)))
                for i in range(2)
            )
        )
    )
    running = []
    for i, node in enumerate(("n0", "n1")):
        placement = Placement(node, (0,), 1000)
        state.apply(placement)
        running.append(
            Job(
                f"r{i}",
                "p",
                Request.for_gpus(1000),
                submitted=i,
                started=50,
                placement=placement,
                min_runtime_s=3600,
            )
        )
    plan = schedule(
        state,
        {"p": Project("p", 4000)},
        [Job("big", "p", Request.for_gpus(2000), submitted=5)],
        running,
        now=100,
        policy=get_policy("best-fit"),
    )
    assert plan.move == [] and plan.admit == []


def test_a_department_limit_caps_what_its_projects_borrow_together() -> None:
    state = ClusterState(two_gpu_nodes(4))  # 8 idle GPUs
    projects = {
        "vision": Project("vision", 1000, department="research"),
        "nlp": Project("nlp", 1000, department="research"),
        "other": Project("other", 0),
    }
    departments = {"research": Department("research", 2000, limit_milli=5000)}
    pending = [
        Job(f"{p}{i}", p, Request.for_gpus(1000), submitted=i) for p in ("vision", "nlp") for i in range(4)
    ]
    pending.append(Job("o", "other", Request.for_gpus(1000), submitted=9))
    plan = schedule(
        state, projects, pending, [], now=0, policy=get_policy("best-fit"), departments=departments
    )
    admitted = [a.job for a in plan.admit]
    assert sum(j.startswith(("vision", "nlp")) for j in admitted) == 5  # the department's limit
    assert "o" in admitted and {"vision0", "nlp0"} <= set(admitted)  # guarantees first, others still borrow
    without = schedule(state, projects, pending, [], now=0, policy=get_policy("best-fit"))
    assert len(without.admit) == 8


def test_department_config_is_checked_against_its_projects() -> None:
    from traitlets import TraitError
    from traitlets.config import Config

    from gpupool.train.config import TrainPool

    c = Config()
    c.TrainPool.projects = {
        "vision": {"guarantee": 2, "department": "research"},
        "nlp": {"guarantee": 2, "department": "research"},
    }
    c.TrainPool.departments = {"research": {"guarantee": 3, "limit": 6}}
    with pytest.raises(TraitError, match="add up to 4 GPUs, more than its guarantee of 3"):
        TrainPool(config=c).department_table()
    c.TrainPool.departments = {"science": {"guarantee": 8}}
    with pytest.raises(TraitError, match="department 'research' is not in TrainPool.departments"):
        TrainPool(config=c).department_table()
    c.TrainPool.departments = {"research": {"guarantee": 4, "limit": 6}}
    assert TrainPool(config=c).department_table()["research"].limit_milli == 6000


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=30, max_size=30), st.integers(0, 5))
def test_a_low_weight_project_is_not_starved_by_a_flooding_one(durations, arrives) -> None:
    """A project with weight 10 keeps the pool full of 1-GPU jobs that last 1-3 cycles; a
    project with weight 0.1 submits one job. It starts as soon as a GPU frees: having borrowed
    nothing, it is first among the borrowers, however small its weight."""
    state = ClusterState(virtual_inventory(4))
    projects = {"flood": Project("flood", 0, weight=10.0), "small": Project("small", 0, weight=0.1)}
    policy = get_policy("best-fit")
    running: dict[str, tuple[Job, int]] = {}  # job, cycle it ends
    pending: dict[str, Job] = {}
    started_at = None
    for cycle in range(30):
        for jid, (job, end) in list(running.items()):
            if end <= cycle:
                state.release(job.placement)
                del running[jid]
        for k in range(4):  # the flood never runs dry
            pending[f"f{cycle}-{k}"] = Job(f"f{cycle}-{k}", "flood", Request.for_gpus(1000), submitted=cycle)
        if cycle == arrives:
            pending["s"] = Job("s", "small", Request.for_gpus(1000), submitted=cycle)
        plan = schedule(
            state, projects, list(pending.values()), [j for j, _ in running.values()], cycle, policy
        )
        for a in plan.admit:
            job = pending.pop(a.job)
            state.apply(a.placement)
            running[a.job] = (
                Job(job.id, job.project, job.request, job.submitted, started=cycle, placement=a.placement),
                cycle + durations[cycle],
            )
            if a.job == "s":
                started_at = cycle
    assert started_at is not None and started_at - arrives <= 3


def test_a_guarantee_blocked_by_shares_gets_a_preemption_and_a_move_together() -> None:
    """Found by the state machine: project a (guarantee 2) holds 1 GPU in quarter and half
    shares spread over both nodes; it asks for a whole GPU. No GPU can be emptied by
    preempting borrowers alone, nor by moving alone — but preempting c's half share and moving
    a's own half share to the other node's free room frees n0's GPU 0."""
    state = ClusterState(cluster())
    running = {}
    for jid, project, milli, node, gpu in [
        ("j1", "a", 500, 0, 0),
        ("j2", "c", 500, 0, 0),
        ("j4", "b", 1000, 0, 1),
        ("j5", "b", 500, 1, 0),
        ("j3", "c", 250, 1, 0),
        ("j6", "a", 250, 1, 0),
        ("j7", "a", 250, 1, 1),
    ]:
        placement = state.placement_on(node, Request.for_gpus(milli), [gpu])
        state.apply(placement)
        running[jid] = Job(
            jid, project, Request.for_gpus(milli), submitted=0, started=int(jid[1:]), placement=placement
        )
    want = Job("j8", "a", Request.for_gpus(1000), submitted=5)
    plan = schedule(state, PROJECTS, [want], list(running.values()), now=100, policy=get_policy("best-fit"))
    assert [(p.job, p.for_job) for p in plan.preempt] == [("j2", "j8")]  # c borrows: preempted
    assert [(m.job, m.to.node, m.target.node, m.target.gpus) for m in plan.move] == [("j1", "n1", "n0", (0,))]
