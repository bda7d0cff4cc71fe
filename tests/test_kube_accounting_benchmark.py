"""`python -m benchmarks.kube`'s accounting line: the hub's train GPU-hours (its pod spans, as
gpupool.kube.pod_usage folds the relists) against the pods' true lives from the benchmark's
watch. A preempted pod deleted between two lists is short in the count, and a span counted
too long elsewhere does not make up for it."""

from __future__ import annotations

from benchmarks.kube.accounting import compare, line, observe
from gpupool.gpu.sharing import WholeGPUs
from gpupool.kube.pod_usage import fold

T0 = 1_800_000_000


def iso(t: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(uid: str, gpus: int, start: int, phase: str = "Running", end: int | None = None, **meta) -> dict:
    c: dict[str, object] = {"name": "main"}
    if end is not None:
        c["state"] = {"terminated": {"exitCode": 0, "finishedAt": iso(end)}}
    return {
        "metadata": {"uid": uid, "labels": {"gpupool.io/job-id": f"j-{uid}"}, **meta},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
        "status": {"phase": phase, "startTime": iso(start), "containerStatuses": [c]},
    }


def test_a_pod_evicted_between_two_lists_is_short_by_the_gap_and_nothing_else():
    # the truth, as the benchmark's watch sees it
    lives: dict[str, list] = {}
    observe(lives, pod("a", 1, T0), False, T0)
    observe(lives, pod("b", 2, T0), False, T0)
    observe(lives, pod("a", 1, T0, "Succeeded", T0 + 300), False, T0 + 300)
    evicted = pod("b", 2, T0)
    evicted["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True"}]
    observe(lives, evicted, False, T0 + 250)
    observe(lives, evicted, True, T0 + 251)  # the delete that follows moves nothing
    assert lives["b"][:3] == [2000, T0, T0 + 250]
    # the hub: lists at T0 and T0 + 200 see both running; the one at T0 + 400 neither b
    known: dict = {}
    readers = (WholeGPUs(),)
    for now, pods in (
        (T0, [pod("a", 1, T0), pod("b", 2, T0)]),
        (T0 + 200, [pod("a", 1, T0), pod("b", 2, T0)]),
        (T0 + 400, [pod("a", 1, T0, "Succeeded", T0 + 300)]),
    ):
        known |= fold(known, pods, now, readers, full_list=True)
    counted = {u: (s.milli, s.start, s.end) for u, s in known.items()}
    truth = {u: (m, a, b) for u, (m, a, b, _job) in lives.items()}
    acc = compare(counted, truth, until=T0 + 400)
    assert acc.truth == 300 + 2 * 250  # GPU-seconds
    assert acc.counted == 300 + 2 * 200  # b closed at the last list that saw it alive
    assert acc.over == 0 and acc.missing == 0
    assert round(acc.percent, 1) == 87.5
    assert "counted 0.19 of 0.22 (87.50 %; target >= 99 %: NOT met)" in line(acc, 1)


def test_a_span_counted_too_long_does_not_make_up_for_a_pod_never_counted():
    truth = {"a": (1000, T0, T0 + 100.0), "b": (1000, T0, T0 + 100.0)}
    counted = {"a": (1000, T0 - 100.0, None)}  # started early, never closed; b unrecorded
    acc = compare(counted, truth, until=T0 + 200)
    assert (acc.counted, acc.truth, acc.over, acc.missing) == (100, 200, 200, 1)
    assert acc.percent == 50
