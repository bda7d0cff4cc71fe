"""Big gang jobs never starve: after a bounded wait a node is reserved for them and only
backfill may use its free GPUs (gpupool.pool.actions.reserve)."""

from __future__ import annotations

import math
import random

import hypothesis.strategies as st
from hypothesis import given, settings

from gpupool.pool import ClusterState, Request, get_policy
from gpupool.pool.inventory import GPU, Inventory, Node
from gpupool.pool.training import Job, Project, schedule
from tests.support.jobs import job_request

POLICY = get_policy("best-fit")
CYCLE = 60.0
RESERVE_AFTER = 5 * CYCLE
PROJECTS = {"big": Project("big", 8000), "flood": Project("flood", 8000)}


def dgx(n: int) -> Inventory:
    return Inventory(
        nodes=tuple(
            Node(f"dgx{i}", tuple(GPU(g, f"dgx{i}g{g}", "H100", 80000, True) for g in range(8)))
            for i in range(n)
        )
    )


def flood(
    durations: list[int], arrives: int, declared: bool, reserve_after: float | None, cycles: int = 60
) -> int | None:
    """Two 8-GPU nodes; "flood" keeps them full of 1-GPU jobs (4 new ones a cycle, each
    protected by a min runtime as long as its run, so nothing can be reclaimed or moved);
    "big" submits one 8-GPU job within its guarantee. The cycle it starts at, or None."""
    state = ClusterState(dgx(2))
    running: dict[str, tuple[Job, int]] = {}
    pending: dict[str, Job] = {}
    n = 0
    for cycle in range(cycles):
        now = cycle * CYCLE
        for jid, (job, end) in list(running.items()):
            if end <= cycle:
                state.release(job.placement)
                del running[jid]
        for _ in range(4):
            d = durations[n % len(durations)]
            n += 1
            pending[f"f{n}"] = Job(
                f"f{n}",
                "flood",
                Request.for_gpus(1000),
                submitted=now,
                min_runtime_s=d * CYCLE,
                max_runtime_s=d * CYCLE if declared else 0.0,
            )
        if cycle == arrives:
            pending["big"] = Job("big", "big", Request.for_gpus(8000), submitted=now)
        plan = schedule(
            state,
            PROJECTS,
            list(pending.values()),
            [j for j, _ in running.values()],
            now,
            POLICY,
            random.Random(0),
            reserve_after_s=reserve_after,
        )
        for r in plan.reserve:  # the caller pins the reserved job to its spot
            pending[r.job] = Job(**{**pending[r.job].__dict__, "placement": r.placement})
        for a in plan.admit:
            job = pending.pop(a.job)
            state.apply(a.placement)
            d = round(job.min_runtime_s / CYCLE) or 1
            running[a.job] = (Job(**{**job.__dict__, "started": now, "placement": a.placement}), cycle + d)
            if a.job == "big":
                return cycle
        assert not plan.preempt and not plan.move  # nothing here may be stopped
    return None


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=40, max_size=40), st.integers(3, 10), st.booleans())
def test_an_8_gpu_job_starts_within_a_bound_under_a_flood_of_1_gpu_jobs(durations, arrives, declared) -> None:
    started = flood(durations, arrives, declared, RESERVE_AFTER)
    # reserved after its wait; the reserved node drains within the longest run (6 cycles); one
    # cycle to notice, one to start
    bound = RESERVE_AFTER / CYCLE + 6 + 2
    assert started is not None and started - arrives <= bound, (started, arrives)


def test_without_reservations_the_same_flood_starves_it() -> None:
    """The baseline the bound above is measured against: with the rule off, the big job
    waits for the whole run (the 1-GPU jobs always take the GPUs freed first)."""
    durations = [1, 6, 3, 5, 2, 4, 6, 1]
    assert flood(durations, 3, True, None) is None
    assert flood(durations, 3, True, RESERVE_AFTER) is not None


def test_backfill_only_of_jobs_that_end_before_the_reserved_start_or_borrow() -> None:
    """A node with one free GPU and a 7-GPU job that ends in 10 min is reserved for an 8-GPU
    job; a 1-GPU job that declared 5 min backfills, one that declared 20 min does not, an
    in-quota job of another project without a declared runtime does not either, and a
    borrower (reclaimable by then) does."""
    state = ClusterState(dgx(1))
    projects = {"big": Project("big", 8000), "small": Project("small", 8000), "lend": Project("lend", 0)}
    busy = Job("busy", "small", Request.for_gpus(7000), submitted=0, started=0, max_runtime_s=600)
    placement = state.placement_on(0, busy.request, list(range(7)))
    state.apply(placement)
    busy = Job(**{**busy.__dict__, "placement": placement})
    big = Job("big", "big", Request.for_gpus(8000), submitted=0)

    def try_with(job: Job) -> list[str]:
        plan = schedule(state, projects, [big, job], [busy], now=300, policy=POLICY, reserve_after_s=60)
        assert [(r.job, r.start_by) for r in plan.reserve] == [("big", 600)]
        return [a.job for a in plan.admit]

    assert try_with(Job("short", "small", Request.for_gpus(1000), submitted=1, max_runtime_s=300)) == [
        "short"
    ]
    assert try_with(Job("long", "small", Request.for_gpus(1000), submitted=1, max_runtime_s=1200)) == []
    assert try_with(Job("open", "small", Request.for_gpus(1000), submitted=1)) == []
    assert try_with(Job("borrow", "lend", Request.for_gpus(1000), submitted=1)) == ["borrow"]
    # before its wait is over, nothing is reserved: anyone may take the free GPU
    plan = schedule(
        state,
        projects,
        [big, Job("long", "small", Request.for_gpus(1000), submitted=1)],
        [busy],
        now=30,
        policy=POLICY,
        reserve_after_s=60,
    )
    assert plan.reserve == [] and [a.job for a in plan.admit] == ["long"]
    assert math.isinf(
        schedule(
            state,
            projects,
            [big],
            [Job(**{**busy.__dict__, "max_runtime_s": 0})],
            now=300,
            policy=POLICY,
            reserve_after_s=60,
        )
        .reserve[0]
        .start_by
    )


# --- the hub's training service ------------------------------------------------
UNTIL_TOLD = ["-c", "import os, time\nwhile not os.path.exists('stop'): time.sleep(0.05)"]


def test_the_hub_reserves_gpus_for_a_waiting_gang_job_and_starts_it_there(tmp_path) -> None:
    """Real runs on a 2-GPU machine. "flood" keeps both GPUs busy; "big" waits for 2 GPUs.
    After reserve_after_s the GPU freed first is held for it (a new flood job waits, the
    owner is told), and when the other flood job ends the big job starts."""
    import sys
    from pathlib import Path

    from tests.support.pools import make_training, run_until

    svc = make_training(
        tmp_path,
        2,
        placement=POLICY,
        projects={"big": {"guarantee": 2}, "flood": {"guarantee": 2}},
        reserve_after_s=600,
        train_gpus=[0, 1],
    )
    pool = svc.pool
    cmd = [sys.executable, *UNTIL_TOLD]

    def end(job_id: str, now: float) -> None:
        Path(svc.job(job_id).workdir, "stop").touch()
        run_until(svc, lambda: svc.job(job_id).state != "running", f"{job_id} to end", now=now)

    try:
        a1 = svc.submit(job_request(owner="ann", project="flood", name="a1", command=cmd), now=0).id
        a2 = svc.submit(job_request(owner="ann", project="flood", name="a2", command=cmd), now=0).id
        big = svc.submit(
            job_request(owner="bob", project="big", name="big", num_gpu=2, command=cmd), now=1
        ).id
        svc.tick(now=10)
        assert svc.job(a1).state == svc.job(a2).state == "running" and svc.job(big).state == "queued"
        end(a1, now=700)  # a GPU frees after big has waited long enough: it is held for big
        a3 = svc.submit(job_request(owner="ann", project="flood", name="a3", command=cmd), now=700).id
        for now in (710, 720):
            svc.tick(now)
        assert svc.job(a3).state == "queued" and svc.job(big).state == "queued"
        assert "reserved for it" in svc.job(big).message
        assert [e.kind for e in pool.store.events(limit=50) if e.name == big].count("reserve") == 1
        end(a2, now=730)
        svc.tick(now=740)
        assert svc.job(big).state == "running" and svc.job(a3).state == "queued"
    finally:
        for row in svc.jobs():
            Path(row.workdir, "stop").touch()


def test_a_borrowers_reservation_yields_to_guarantees_but_not_to_other_borrowers() -> None:
    """An 8-GPU job beyond its project's guarantee also gets a node after its wait (one per
    cycle), but any in-quota job may still use the held GPUs: guarantees come first."""
    state = ClusterState(dgx(1))
    projects = {"big": Project("big", 0), "small": Project("small", 1000), "lend": Project("lend", 0)}
    busy = Job("busy", "lend", Request.for_gpus(7000), submitted=0, started=0)
    placement = state.placement_on(0, busy.request, list(range(7)))
    state.apply(placement)
    busy = Job(**{**busy.__dict__, "placement": placement})
    big = Job("big", "big", Request.for_gpus(8000), submitted=0)
    for other, admitted in (
        (Job("mine", "small", Request.for_gpus(1000), submitted=1), ["mine"]),
        (Job("more", "lend", Request.for_gpus(1000), submitted=1), []),
    ):
        plan = schedule(state, projects, [big, other], [busy], now=300, policy=POLICY, reserve_after_s=60)
        assert [r.job for r in plan.reserve] == ["big"] and [a.job for a in plan.admit] == admitted
