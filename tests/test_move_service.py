"""The hub's mover (gpupool.parking.mover) on a real store and the virtual parking backend, without a
hub: a parked notebook's resume claim waits for a whole GPU; an idle notebook moves off it
(destination reserved first, kernel parked and restored with its GPU remapped, source
released), and the claim is granted. Failed restores go back to the source; a crash at every
phase is finished by the next hub's `recover`. The whole flow on a real hub: test_move_hub.py."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from gpupool.alloc.hooks import ServiceHooks, Services
from gpupool.alloc.manager import Workload
from gpupool.gpu.env_files import GPUEnvFiles
from gpupool.gpu.parking import Delays, ParkingError, VirtualParking
from gpupool.hub import failpoints
from gpupool.parking.mover import GPUMover, MoverService
from gpupool.parking.service import ParkingService
from gpupool.pool import (
    GPU,
    BuildLimits,
    BuildQuotaPolicy,
    ClusterState,
    Inventory,
    NoCapacity,
    Node,
    Request,
)
from gpupool.pool.errors import RoomBeingFreed
from gpupool.pool.request import Placement
from gpupool.store import Move
from gpupool.vocab.culling import new_culler_state
from tests.support.pools import make_pool

QUOTAS = BuildQuotaPolicy(
    default=BuildLimits(
        quota_milli=1000, sizes_milli=(500, 1000), max_per_workspace_milli=1000, max_workspaces=1
    )
)
INVENTORY = Inventory(
    nodes=(Node("n1", tuple(GPU(i, f"GPU-{i}", "A100", 40960, virtual=True) for i in range(2))),)
)
PIDS = {"ann": 101, "ben": 102, "cat": 103}  # each server's one kernel (>= 100: it has a CUDA context)


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
        self.driver = Driver(
            tmp / "parking", has_context=lambda pid: pid >= 100, sleep=lambda s: None, delays=Delays(0, 0)
        )
        self.findings = new_culler_state()  # the culler's last pass, as the hub keeps it
        self.spawns_wait_for_moves = False  # spawn_world: the pool asks the mover, as the hub's does
        self.start()

    def start(self) -> None:
        """A (re)started hub: the pool from the database, the same driver state."""
        self.pool = make_pool(self.tmp, INVENTORY, limits=QUOTAS, hooks=ServiceHooks(self.services))
        self.parking = ParkingService(
            self.pool, self.driver, pids_of=lambda pid: {pid}, clock=lambda: self.now[0]
        )
        cfg = GPUMover(enabled=True, head_wait_s=0, idle_after_s=120, rest_s=600)
        self.mover = MoverService(
            self.pool, self.parking, cfg, lambda: self.findings, clock=lambda: self.now[0]
        )
        self.files = GPUEnvFiles(self.tmp / "gpu-env", self.pool)

    def services(self) -> Services:
        """What the pool asks, as the hub's root hands it (gpupool.wiring.root.GPUPoolHub.services)."""
        return Services(mover=self.mover if self.spawns_wait_for_moves else None, gpu_files=self.files)

    def gpu_for_new_processes(self, owner: str) -> str:
        """CUDA_VISIBLE_DEVICES as the hub publishes it for the workspace's next processes."""
        doc = self.files.current(owner, "")
        on_disk = json.loads(self.files.path(owner, "").read_text())
        assert on_disk == doc  # the file says what the rows say
        return doc["env"]["CUDA_VISIBLE_DEVICES"]

    def place(self, owner: str, gpu: int, milli: int) -> None:
        w = Workload("build", owner, "")
        self.pool.reserve_at(w, Placement("n1", (gpu,), milli))
        self.pool.mark_running(w, PIDS[owner])

    def idle(self, owner: str, seconds: float) -> None:
        self.findings["workspaces"][f"{owner}/"] = {
            "owner": owner,
            "name": "",
            "gpu_data": True,
            "gpu_idle_s": seconds,
            "memory_mib": 2048,
        }

    def shares(self) -> list[tuple[str, str, tuple[int, ...], int]]:
        return sorted((a.kind, a.owner, tuple(a.gpus), a.gpu_milli) for a in self.pool.store.allocations())

    def moves(self) -> list[Move]:
        with self.pool.store.session() as s:
            return list(s.scalars(select(Move).order_by(Move.id)))


@pytest.fixture
def world(tmp_path, monkeypatch) -> World:
    monkeypatch.setattr(Driver, "fail", set())
    now = [time.time()]  # rows are stamped with the real time: the clock starts there, at the test
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
    assert (
        event.message
        == "build ann/default moved from GPU 0 to GPU 1 to make room for a notebook resuming its GPU"
    )
    world.parking.grant()  # GPU 0 is whole again: cat's claim is granted there
    assert world.parking.status("cat", "")["state"] == "running"
    assert ("build", "cat", (0,), 1000) in world.shares()
    consistent(world)
    # moved once: not again within the rest time, whatever waits
    assert world.mover.tick() is None


def test_processes_started_during_and_after_a_move_use_the_gpu_the_kernel_goes_to(
    world: World, monkeypatch
) -> None:
    """From the moment the destination is held, a new kernel starts there (the source is let go
    at the end); after a failed restore, back on the source."""
    assert world.gpu_for_new_processes("ann") == "0"
    seen = {}
    monkeypatch.setattr(
        failpoints, "reach", lambda name: seen.setdefault(name, world.gpu_for_new_processes("ann"))
    )
    world.idle("ann", 600)
    world.mover.tick()
    assert seen == {"move.reserved": "1", "move.parked": "1", "move.restored": "1"}
    assert world.gpu_for_new_processes("ann") == "1"
    # cat's claim is granted on the GPU ann left
    world.parking.grant()
    assert world.gpu_for_new_processes("cat") == "0"


def test_a_failed_move_leaves_new_processes_on_the_source(world: World) -> None:
    world.idle("ann", 600)
    Driver.fail = {"dest"}
    world.mover.tick()
    assert world.moves()[0].phase == "returned"
    assert world.gpu_for_new_processes("ann") == "0"


def test_a_failed_restore_returns_the_kernel_to_its_own_gpu(world: World) -> None:
    world.idle("ann", 600)
    Driver.fail = {"dest"}
    world.mover.tick()
    assert world.shares() == [
        ("build", "ann", (0,), 500),
        ("build", "ben", (1,), 500),
    ]  # destination released
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
def test_a_hub_killed_at_each_phase_of_a_move_finishes_it_after_restart(
    world: World, monkeypatch, point
) -> None:
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
    assert world.mover.recover() == [
        f"ann/: {'moved' if point in ('move.parked', 'move.restored') else 'returned' if point == 'move.returning' else 'aborted'}"
    ]
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

    def flaky(
        pid, gpu_map=None
    ):  # the first restore onto the destination breaks oddly, not as the driver refuses
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


def test_on_the_hubs_loop_the_same_move_runs_off_the_loop_and_an_error_is_finished_alike(
    world: World, monkeypatch
) -> None:
    """The hub's path (a pass on its event loop) takes the steps of the one above: the driver's
    work runs off the loop, an error mid-move is finished from its phase, the pass ends."""
    world.idle("ann", 600)
    calls: list[tuple[dict | None, bool]] = []
    loop_thread = threading.get_ident()

    def flaky(pid, gpu_map=None):
        calls.append((gpu_map, threading.get_ident() == loop_thread))
        if len(calls) == 1:
            raise OSError("the driver's library went away")
        VirtualParking.restore(world.driver, pid, gpu_map)

    monkeypatch.setattr(world.driver, "restore", flaky)

    async def hub_pass() -> None:
        assert world.mover.tick() is not None and world.mover.busy
        await asyncio.gather(*world.mover._tasks)

    asyncio.run(hub_pass())
    assert not world.mover.busy
    [move] = world.moves()
    assert move.phase == "moved"
    assert world.shares() == [("build", "ann", (1,), 500), ("build", "ben", (1,), 500)]
    # the first restore off the loop (an executor thread); the finishing one from the loop, as before
    assert calls == [({"GPU-0": "GPU-1"}, False), ({"GPU-0": "GPU-1"}, True)]
    world.parking.grant()
    assert world.parking.status("cat", "")["state"] == "running"
    consistent(world)


def test_a_stale_culler_report_moves_nobody(world: World) -> None:
    world.idle("ann", 600)
    world.findings["pass_time"] = world.now[0] - 3600  # the culler stopped reporting an hour ago
    assert world.mover.tick() is None
    world.findings["pass_time"] = world.now[0] - 60
    assert world.mover.tick() is not None


def spawn_world(tmp: Path) -> World:
    """ann and ben hold half a GPU each, on different GPUs, long since; dan asks for a whole one."""
    now = [time.time()]  # rows are stamped with the real time: the clock starts there, at the test
    w = World(tmp, now)
    w.place("ann", 0, 500)
    w.place("ben", 1, 500)
    now[0] += 3600
    w.spawns_wait_for_moves = True
    w.idle("ben", 10)  # ben is busy
    return w


def test_a_spawn_that_fits_nowhere_waits_while_an_idle_notebook_moves_then_gets_the_room(tmp_path) -> None:
    world = spawn_world(tmp_path)
    world.idle("ann", 600)
    assert world.pool.hooks.room_by_moving(Request.for_gpus(1000)) == 1  # what the form offers
    with pytest.raises(
        RoomBeingFreed, match="Making room for 1 GPU: 1 idle notebook of other users moves to another GPU"
    ):
        world.pool.reserve_build("dan", [], "", 1000)
    world.pool.spawns_waiting.add(("dan", ""))  # the spawner waits (GPUSpawnerMixin.reserve_waiting)
    plan = world.mover.tick()
    assert [(s.id, s.source.gpus, s.dest.gpus) for s in plan.steps] == [("ann/", (0,), (1,))]
    assert world.shares() == [
        ("build", "ann", (1,), 500),
        ("build", "ben", (1,), 500),
        ("build", "dan", (0,), 1000),
    ]
    assert world.driver.remapped(101) == {"GPU-0": "GPU-1"}
    assert world.pool.store.events(kind="move")[0].message.endswith("to make room for a new workspace")
    # the spawner's next try finds its share held
    row = world.pool.reserve_build("dan", [], "", 1000)
    assert (row.owner, row.gpus) == ("dan", [0])
    consistent(world)


def test_a_spawn_no_move_can_make_room_for_is_refused_at_once(tmp_path) -> None:
    world = spawn_world(tmp_path)
    world.idle("ann", 30)  # not idle long enough
    assert world.pool.hooks.room_by_moving(Request.for_gpus(1000)) is None
    with pytest.raises(NoCapacity, match="no GPU has room for 1 GPU") as err:
        world.pool.reserve_build("dan", [], "", 1000)
    assert not isinstance(err.value, RoomBeingFreed)


def test_when_the_moves_fail_the_waiting_spawn_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(Driver, "fail", {"dest"})
    world = spawn_world(tmp_path)
    world.idle("ann", 600)
    with pytest.raises(RoomBeingFreed):
        world.pool.reserve_build("dan", [], "", 1000)
    world.pool.spawns_waiting.add(("dan", ""))
    world.mover.tick()
    assert world.moves()[0].phase == "returned"
    world.mover.tick()  # ann moved (back) just now: she rests, no other plan
    with pytest.raises(NoCapacity) as err:
        world.pool.reserve_build("dan", [], "", 1000)
    assert not isinstance(err.value, RoomBeingFreed)
    assert [a.owner for a in world.pool.store.allocations(kind="build")] == ["ann", "ben"]


def test_room_made_for_a_spawn_that_gave_up_meanwhile_is_held_for_nobody(tmp_path, monkeypatch) -> None:
    world = spawn_world(tmp_path)
    world.idle("ann", 600)
    with pytest.raises(RoomBeingFreed):
        world.pool.reserve_build("dan", [], "", 1000)
    world.pool.spawns_waiting.add(("dan", ""))
    # dan's start times out (or he cancels it) while ann's kernel is parked
    monkeypatch.setattr(
        failpoints,
        "reach",
        lambda name: world.pool.spawns_waiting.discard(("dan", "")) if name == "move.parked" else None,
    )
    world.mover.tick()
    assert world.shares() == [("build", "ann", (1,), 500), ("build", "ben", (1,), 500)]
    consistent(world)
