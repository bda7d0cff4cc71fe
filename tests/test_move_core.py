"""The move action (gpupool.pool.actions.move) and the kernel side of a move
(gpupool.gpu.moving): examples, then properties over random pools (hypothesis).

Properties: no GPU is over-allocated at any instant of a plan's moves, whatever the order of
their phases; the plan has the fewest moves (against a brute force); a move never loses a
kernel unless both restores fail, and a cell started during a move waits at most what is left
of the park plus the restore, then runs.
"""

from __future__ import annotations

import itertools
import random

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from gpupool.gpu.moving import move_processes, recover
from gpupool.gpu.parking import ParkingError
from gpupool.pool import GPU, ClusterState, Inventory, Node, Request, get_policy
from gpupool.pool.actions.move import PHASES, Movable, MoveRules, apply_phase, plan_moves, why_not
from gpupool.pool.request import Placement

NOW = 1_000_000.0
RULES = MoveRules(rest_s=600, per_hour=2, max_moves=8)


def pool(*gpus_per_node: int, model: str = "A100") -> ClusterState:
    nodes = tuple(
        Node(f"n{i}", tuple(GPU(g, f"GPU-{i}-{g}", model, 40960) for g in range(k)))
        for i, k in enumerate(gpus_per_node)
    )
    return ClusterState(Inventory(nodes))


def place(
    state: ClusterState, node: int, gpu: int, milli: int, name: str, idle: bool = True, **kw
) -> Movable:
    p = Placement(f"n{node}", (gpu,), milli)
    state.apply(p)
    return Movable(name, p, "A100", idle, **kw)


def fixed(state: ClusterState, node: int, gpu: int, milli: int) -> None:
    """Something that never moves (a train job, a busy notebook not offered)."""
    state.apply(Placement(f"n{node}", (gpu,), milli))


def plan(state, head, ws, rules=RULES, policy="best-fit"):
    return plan_moves(state, head, ws, NOW, rules, get_policy(policy), random.Random(0))


# --- examples -------------------------------------------------------------------------
def test_a_gang_job_gets_a_whole_node_by_moving_the_idle_notebooks_off_it() -> None:
    state = pool(4, 4)
    ws = [place(state, 0, g, 500, f"nb{g}") for g in range(2)]  # node 0: two notebooks
    ws += [place(state, 1, g, 500, f"nc{g}") for g in range(3)]  # node 1: three
    head = Request(4)
    assert get_policy("best-fit").choose(state, head, random.Random(0)) is None
    p = plan(state, head, ws)
    assert p.target.node == "n0" and p.target.gpus == (0, 1, 2, 3)
    assert sorted(s.id for s in p.steps) == ["nb0", "nb1"]  # the node with the fewest to move
    assert all(s.dest.node == "n1" for s in p.steps)
    run_phases(state, p, order=None)  # ...after which the gang fits on node 0


def test_busy_recently_parked_and_often_moved_notebooks_stay() -> None:
    state = pool(2)
    busy = place(state, 0, 0, 500, "busy", idle=False)
    fixed(state, 0, 1, 500)  # a whole GPU is free only if "busy" joins this one
    assert plan(state, Request(1), [busy]) is None
    assert why_not(busy, NOW, RULES) == "its GPU is busy (or its use is not known)"
    rested = Movable("r", busy.placement, "A100", True, rested_since=NOW - 30)
    assert plan(state, Request(1), [rested]) is None
    assert why_not(rested, NOW, RULES) == "its GPU was parked, restored or moved 30 s ago"
    hourly = Movable("h", busy.placement, "A100", True, moved_at=(NOW - 3000, NOW - 1000))
    assert why_not(hourly, NOW, RULES) == "it was moved 2 times in the last hour"
    assert plan(state, Request(1), [hourly]) is None
    old = Movable(
        "o", busy.placement, "A100", True, rested_since=NOW - 601, moved_at=(NOW - 3601, NOW - 1000)
    )
    p = plan(state, Request(1), [old])
    assert [(s.id, s.dest.gpus) for s in p.steps] == [("o", (1,))] and p.target.gpus == (0,)


def test_a_head_that_fits_needs_no_move_and_a_cap_on_moves_holds() -> None:
    state = pool(4)
    ws = [place(state, 0, g, 250, f"nb{g}") for g in range(3)]
    assert plan(state, Request(1), ws).steps == ()  # GPU 3 is free
    gang = Request(2)
    assert len(plan(state, gang, ws).steps) == 1  # one of them joins another's GPU
    assert plan(state, Request(4), ws, MoveRules(max_moves=2)) is None  # would need 3 moves
    assert plan(state, Request(4), ws) is None  # nowhere to go: all four GPUs are needed


def test_for_a_large_share_the_largest_notebook_leaves_its_gpu() -> None:
    state = pool(2)
    ws = [place(state, 0, 0, 250, "small"), place(state, 0, 0, 500, "large")]
    fixed(state, 0, 1, 500)
    p = plan(state, Request(1, 750), ws)  # 0.25 free on GPU 0: one move makes it 0.75
    assert [(s.id, s.dest.gpus) for s in p.steps] == [("large", (1,))] and p.target.gpus == (0,)


def test_a_resume_claim_of_another_model_only_moves_notebooks_within_that_model() -> None:
    nodes = (
        Node("v", tuple(GPU(g, f"V-{g}", "V100", 16384) for g in range(2))),
        Node("a", tuple(GPU(g, f"A-{g}", "A100", 40960) for g in range(2))),
    )
    state = ClusterState(Inventory(nodes))
    a0 = Placement("a", (0,), 600)
    state.apply(a0)
    state.apply(Placement("a", (1,), 400))
    state.apply(Placement("v", (0,), 900))
    ws = [Movable("x", a0, "A100", True)]
    claim = Request(1, 700, gpu_models=frozenset({"A100"}))  # a 0.7 A100 claim: 0.7 free only after a move
    p = plan(state, claim, ws, policy="frag-aware")
    assert [(s.dest.node, s.dest.gpus) for s in p.steps] == [("a", (1,))]
    assert (p.target.node, p.target.gpus) == ("a", (0,))


# --- the phases of a plan, in any order ---------------------------------------------------
def run_phases(state: ClusterState, p, order: list[int] | None) -> None:
    """Carry out every step's phases in the given interleaving (indices of steps, each taken
    len(PHASES) times); after every phase no GPU is above 1000 milli or below 0 free."""
    state = state.copy()
    todo = order if order is not None else [i for i in range(len(p.steps)) for _ in PHASES]
    done = [0] * len(p.steps)
    for i in todo:
        apply_phase(state, p.steps[i], PHASES[done[i]])
        done[i] += 1
        present = state.gpu_free[state.gpu_free != -1]
        assert present.min() >= 0 and present.max() <= 1000
    state.apply(p.target)


SHARES = st.sampled_from([250, 300, 500, 700, 1000])


@st.composite
def pools(draw):
    nodes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    state = pool(*nodes)
    ws: list[Movable] = []
    for i, count in enumerate(nodes):
        for g in range(count):
            for _ in range(draw(st.integers(0, 3))):
                milli = draw(SHARES)
                if state.gpu_free[i, g] < milli:
                    break
                if draw(st.booleans()):
                    ws.append(
                        place(
                            state,
                            i,
                            g,
                            milli,
                            f"w{len(ws)}",
                            idle=draw(st.booleans()),
                            memory_mib=draw(st.integers(0, 8192)),
                        )
                    )
                else:
                    fixed(state, i, g, milli)
    head = draw(
        st.one_of(
            st.builds(Request, st.integers(1, 4)),
            st.builds(lambda m: Request(1, m), st.sampled_from([250, 500, 750])),
        )
    )
    return state, ws, head


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pools(), st.randoms(use_true_random=False))
def test_no_gpu_is_over_allocated_at_any_instant_of_a_plan(case, rnd) -> None:
    state, ws, head = case
    p = plan(state, head, ws)
    if p is None:
        return
    by_id = {w.id: w for w in ws}
    assert len(p.steps) <= RULES.max_moves and len({s.id for s in p.steps}) == len(p.steps)
    for s in p.steps:
        w = by_id[s.id]
        assert w.idle and s.source == w.placement  # only idle workspaces, from where they are
        assert s.dest.gpu_milli == s.source.gpu_milli and len(s.dest.gpus) == len(s.source.gpus)
        assert not (s.dest.node == p.target.node and set(s.dest.gpus) & set(p.target.gpus))
        assert s.source.node == p.target.node and set(s.source.gpus) & set(p.target.gpus)
    order = [i for i in range(len(p.steps)) for _ in PHASES]
    rnd.shuffle(order)  # any interleaving: the k-th occurrence of i is step i's k-th phase
    run_phases(state, p, order)


def fewest_by_brute_force(state: ClusterState, head: Request, ws: list[Movable]) -> int | None:
    """The least number of idle workspaces whose removal lets `head` fit (destinations are
    plentiful in the cases this is used for)."""
    idle = [w for w in ws if w.idle]
    policy, rng = get_policy("first-fit"), random.Random(0)
    for n in range(len(idle) + 1):
        for off in itertools.combinations(idle, n):
            trial = state.copy()
            for w in off:
                trial.release(w.placement)
            if policy.choose(trial, head, rng) is not None:
                return n
    return None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pools())
def test_the_plan_has_the_fewest_moves(case) -> None:
    state, ws, head = case
    # a spare node whose GPUs are half taken by something fixed: room for any moved notebook of
    # up to half a GPU (two per GPU at 250), never for the head of a whole GPU or more
    n = len(state.inventory.nodes)
    spare = Node(f"n{n}", tuple(GPU(g, f"GPU-{n}-{g}", "A100", 40960) for g in range(8)))
    bigger = ClusterState(Inventory((*state.inventory.nodes, spare)))
    for row, node in enumerate(state.inventory.nodes):
        for g in range(len(node.gpus)):
            used = 1000 - int(state.gpu_free[row, g])
            if used:
                bigger.gpu_free[row, g] -= used
    for g in range(8):
        fixed(bigger, n, g, 500)
    small = [w for w in ws if w.milli <= 500]
    big_idle = [w for w in ws if w.milli > 500 and w.idle]
    ws = small + [Movable(w.id, w.placement, w.model, False) for w in big_idle]  # these stay put
    if head.is_sharing and head.gpu_milli <= 500:
        head = Request(1)
    p = plan(bigger, head, ws)
    best = fewest_by_brute_force(bigger, head, ws)
    if best is None or best > RULES.max_moves:
        assert p is None
    else:
        assert p is not None and len(p.steps) == best, (best, p)


# --- the kernel side: a fake driver with a clock and injected failures ------------------
class FakeDriver:
    """The driver's state machine over virtual time: checkpoint and restore take per-GiB time;
    `fail` names calls that fail ("lock", "restore-dest", "restore-source", "recheckpoint")."""

    name = "fake"

    def __init__(self, pids: list[int], gib: float, fail: set[str]) -> None:
        self.states = {p: "running" for p in pids}
        self.where = {p: "A" for p in pids}
        self.t, self.gib, self.fail = 0.0, gib, fail
        self.timeline: list[tuple[float, int, str]] = []  # (time, pid, state) after each call
        self.restored = 0

    def _to(self, pid: int, state: str) -> None:
        self.states[pid] = state
        self.timeline.append((self.t, pid, state))

    def state(self, pid: int) -> str:
        return self.states[pid]

    def lock(self, pid: int, timeout_ms: int) -> None:
        if "lock" in self.fail and pid == max(self.states):
            self.t += timeout_ms / 1000
            raise ParkingError(f"lock of process {pid} failed: CUDA_ERROR_TIMEOUT")
        self.t += 0.001
        self._to(pid, "locked")

    def checkpoint(self, pid: int) -> None:
        if self.where[pid] == "B" and "recheckpoint" in self.fail:
            raise ParkingError("checkpoint failed: CUDA_ERROR_UNKNOWN")
        self.t += 0.37 + 0.58 * self.gib
        self._to(pid, "checkpointed")

    def restore(self, pid: int, gpu_map=None) -> None:
        self.t += 0.21 + 0.19 * self.gib
        target = "B" if gpu_map else "A"
        if target == "B" and "restore-dest" in self.fail and pid == max(self.states):
            raise ParkingError(f"restore of process {pid} failed: CUDA_ERROR_INVALID_DEVICE")
        if target == "A" and "restore-source" in self.fail:
            raise ParkingError(f"restore of process {pid} failed: CUDA_ERROR_ECC_UNCORRECTABLE")
        self.where[pid] = target
        self._to(pid, "locked")

    def unlock(self, pid: int) -> None:
        self.t += 0.001
        self._to(pid, "running")


def blocked_until(driver: FakeDriver, pid: int, t: float) -> float:
    """When a cell's CUDA call, made at `t`, goes on: the driver holds it while the process is
    locked or checkpointed, and lets it go at the unlock."""
    state = "running"
    for when, p, s in driver.timeline:
        if p != pid:
            continue
        if when <= t:
            state = s
        elif state != "running" and s == "running":
            return when
        elif state == "running":
            state = s
    return t if state == "running" else float("inf")


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 3),
    st.floats(0.0, 20.0),
    st.sets(st.sampled_from(["lock", "restore-dest", "restore-source", "recheckpoint"])),
    st.floats(0.0, 1.0),
)
def test_a_move_never_loses_a_kernel_and_a_cell_waits_at_most_the_rest_of_the_move(
    n, gib, fail, when
) -> None:
    pids = list(range(100, 100 + n))
    driver = FakeDriver(pids, gib, fail)
    phases: list[str] = []
    out = move_processes(driver, pids, {"GPU-A": "GPU-B"}, 2000, lambda ph, ps: phases.append(ph))
    if "lock" in fail:
        expected = "lost" if n > 1 and "restore-source" in fail else "aborted"
    elif "restore-dest" in fail:
        lost = (n > 1 and "recheckpoint" in fail) or "restore-source" in fail
        expected = "lost" if lost else "returned"
    else:
        expected = "moved"
    assert out.result == expected, (out, fail, n)
    if expected == "lost":  # only when the way back failed too, and it says why
        assert out.reason.count("failed") >= 2 or "could not park" in out.reason
        return
    assert all(s == "running" for s in driver.states.values())  # the kernel runs...
    where = {driver.where[p] for p in pids}
    assert where == ({"B"} if expected == "moved" else {"A"})  # ...all of it on one GPU
    if expected == "aborted":
        return
    assert phases == (["parked", "restored"] if expected == "moved" else ["parked", "returning", "returned"])
    # a cell started at any instant of the move goes on when its process is unlocked: after
    # what was left of the parking and the restores (nothing else waits in between)
    restore, checkpoint = 0.21 + 0.19 * gib, 0.37 + 0.58 * gib
    parked_by = max(
        t for t, p, s in driver.timeline if s == "checkpointed" and t <= first(driver, "locked", 1)
    )
    after = (
        n * (restore + 0.001)
        if expected == "moved"
        else n * restore + (n - 1) * checkpoint + n * (restore + 0.001)
    )
    assert driver.t - parked_by <= after + 1e-9
    pid = pids[0]
    first_lock = next(t for t, p, s in driver.timeline if p == pid and s == "locked")
    start = first_lock + when * (driver.t - first_lock)
    assert blocked_until(driver, pid, start) - start <= max(0.0, parked_by - start) + after + 1e-9


def first(driver: FakeDriver, state: str, after_checkpoints: int) -> float:
    """When the first process went to `state` after the parking (the first restore)."""
    seen = 0
    for t, _, s in driver.timeline:
        if s == "checkpointed":
            seen += 1
        elif s == state and seen >= len(driver.states) * after_checkpoints:
            return t
    return driver.t


@pytest.mark.parametrize("phase", ["reserved", "parked", "returning", "restored"])
def test_recovery_after_a_crash_leaves_every_process_running_on_one_gpu(phase: str) -> None:
    pids = [7, 8]
    driver = FakeDriver(pids, 1.0, set())
    # the state the hub could have died in, for each last phase persisted
    if phase == "reserved":  # parking had begun: one locked, one checkpointed
        driver.lock(7, 10)
        driver.lock(8, 10)
        driver.checkpoint(8)
    elif phase == "parked":  # one already restored onto B (locked), one still checkpointed
        for p in pids:
            driver.lock(p, 10)
            driver.checkpoint(p)
        driver.restore(7, {"GPU-A": "GPU-B"})
    elif phase == "returning":  # on the way back: one restored on A, one not yet
        for p in pids:
            driver.lock(p, 10)
            driver.checkpoint(p)
        driver.restore(7, None)
    else:  # restored onto B, one not unlocked yet
        for p in pids:
            driver.lock(p, 10)
            driver.checkpoint(p)
            driver.restore(p, {"GPU-A": "GPU-B"})
        driver.unlock(7)
    out = recover(driver, pids, phase, {"GPU-A": "GPU-B"})
    assert all(s == "running" for s in driver.states.values())
    expected = {
        "reserved": ("aborted", "A"),
        "parked": ("moved", "B"),
        "returning": ("returned", "A"),
        "restored": ("moved", "B"),
    }[phase]
    assert (out.result, *{driver.where[p] for p in pids}) == expected
