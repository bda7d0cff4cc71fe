"""The state one scheduling cycle shares between its actions (KAI-Scheduler's session).

The actions change only this: `work` (a copy of the pool on which admissions are tried), the
plan, and the cycle's accounting of who uses what. The real pool is never touched.
"""

from __future__ import annotations

import random

import numpy as np

from gpupool.pool.actions.reservation import Reservation
from gpupool.pool.jobs import Department, Job, Plan, Project, in_quota_split
from gpupool.pool.placement import Policy
from gpupool.pool.pools import OUTSIDE, NodePool
from gpupool.pool.state import ClusterState


class Cycle:
    def __init__(
        self,
        state: ClusterState,
        projects: dict[str, Project],
        running: list[Job],
        now: float,
        policy: Policy,
        rng: random.Random,
        stopping: list[Job] | None = None,
        departments: dict[str, Department] | None = None,
        pools: dict[str, NodePool] | None = None,
    ) -> None:
        self.work = state.copy()
        self.plan = Plan()
        self.projects = projects
        self.departments = departments or {}
        self.now, self.policy, self.rng = now, policy, rng
        self.usage, self.over = in_quota_split(projects, running)
        self.dept_usage: dict[str, int] = {}
        for j in running:
            d = projects[j.project].department
            self.dept_usage[d] = self.dept_usage.get(d, 0) + j.milli
        self.running = {j.id: j for j in running}
        self.stopping = stopping or []  # preempted earlier, still holding GPUs in their grace period
        self.preempted: set[str] = set()  # victims chosen in this cycle
        self.borrowed = {p: max(0, self.usage.get(p, 0) - projects[p].guarantee_milli) for p in projects}
        self.owed: set[str] = set()  # projects with an in-quota job waiting for GPUs
        self.blocked: list[Job] = []  # in-quota jobs neither free capacity nor reclaim could place
        self.reservations: dict[str, Reservation] = {}  # by job id (actions/reserve.py)
        self.counted: list[Job] = []  # admitted, or room on its way, in this cycle
        self.pools = pools or {}
        # a project's per-pool parts (pool/pool_quotas.py), by the project: its limit caps them together
        self.parts: dict[str, list[str]] = {}
        for p in projects.values():
            if p.parent:
                self.parts.setdefault(p.parent, []).append(p.name)
        self._masks: dict[tuple[str, ...], np.ndarray] = {}

    def view(self, job: Job, pool: str | None = None) -> ClusterState:
        """The pool as `job` may use it: `work`, with the free GPUs of every reservation it may
        not backfill held, and only the GPUs of its node pools (of `pool` alone, if given)."""
        return self.seen_by(self.work, job, pool)

    def seen_by(self, state: ClusterState, job: Job, pool: str | None = None) -> ClusterState:
        """`state` as `job` may use it (see `view`); `state` itself when nothing is hidden."""
        names = (pool,) if pool is not None else self.pools_of(job)
        if not self.reservations and not names:
            return state
        view = state.copy()
        in_quota = self.in_quota(job)
        for r in self.reservations.values():
            if not r.backfills(job, self.now, in_quota):
                view.hold(r.node, r.gpus)
        if names:
            view.gpu_free[~self._mask(names)] = OUTSIDE
            view.version[:] += 1  # policies cache per-node scores by version
        return view

    def pools_of(self, job: Job) -> tuple[str, ...]:
        """The node pools `job` may use, in order of preference: its own, else its project's."""
        return job.pools or self.projects[job.project].pools

    def _mask(self, names: tuple[str, ...]) -> np.ndarray:
        if names not in self._masks:
            width = self.work.gpu_free.shape[1]
            mask = np.zeros_like(self.work.gpu_free, dtype=bool)
            for n in names:
                if n in self.pools:  # an unknown pool has no GPUs
                    mask |= self.pools[n].mask(self.work.inventory, width)
            self._masks[names] = mask
        return self._masks[names]

    def in_quota_at_priority(self, job: Job) -> bool:
        """Would `job` be within its project's guarantee counting only the project's work of its
        priority or higher (running and not preempted, or admitted in this cycle)?"""
        used = sum(
            j.milli
            for j in (*self.running.values(), *self.counted)
            if j.project == job.project and j.priority >= job.priority and j.id not in self.preempted
        )
        return used + job.milli <= self.projects[job.project].guarantee_milli

    def in_quota(self, job: Job) -> bool:
        """Would `job` keep its project within its guarantee, counting what this cycle admitted?"""
        return self.usage.get(job.project, 0) + job.milli <= self.projects[job.project].guarantee_milli

    def rank(self, job: Job) -> tuple[object, ...]:
        """Queue order: in-quota first; among borrowers the least borrowed per weight; then
        project priority, job priority, age."""
        proj = self.projects[job.project]
        in_quota = self.in_quota(job)
        share = 0.0 if in_quota else self.borrowed.get(job.project, 0) / max(proj.weight, 1e-9)
        return (not in_quota, share, -proj.priority, -job.priority, job.submitted, job.id)

    def within_limits(self, job: Job) -> bool:
        """Under its project's limit and its department's limit."""
        proj = self.projects[job.project]
        used = (
            sum(self.usage.get(q, 0) for q in self.parts[proj.parent])
            if proj.parent
            else self.usage.get(job.project, 0)
        )
        if used + job.milli > proj.cap():
            return False
        dept = self.departments.get(proj.department)
        return dept is None or self.dept_usage.get(dept.name, 0) + job.milli <= dept.cap()

    def count(self, job: Job) -> None:
        """The job's GPUs count toward its project and department from now on in this cycle."""
        self.counted.append(job)
        self.usage[job.project] = self.usage.get(job.project, 0) + job.milli
        d = self.projects[job.project].department
        self.dept_usage[d] = self.dept_usage.get(d, 0) + job.milli
        self.borrowed[job.project] = max(
            0, self.usage[job.project] - self.projects[job.project].guarantee_milli
        )

    def can_stop(self, job: Job) -> bool:
        """Past its min runtime: it may be preempted or moved now."""
        return self.now - (job.started or self.now) >= job.min_runtime_s
