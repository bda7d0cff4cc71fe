"""The second level together, as a state machine (hypothesis): node pools, priorities,
reservations and elastic jobs in one pool, each cycle's plan carried out. Whatever happens,
nothing is over-allocated, a job only runs on GPUs of its pools and within its size range,
and another project's in-quota job is never stopped whole."""

from __future__ import annotations

import random

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from gpupool.pool import ClusterState, Request, get_policy
from gpupool.pool.inventory import GPU, Inventory, Node
from gpupool.pool.pools import NodePool
from gpupool.pool.training import Job, Project, in_quota_split, schedule

POOLS = {
    "ws": NodePool("ws", models=frozenset({"A2000"})),
    "dgx": NodePool("dgx", models=frozenset({"H100"})),
}
PROJECTS = {
    "a": Project("a", 4000, pools=("dgx", "ws")),
    "b": Project("b", 2000, pools=("ws",)),
    "c": Project("c", 0, limit_milli=6000),
}


def cluster() -> Inventory:
    ws = tuple(
        Node(f"ws{i}", tuple(GPU(g, f"ws{i}g{g}", "A2000", 12000, True) for g in range(2))) for i in range(2)
    )
    return Inventory(nodes=(*ws, Node("dgx", tuple(GPU(g, f"dg{g}", "H100", 80000, True) for g in range(4)))))


class SecondLevel(RuleBasedStateMachine):
    PROJECTS = PROJECTS

    def over_quota(self) -> set[str]:
        return in_quota_split(self.PROJECTS, self.running.values())[1]

    @initialize()
    def setup(self) -> None:
        self.state = ClusterState(cluster())
        self.pending: dict[str, Job] = {}
        self.running: dict[str, Job] = {}
        self.now, self.n = 0.0, 0
        self.bad: list[str] = []

    @rule(
        project=st.sampled_from(sorted(PROJECTS)),
        gpus=st.sampled_from([1, 2, 4]),
        priority=st.sampled_from([0, 0, 10]),
        elastic=st.booleans(),
    )
    def submit(self, project: str, gpus: int, priority: int, elastic: bool) -> None:
        self.n += 1
        jid = f"j{self.n}"
        if elastic and gpus > 1:
            self.pending[jid] = Job(jid, project, Request(1), self.now, priority, min_gpus=1, max_gpus=gpus)
        else:
            self.pending[jid] = Job(jid, project, Request(gpus), self.now, priority)

    @rule(data=st.data())
    def finish(self, data) -> None:
        if self.running:
            job = self.running.pop(data.draw(st.sampled_from(sorted(self.running))))
            self.state.release(job.placement)

    @rule()
    def cycle(self) -> None:
        self.now += 600
        over = self.over_quota()
        plan = schedule(
            self.state,
            self.PROJECTS,
            list(self.pending.values()),
            list(self.running.values()),
            self.now,
            get_policy("best-fit"),
            random.Random(1),
            reserve_after_s=1200,
            pools=POOLS,
        )
        for a in plan.admit:
            job = self.pending.pop(a.job)
            self.state.apply(a.placement)  # raises on any over-allocation
            k = len(a.placement.gpus)
            if job.elastic and not job.min_gpus <= k <= job.max_gpus:
                self.bad.append(f"{job.id} runs on {k} GPUs")
            for g in a.placement.gpus:
                model = self.state.inventory.node(a.placement.node).gpus[g].model
                if not any(
                    POOLS[p].has(a.placement.node, g, model)
                    for p in self.PROJECTS[job.project].pools or POOLS
                ):
                    self.bad.append(f"{job.id} of {job.project} on {a.placement.node} GPU {g}")
            request = Request(k) if job.elastic else job.request
            self.running[job.id] = Job(
                **{**job.__dict__, "request": request, "started": self.now, "placement": a.placement}
            )
        for p in plan.preempt:
            victim, by = self.running[p.job], self.pending.get(p.for_job)
            # an in-quota job is stopped whole only for its own project's higher priority
            if p.job not in over and not (
                by and by.project == victim.project and by.priority > victim.priority
            ):
                self.bad.append(f"in-quota {p.job} preempted for {p.for_job}")
        stops = (
            [(p.job, None) for p in plan.preempt]
            + [(m.job, m.to) for m in plan.move]
            + [(z.job, z.to) for z in plan.resize]
        )
        for job_id, pin in stops:
            job = self.running.pop(job_id)
            self.state.release(job.placement)
            request = Request(job.min_gpus) if job.elastic else job.request
            self.pending[job_id] = Job(
                **{**job.__dict__, "request": request, "started": None, "placement": pin}
            )
        for m in plan.move:
            if m.for_job in self.pending:
                self.pending[m.for_job] = Job(**{**self.pending[m.for_job].__dict__, "placement": m.target})
        for r in plan.reserve:
            self.pending[r.job] = Job(**{**self.pending[r.job].__dict__, "placement": r.placement})

    @invariant()
    def nothing_bad_happened(self) -> None:
        assert not self.bad, self.bad
        present = self.state.gpu_free[self.state.gpu_free != -1]  # -1: a slot the node lacks
        assert ((present >= 0) & (present <= 1000)).all()


SecondLevel.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
TestSecondLevel = SecondLevel.TestCase
