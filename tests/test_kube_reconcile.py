"""The train-Job controller's level-triggered pass (gpupool.kube.controller.reconcile) on the
copies its followers keep: plain dicts, no API server (the followers themselves
meet the real one in tests/cluster/test_train_jobs_real.py). What a pass cannot see, a pod that
came and went between two passes, must not hide a preemption from the job row."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from kubernetes_asyncio import client

from gpupool.kube.controller import KubeJobController
from gpupool.kube.objects import JOB_ID, MANAGED_BY, JobOptions
from gpupool.kube.status import JobStatus

LABELS = {MANAGED_BY: "gpupool", JOB_ID: "j1"}


def job(rv: str, **status) -> dict:
    return {
        "metadata": {
            "name": "gpupool-j1",
            "namespace": "ns",
            "uid": "job-uid",
            "resourceVersion": rv,
            "labels": LABELS,
        },
        "spec": {},
        "status": status,
    }


def pod(uid: str, rv: str, phase: str) -> dict:
    return {
        "metadata": {
            "name": f"gpupool-j1-{uid}",
            "namespace": "ns",
            "uid": uid,
            "resourceVersion": rv,
            "labels": LABELS,
        },
        "status": {"phase": phase},
    }


@pytest.fixture
async def api():
    async with client.ApiClient(client.Configuration()) as api:  # never called: no server here
        yield api


def controller(api: client.ApiClient, seen: list[JobStatus]) -> KubeJobController:
    ctl = KubeJobController(api, JobOptions(namespace="ns"), on_change=lambda _id, st: seen.append(st))
    ctl.reflectors = {"jobs": SimpleNamespace(resources={}), "pods": SimpleNamespace(resources={})}
    return ctl


def cluster(ctl: KubeJobController, jobs: list[dict], pods: list[dict]) -> None:
    """What the reflectors hold now (keyed as kubespawner keys them)."""
    for kind, objs in (("jobs", jobs), ("pods", pods)):
        ctl.reflectors[kind].resources = {f"ns/{o['metadata']['name']}": o for o in objs}


async def test_a_preemption_between_two_passes_is_still_reported_before_the_resume(api) -> None:
    seen: list[JobStatus] = []
    ctl = controller(api, seen)
    cluster(ctl, [job("1")], [pod("p1", "2", "Running")])
    await ctl.reconcile()
    assert [s.state for s in seen] == ["running"]
    # between two passes: p1 evicted and deleted, the Job's replacement p2 already runs
    cluster(ctl, [job("3")], [pod("p2", "5", "Running")])
    await ctl.reconcile()
    assert [s.state for s in seen] == ["running", "preempted", "running"]
    assert (seen[-1].runs, seen[-1].preemptions) == (2, 1) and "resumed" in seen[-1].message
    # nothing changed: a pass reports nothing
    await ctl.reconcile()
    assert len(seen) == 3


async def test_a_job_gone_from_the_copy_was_deleted_and_a_finished_pods_removal_is_no_preemption(api) -> None:
    seen: list[JobStatus] = []
    ctl = controller(api, seen)
    cluster(ctl, [job("1")], [pod("p1", "2", "Pending")])
    await ctl.reconcile()
    cluster(ctl, [], [])  # the relist after an outage: Job and pod gone
    await ctl.reconcile()
    assert seen[-1].preemptions == 0
    assert seen[-1].state == "cancelled" and "outside gpupool" in seen[-1].message
    # a pod that succeeded is the job's end even if its Job goes before it says Complete
    seen.clear()
    other = controller(api, seen)
    cluster(other, [job("1")], [pod("p1", "2", "Running")])
    await other.reconcile()
    cluster(other, [job("1")], [pod("p1", "3", "Succeeded")])
    await other.reconcile()
    cluster(other, [], [])
    await other.reconcile()
    assert [s.state for s in seen] == ["running", "succeeded"] and seen[-1].preemptions == 0


async def test_a_resume_and_its_end_between_two_passes_are_reported_in_order(api) -> None:
    """The end comes from the pod now, before the Job's Complete: a replacement pod that ran and
    succeeded between two passes still shows its run before the end (the job's start and
    resume events come from that)."""
    seen: list[JobStatus] = []
    ctl = controller(api, seen)
    cluster(ctl, [job("1")], [pod("p1", "2", "Running")])
    await ctl.reconcile()
    done = pod("p2", "5", "Succeeded")
    done["status"]["containerStatuses"] = [{"name": "train", "state": {"terminated": {"exitCode": 0}}}]
    cluster(ctl, [job("3")], [done])  # p1 evicted, p2 ran and finished: all between two passes
    await ctl.reconcile()
    assert [s.state for s in seen] == ["running", "preempted", "running", "succeeded"]
    assert (seen[-1].runs, seen[-1].preemptions, seen[-1].exit_code) == (2, 1, 0)
