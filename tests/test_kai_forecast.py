"""The forecast of KAI-Scheduler's order (gpupool.kube.kai_forecast) on small hand-built
snapshots: each test is an order a user waiting in KAI's queues would notice."""

from __future__ import annotations

from gpupool.kube.kai_forecast import (
    KaiJob,
    KaiQueue,
    KaiSnapshot,
    fair_shares,
    forecast,
    go_duration,
    tree_shares,
)

NOW = 10_000.0
H = 3600.0


def queues(*qs: KaiQueue) -> dict[str, KaiQueue]:
    return {q.name: q for q in qs}


def test_a_job_under_its_queues_guarantee_starts_before_an_older_one_of_an_over_quota_queue() -> None:
    # 4 GPUs, all busy: `other` holds its guarantee of 2 until its run ends in 10 min; `nlp`
    # holds its guarantee of 2 (nothing is reclaimable from either). `vision` holds nothing of
    # its guarantee of 2: when the GPUs free up, its job starts before nlp's older one, which
    # would take nlp over its guarantee, though nlp's queue has the higher priority.
    snap = KaiSnapshot(
        NOW,
        4000,
        queues(KaiQueue("vision", 2000), KaiQueue("nlp", 2000, priority=200), KaiQueue("other", 2000)),
        running=[
            KaiJob("o1", "other", 2000, started=NOW - H + 600),
            KaiJob("n1", "nlp", 2000, started=NOW - 60),
        ],
        pending=[
            KaiJob("old", "nlp", 2000, submitted=NOW - 900),
            KaiJob("v1", "vision", 2000, submitted=NOW - 10),
        ],
        runtime_s={"nlp": H, "vision": H, "other": H},
    )
    est = forecast(snap)
    assert est["v1"].start == NOW + 600
    assert "within queue vision's guarantee of 2 GPUs" in est["v1"].reason
    assert est["v1"].after == "job o1 is expected to end"
    assert est["old"].start is not None and est["old"].start > est["v1"].start


def test_reclaim_of_over_quota_work_waits_for_its_min_runtime() -> None:
    # `nlp` borrowed all 4 GPUs (guarantee 0); `vision`'s job is due its guarantee of 2 and
    # reclaims them, but only once the borrower has run nlp's min runtime (20 min), long
    # before the borrowers end
    snap = KaiSnapshot(
        NOW,
        4000,
        queues(KaiQueue("vision", 2000), KaiQueue("nlp", 0, min_runtime_s=1200)),
        running=[
            KaiJob("young", "nlp", 2000, started=NOW - 300),
            KaiJob("young2", "nlp", 2000, started=NOW - 200),
        ],
        pending=[KaiJob("v1", "vision", 2000, submitted=NOW)],
        runtime_s={"nlp": 10 * H},
    )
    est = forecast(snap)["v1"]
    assert est.start == NOW + 900  # `young` passes 20 min first
    assert "reclaims GPUs for queue vision" in est.reason and "from queue nlp" in est.reason
    assert "(job young)" in est.reason and "min runtime" in est.after
    # without a min runtime it reclaims at once
    free = KaiSnapshot(**{**snap.__dict__, "queues": queues(KaiQueue("vision", 2000), KaiQueue("nlp", 0))})
    assert forecast(free)["v1"].start == NOW


def test_a_borrowers_only_job_is_reclaimed_for_a_queue_due_its_quota() -> None:
    # the real node's case (tests/cluster/test_node_real.py): 1.75 GPUs for jobs (a workspace
    # holds a quarter), `vision` (guarantee 0) borrows a whole one for its only job, and nlp's
    # job is due its guarantee of 1. KAI judges a victim by what its queue holds before it is
    # taken (1 GPU, over vision's fair share of the idle 0.75): it reclaims once vision's job
    # has run its queue's min runtime, though vision is then left below its fair share
    snap = KaiSnapshot(
        NOW,
        1750,
        queues(KaiQueue("nlp", 1000), KaiQueue("vision", 0, min_runtime_s=10)),
        running=[KaiJob("v", "vision", 1000, started=NOW - 3)],
        pending=[KaiJob("n", "nlp", 1000, submitted=NOW)],
        runtime_s={"vision": H},
        nodes={"node": 1750},
    )
    est = forecast(snap)["n"]
    assert est.start == NOW + 7 and "min runtime" in est.after
    assert est.reason.startswith("reclaims GPUs for queue nlp") and est.reason.endswith("(job v)")


def test_a_run_on_a_node_the_hubs_inventory_does_not_name_still_holds_its_gpus() -> None:
    # the real node's install: the hub's nominal inventory is one node `localhost` (less the
    # workspace's quarter), vision's pod runs on the cluster's `gpupool-node`. The run is placed
    # where it fits instead, so its GPU is not counted free: nlp's job still waits for the
    # reclaim (it would "start now" if the run held nothing)
    snap = KaiSnapshot(
        NOW,
        1750,
        queues(KaiQueue("nlp", 1000), KaiQueue("vision", 0, min_runtime_s=10)),
        running=[KaiJob("v", "vision", 1000, started=NOW - 3, placed=(("gpupool-node", 1000),))],
        pending=[KaiJob("n", "nlp", 1000, submitted=NOW)],
        runtime_s={"vision": H},
        nodes={"localhost": 1750},
    )
    est = forecast(snap)["n"]
    assert est.start == NOW + 7 and "min runtime" in est.after
    assert est.reason.startswith("reclaims GPUs for queue nlp")


def test_no_reclaim_for_a_queue_already_at_its_fair_share() -> None:
    # `vision` already holds its guarantee; a second job of it would go over its fair share,
    # so it waits for a run to end instead of reclaiming from `nlp`
    snap = KaiSnapshot(
        NOW,
        4000,
        queues(KaiQueue("vision", 2000), KaiQueue("nlp", 2000)),
        running=[
            KaiJob("v0", "vision", 2000, started=NOW - 60),
            KaiJob("n0", "nlp", 2000, started=NOW - 1800),
        ],
        pending=[KaiJob("v1", "vision", 2000, submitted=NOW)],
        runtime_s={"vision": H, "nlp": H},
    )
    est = forecast(snap)["v1"]
    assert est.start == NOW + 1800 and est.after == "job n0 is expected to end"


def test_a_higher_priority_job_preempts_a_lower_one_of_its_own_queue() -> None:
    snap = KaiSnapshot(
        NOW,
        2000,
        queues(KaiQueue("vision", 2000)),
        running=[KaiJob("low", "vision", 2000, priority=0, started=NOW - 60)],
        pending=[KaiJob("urgent", "vision", 2000, priority=75, submitted=NOW)],
        runtime_s={"vision": H},
    )
    est = forecast(snap)["urgent"]
    assert est.start == NOW and "preempts lower-priority job low of its queue" in est.reason
    # the same priority: it waits its turn
    same = KaiSnapshot(**{**snap.__dict__, "pending": [KaiJob("next", "vision", 2000, submitted=NOW)]})
    assert forecast(same)["next"].start == NOW + H - 60


def test_in_a_queue_higher_priority_goes_first_and_a_big_job_is_passed_over() -> None:
    snap = KaiSnapshot(
        NOW,
        2000,
        queues(KaiQueue("vision", 2000)),
        running=[KaiJob("r", "vision", 1000, started=NOW - 60)],
        pending=[
            KaiJob("big", "vision", 2000, submitted=NOW - 100),
            KaiJob("small", "vision", 1000, submitted=NOW - 50),
        ],
        runtime_s={"vision": H},
    )
    est = forecast(snap)
    # KAI reserves nothing for the big job: the small one behind it takes the idle GPU now
    assert est["small"].start == NOW
    assert est["big"].start is not None and est["big"].start > NOW


def test_over_quota_idle_gpus_go_by_weight_and_limits_hold() -> None:
    qs = queues(KaiQueue("a", 0, weight=3), KaiQueue("b", 0, weight=1), KaiQueue("c", 0, limit_milli=1000))
    share = fair_shares(8000, qs, {"a": 8000, "b": 8000, "c": 8000})
    assert (round(share["a"]), round(share["b"]), round(share["c"])) == (5250, 1750, 1000)
    est = forecast(KaiSnapshot(NOW, 8000, qs, pending=[KaiJob("huge", "c", 2000)]))["huge"]
    assert est.start is None and "queue c's limit of 1" in est.reason
    est = forecast(KaiSnapshot(NOW, 8000, qs, pending=[KaiJob("x", "a", 1000)]))["x"]
    assert est.start == NOW and "beyond queue a's guarantee" in est.reason and "reclaimed" in est.reason


def test_a_job_bigger_than_the_cluster_never_starts() -> None:
    est = forecast(KaiSnapshot(NOW, 2000, queues(KaiQueue("a", 2000)), pending=[KaiJob("x", "a", 4000)]))
    assert est["x"].start is None and "more than the cluster's 2" in est["x"].reason


def test_min_runtimes_are_read_as_kai_reads_them() -> None:
    assert (go_duration("10m"), go_duration("1h30m"), go_duration("90s")) == (600, 5400, 90)
    assert go_duration("") == go_duration("10") == go_duration("10m; rm") == go_duration("9" * 70 + "s") == 0


def test_departments_divide_the_cluster_first_and_their_limit_holds_their_projects_jobs() -> None:
    # two departments of equal weight: x and y share one half, z has the other to itself
    # (flat, each would get a third)
    parents = queues(KaiQueue("department-d1", 0), KaiQueue("department-d2", 0, limit_milli=2000))
    qs = queues(
        KaiQueue("x", 0, parent="department-d1"),
        KaiQueue("y", 0, parent="department-d1"),
        KaiQueue("z", 0, parent="department-d2"),
    )
    share = tree_shares(12000, qs, {}, {"x": 12000, "y": 12000, "z": 12000})
    assert round(share["x"]) == round(share["y"]) == round(share["z"]) == 4000
    even = queues(KaiQueue("department-d1", 0), KaiQueue("department-d2", 0))
    share = tree_shares(12000, qs, even, {"x": 12000, "y": 12000, "z": 12000})
    assert (round(share["x"]), round(share["y"]), round(share["z"])) == (3000, 3000, 6000)
    # d2 holds 2 GPUs, its limit: z's next job waits though 6 GPUs are idle
    snap = KaiSnapshot(
        NOW,
        8000,
        qs,
        running=[KaiJob("z1", "z", 2000, started=NOW - 600)],
        pending=[KaiJob("z2", "z", 1000, submitted=NOW), KaiJob("x1", "x", 1000, submitted=NOW + 1)],
        runtime_s={"z": H},
        parents=parents,
    )
    est = forecast(snap)
    assert est["x1"].start == NOW
    assert est["z2"].start == NOW + H - 600 and est["z2"].after == "job z1 is expected to end"


def test_a_pod_needs_its_gpus_on_one_node_and_small_pods_pack_tightly() -> None:
    # two nodes of 4 GPUs, each half used: 4 GPUs are free, but not on one node
    snap = KaiSnapshot(
        NOW,
        8000,
        queues(KaiQueue("lab", 8000)),
        running=[
            KaiJob("ra", "lab", 2000, started=NOW - H + 1200, placed=(("a", 2000),)),
            KaiJob("rb", "lab", 2000, started=NOW - H + 600, placed=(("b", 2000),)),
        ],
        pending=[KaiJob("four", "lab", 4000, submitted=NOW)],
        runtime_s={"lab": H},
        nodes={"a": 4000, "b": 4000},
    )
    est = forecast(snap)["four"]
    assert est.start == NOW + 600 and est.after == "job rb is expected to end"
    # counted across the cluster it would be said to start now
    assert forecast(KaiSnapshot(**{**snap.__dict__, "nodes": {}}))["four"].start == NOW
    # an elastic job's pods (one GPU each) may spread over both nodes
    elastic = KaiSnapshot(**{**snap.__dict__, "pending": [KaiJob("e", "lab", 4000, pod_milli=1000)]})
    assert forecast(elastic)["e"].start == NOW
    # a one-GPU job goes where it fits most tightly (node a, half full), leaving node b whole
    packed = KaiSnapshot(
        **{
            **snap.__dict__,
            "running": [snap.running[0]],
            "pending": [
                KaiJob("one", "lab", 1000, submitted=NOW - 5),
                KaiJob("four", "lab", 4000, submitted=NOW),
            ],
        }
    )
    est2 = forecast(packed)
    assert est2["one"].start == est2["four"].start == NOW
    too_big = KaiSnapshot(**{**snap.__dict__, "pending": [KaiJob("six", "lab", 6000)]})
    assert (
        forecast(too_big)["six"].start is None and "more than any node has" in forecast(too_big)["six"].reason
    )


def test_reclaim_takes_its_victims_on_the_node_where_the_job_then_fits() -> None:
    # node a: 1 GPU free and an old borrower; node b: two borrowers, one young. Across the
    # cluster the youngest would go; but only on node a does one victim make room for 2 GPUs
    snap = KaiSnapshot(
        NOW,
        4000,
        queues(KaiQueue("vision", 2000), KaiQueue("nlp", 0)),
        running=[
            KaiJob("old", "nlp", 1000, started=NOW - 3000, placed=(("a", 1000),)),
            KaiJob("mid", "nlp", 1000, started=NOW - 2000, placed=(("b", 1000),)),
            KaiJob("young", "nlp", 1000, started=NOW - 100, placed=(("b", 1000),)),
        ],
        pending=[KaiJob("v", "vision", 2000, submitted=NOW)],
        runtime_s={"nlp": 10 * H},
        nodes={"a": 2000, "b": 2000},
    )
    est = forecast(snap)["v"]
    assert est.start == NOW and est.reason.endswith("(job old)")
    assert forecast(KaiSnapshot(**{**snap.__dict__, "nodes": {}}))["v"].reason.endswith("(job young)")
