"""Property tests of the pool core and its owner: any sequence of spawn, stop, failed
start and hub restart keeps every GPU at or under 1000 milli and every quota held."""

from __future__ import annotations

from pathlib import Path

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from gpupool.alloc.manager import PoolManager, Workload
from gpupool.pool import (
    BuildLimits,
    BuildQuotaPolicy,
    PoolError,
)
from tests.support.pools import make_pool

USERS = ["ann", "ben", "cat", "dan"]
GROUPS = {"ann": ["students"], "ben": ["students"], "cat": ["research"], "dan": []}
SIZES = (100, 250, 500, 1000, 2000)
POLICY = BuildQuotaPolicy(
    default=BuildLimits(
        quota_milli=1000, sizes_milli=(100, 250, 500, 1000), max_per_workspace_milli=1000, max_workspaces=2
    ),
    group_overrides={
        "students": BuildLimits(
            quota_milli=250, sizes_milli=(100, 250), max_per_workspace_milli=250, max_workspaces=1
        ),
        "research": BuildLimits(
            quota_milli=2000, sizes_milli=(500, 1000, 2000), max_per_workspace_milli=2000, max_workspaces=2
        ),
    },
    group_totals_milli={"students": 300},
)


class PoolMachine(RuleBasedStateMachine):
    @initialize(tmp=st.just(None))
    def setup(self, tmp: None) -> None:
        import tempfile

        self.dir = Path(tempfile.mkdtemp())
        self.manager = self.new_manager()

    def new_manager(self) -> PoolManager:
        return make_pool(self.dir, 3, limits=POLICY)

    @rule(user=st.sampled_from(USERS), server=st.sampled_from(["", "a", "b"]), milli=st.sampled_from(SIZES))
    def spawn(self, user: str, server: str, milli: int) -> None:
        try:
            self.manager.reserve_build(user, GROUPS[user], server, milli)
        except PoolError:
            pass

    @rule(user=st.sampled_from(USERS), server=st.sampled_from(["", "a", "b"]))
    def stop(self, user: str, server: str) -> None:
        self.manager.release(Workload("build", user, server), reason="stopped")

    @rule(user=st.sampled_from(USERS), milli=st.sampled_from(SIZES))
    def failed_start(self, user: str, milli: int) -> None:
        try:
            self.manager.reserve_build(user, GROUPS[user], "flaky", milli)
        except PoolError:
            return
        self.manager.release(Workload("build", user, "flaky"), reason="start failed")

    @rule()
    def restart(self) -> None:
        before = [list(f) for f in self.manager.state.gpu_free]
        self.manager = self.new_manager()
        assert [list(f) for f in self.manager.state.gpu_free] == before

    @invariant()
    def gpus_never_over_allocated_and_match_the_database(self) -> None:
        used = [[0] * 3]
        for row in self.manager.store.allocations():
            for g in row.gpus:
                used[0][g] += row.gpu_milli
        assert all(0 <= u <= 1000 for u in used[0])
        assert [1000 - u for u in used[0]] == list(self.manager.state.gpu_free[0])

    @invariant()
    def quotas_hold(self) -> None:
        rows = self.manager.store.allocations()
        for user in USERS:
            limits = POLICY.limits_for(GROUPS[user])
            mine = [r for r in rows if r.owner == user]
            assert sum(r.total_milli for r in mine) <= limits.quota_milli
            assert len(mine) <= limits.max_workspaces
            assert len({(r.owner, r.name) for r in mine}) == len(mine)  # no doubled workspace
        students = sum(r.total_milli for r in rows if "students" in (r.groups or []))
        assert students <= 300


PoolMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestPool = PoolMachine.TestCase
