"""The hub's mover (gpupool.mover) on a real store and the virtual parking backend, without a
hub: a parked notebook's resume claim waits for a whole GPU; an idle notebook moves off it
(destination reserved first, kernel parked and restored with its GPU remapped, source
released), and the claim is granted. Failed restores go back to the source; a crash at every
phase is finished by the next hub's `recover`. The whole flow on a real hub: test_move_hub.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from gpupool import failpoints
from gpupool.gpu.parking import Delays, ParkingError, VirtualParking
from gpupool.manager import PoolManager, Workload
from gpupool.mover import GPUMover, MoverService
from gpupool.parking import ParkingService
from gpupool.pool import GPU, BuildLimits, BuildQuotaPolicy, ClusterState, Inventory, Node, get_policy
from gpupool.pool.request import Placement
from gpupool.store import Move, Store
from sqlalchemy import select

QUOTAS = BuildQuotaPolicy(default=BuildLimits(quota_milli=1000, sizes_milli=(500, 1000),
                                              max_per_workspace_milli=1000, max_workspaces=1))
INVENTORY = Inventory(nodes=(Node("n1", tuple(GPU(i, f"GPU-{i}", "A100", 40960, virtual=True) for i in range(2))),))
PIDS = {"ann": 101, "ben": 102, "cat": 103}  # each server's one kernel (>= 100: it has a CUDA context)
T0 = time.time()  # rows are stamped with the real time: the clock starts there


class Driver(VirtualParking):
    """The virtual backend, with restores that fail on demand: "dest" (onto another GPU) or
    "source" (back onto the GPU it was checkpointed on)."""

    fail: set[str] = set()

    def restore(self, pid, gpu_map=None):
        if ("dest" if gpu_map else "source") in self.fail:
            raise ParkingError(f"restore of process {pid} failed: CUDA_ERROR_INVALID_DEVICE")
        super().restore(pid, gpu_map)


class World:
    def __init__(self, tmp: Path, now: list[float]) -> None:
        self.tmp, self.now = tmp, now
        self.driver = Driver(tmp / "parking", has_context=lambda pid: pid >= 100, sleep=lambda s: None,
                             delays=Delays(0, 0))
        self.findings: dict = {"workspaces": {}}
        self.start()

    def start(self) -> None:
        """A (re)started hub: the pool from the database, the same driver state."""
        self.pool = PoolManager(INVENTORY, Store(f"sqlite:///{self.tmp}/pool.sqlite"), QUOTAS, get_policy("best-fit"))
        self.parking = ParkingService(self.pool, self.driver, pids_of=lambda pid: {pid},
                                      clock=lambda: self.now[0])
        cfg = GPUMover(enabled=True, head_wait_s=0, idle_after_s=120, rest_s=600)
        self.mover = MoverService(self.pool, self.parking, cfg, lambda: self.findings, clock=lambda: self.now[0])

    def place(self, owner: str, gpu: int, milli: int) -> None:
        w = Workload("build", owner, "")
        self.pool.reserve_at(w, Placement("n1", (gpu,), milli))
        self.pool.mark_running(w, PIDS[owner])

    def idle(self, owner: str, seconds: float) -> None:
        self.findings["workspaces"][f"{owner}/"] = {"owner": owner, "name": "", "gpu_data": True,
                                                    "gpu_idle_s": seconds, "memory_mib": 2048}

    def shares(self) -> list[tuple[str, str, tuple[int, ...], int]]:
        return sorted((a.kind, a.owner, tuple(a.gpus), a.gpu_milli) for a in self.pool.store.allocations())

    def moves(self) -> list[Move]:
        with self.pool.store.session() as s:
            return list(s.scalars(select(Move).order_by(Move.id)))


@pytest.fixture
def world(tmp_path, monkeypatch) -> World:
    monkeypatch.setattr(Driver, "fail", set())
    now = [T0]
    w = World(tmp_path, now)
    # cat held a whole GPU and parked it; ann and ben each hold half of one, on different GPUs
    w.place("cat", 0, 1000)
    w.parking.park("cat", "")
    w.place("ann", 0, 500)
    w.place("ben", 1, 500)
    now[0] += 3600  # long after their spawns: past the rest time
    w.parking.claim("cat", "")  # cat runs a cell: her claim waits for a whole GPU
    assert w.parking.status("cat", "")["state"] == "waiting"
    return w


def consistent(w: World) -> None:
    """The in-memory pool is what the rows say (a restart would rebuild the same), within 1000 milli."""
    rebuilt = ClusterState(INVENTORY)
    for a in w.pool.store.allocations():
        rebuilt.apply(Placement(a.node, tuple(a.gpus), a.gpu_milli))
    assert (rebuilt.gpu_free == w.pool.state.gpu_free).all()


def test_an_idle_notebook_moves_so_that_a_resume_claim_gets_its_whole_gpu(world: World) -> None:
    world.idle("ann", 60)  # not idle long enough yet
    assert world.mover.tick() is None
    world.idle("ann", 600)
    world.idle("ben", 10)  # ben is busy: never moved
    plan = world.mover.tick()
    assert [(s.id, s.source.gpus, s.dest.gpus) for s in plan.steps] == [("ann/", (0,), (1,))]
    assert world.shares() == [("build", "ann", (1,), 500), ("build", "ben", (1,), 500)]
    assert world.driver.state(101) == "running" and world.driver.remapped(101) == {"GPU-0": "GPU-1"}
    [move] = world.moves()
    assert (move.phase, move.why) == ("moved", "a notebook resuming its GPU")
    event = world.pool.store.events(kind="move")[0]
    assert event.message == "build ann/default moved from GPU 0 to GPU 1 to make room for a notebook resuming its GPU"
    world.parking.grant()  # GPU 0 is whole again: cat's claim is granted there
    assert world.parking.status("cat", "")["state"] == "running"
    assert ("build", "cat", (0,), 1000) in world.shares()
    consistent(world)
    # moved once: not again within the rest time, whatever waits
    assert world.mover.tick() is None


def test_a_failed_restore_returns_the_kernel_to_its_own_gpu(world: World) -> None:
    world.idle("ann", 600)
    Driver.fail = {"dest"}
    world.mover.tick()
    assert world.shares() == [("build", "ann", (0,), 500), ("build", "ben", (1,), 500)]  # destination released
    assert world.driver.state(101) == "running" and world.driver.remapped(101) == {}
    [move] = world.moves()
    assert move.phase == "returned" and "restore on the destination failed" in move.reason
    assert world.parking.status("ann", "")["state"] == "running"
    consistent(world)


def test_when_the_way_back_fails_too_the_kernel_is_reported_lost_with_the_reason(world: World) -> None:
    world.idle("ann", 600)
    Driver.fail = {"dest", "source"}
    world.mover.tick()
    [move] = world.moves()
    assert move.phase == "lost"
    assert "restore on the destination failed" in move.reason and "on its own GPU failed too" in move.reason
    status = world.parking.claim("ann", "")  # her next cell hears it once
    assert status["state"] == "failed" and "the kernel was lost while moving" in status["message"]
    assert world.parking.status("ann", "")["state"] == "running"
    assert world.shares()[0] == ("build", "ann", (0,), 500)  # the server keeps its GPU for a new kernel
    consistent(world)


class Crash(BaseException):  # the hub dies: nothing in it may catch this
    pass


@pytest.mark.parametrize("point", ["move.reserved", "move.parked", "move.restored", "move.returning"])
def test_a_hub_killed_at_each_phase_of_a_move_finishes_it_after_restart(world: World, monkeypatch, point) -> None:
    world.idle("ann", 600)
    if point == "move.returning":
        Driver.fail = {"dest"}

    def reach(name: str) -> None:
        if name == point:
            raise Crash(name)

    monkeypatch.setattr(failpoints, "reach", reach)
    with pytest.raises(Crash):
        world.mover.tick()
    monkeypatch.setattr(failpoints, "reach", lambda name: None)
    Driver.fail = set()
    world.start()  # a new hub process: the pool from the rows, the driver as the crash left it
    assert [a.kind for a in world.pool.store.allocations(owner="ann")] == ["build", "move"]  # both held
    assert world.mover.recover() == [f"ann/: {'moved' if point in ('move.parked', 'move.restored') else 'returned' if point == 'move.returning' else 'aborted'}"]
    [move] = world.moves()
    on = (1,) if move.phase == "moved" else (0,)
    assert [(a.kind, tuple(a.gpus)) for a in world.pool.store.allocations(owner="ann")] == [("build", on)]
    assert world.driver.state(101) == "running"
    assert world.driver.remapped(101) == ({"GPU-0": "GPU-1"} if on == (1,) else {})
    consistent(world)
    assert world.parking.status("ann", "")["state"] == "running"


def test_an_unexpected_error_mid_move_is_finished_from_its_phase(world: World, monkeypatch) -> None:
    world.idle("ann", 600)
    calls = []

    def flaky(pid, gpu_map=None):  # the first restore onto the destination breaks oddly, not as the driver refuses
        calls.append(gpu_map)
        if len(calls) == 1:
            raise OSError("the driver's library went away")
        VirtualParking.restore(world.driver, pid, gpu_map)

    monkeypatch.setattr(world.driver, "restore", flaky)
    world.mover.tick()
    [move] = world.moves()
    assert move.phase == "moved"  # parked already: finished forward, as after a crash
    assert world.shares() == [("build", "ann", (1,), 500), ("build", "ben", (1,), 500)]
    assert world.driver.state(101) == "running" and calls == [{"GPU-0": "GPU-1"}] * 2
    consistent(world)


def test_a_stale_culler_report_moves_nobody(world: World) -> None:
    world.idle("ann", 600)
    world.findings["pass_time"] = world.now[0] - 3600  # the culler stopped reporting an hour ago
    assert world.mover.tick() is None
    world.findings["pass_time"] = world.now[0] - 60
    assert world.mover.tick() is not None
