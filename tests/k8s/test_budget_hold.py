"""GPU-hour budgets on Kubernetes (gpupool.kube.budget_hold): which train Jobs the hub suspends
and resumes, and how a Job held by a budget reads (queued, never a preemption). The cycle on a
real API server and Job controller: tests/cluster/test_train_service_real.py."""

from __future__ import annotations

import pytest

from gpupool.kube.budget_hold import HELD_LABEL, JobFacts, plan, suspend_patch
from gpupool.kube.status import PodView, job_status

WHY = {"q": "held: ann's GPU-hour budget (40 GPU-h in 7 days) is used up"}


def facts(**kw) -> JobFacts:
    base = {"job_id": "q", "queued": True, "hold_recorded": False, "suspended": False, "running": False}
    return JobFacts(**{**base, **kw})


@pytest.mark.parametrize(
    ("job", "held", "hold", "release"),
    [
        # over budget and waiting: recorded in its row, then its Job suspended
        (facts(), WHY, ["q"], []),
        # the hub died after writing the row, before the patch: the pass suspends it
        (facts(hold_recorded=True), WHY, ["q"], []),
        # suspended, but the row lost the hold (written back by an older hub): recorded again
        (facts(suspended=True), WHY, ["q"], []),
        # held and suspended: nothing to do
        (facts(hold_recorded=True, suspended=True), WHY, [], []),
        # a budget never stops running work: a job running, or whose pod runs before its row says so
        (facts(queued=False, running=True), WHY, [], []),
        (facts(running=True), WHY, [], []),
        # a held job stays held even if the watch still remembers its pod running a moment ago
        (facts(hold_recorded=True, suspended=True, running=True), WHY, [], []),
        # the budget has room (a top-up, the window slid): released, whichever half is left
        (facts(hold_recorded=True, suspended=True), {}, [], ["q"]),
        (facts(hold_recorded=True), {}, [], ["q"]),
        (facts(suspended=True), {}, [], ["q"]),
        # within budget and never held: left alone
        (facts(), {}, [], []),
    ],
)
def test_queued_jobs_over_budget_are_held_and_released_when_it_has_room(job, held, hold, release) -> None:
    got = plan([job], held)
    assert (got.hold, got.release) == (hold, release)


def test_only_the_jobs_over_budget_are_held_among_many() -> None:
    jobs = [
        facts(job_id="a"),
        facts(job_id="b"),
        facts(job_id="c", queued=False, running=True),
        facts(job_id="d", hold_recorded=True, suspended=True),
    ]
    got = plan(jobs, {"a": "over", "c": "over"})
    assert (got.hold, got.release) == (["a"], ["d"])


def held_job() -> dict:
    job = {"metadata": {"labels": {}}, "spec": {}}
    for part, value in suspend_patch(True).items():
        job[part].update(value)
    return job


def test_a_job_held_by_a_budget_is_queued_not_preempted() -> None:
    st = job_status(held_job(), [])
    assert st.state == "queued" and st.message.startswith("held: over budget") and not st.preemptions
    # held again after a preemption (it waited for its next pod): still not a preemption of the budget's
    ran = PodView(uid="1", name="p1", phase="Failed", ran=True, disrupted="PreemptionByScheduler", gone=True)
    st = job_status(held_job(), [ran])
    assert st.state == "queued" and st.message.startswith("held: over budget") and st.preemptions == 1
    # Kueue's suspension of a Job that ran stays what it was
    kueue = {"metadata": {"labels": {}}, "spec": {"suspend": True}}
    assert job_status(kueue, [ran]).state == "preempted"
    # resumed: the label is removed in the same patch, and the Job waits for GPUs again
    released = suspend_patch(False)
    assert released == {"metadata": {"labels": {HELD_LABEL: None}}, "spec": {"suspend": False}}
    assert job_status({"metadata": {"labels": {}}, "spec": {"suspend": False}}, []).state == "queued"
