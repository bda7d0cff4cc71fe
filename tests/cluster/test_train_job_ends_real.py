"""A train job's end and its preemptions are read from its pods, not from the Job's conditions.

The Job controller writes `Complete` or `Failed` seconds to a minute after the pod ended on a
busy cluster (benchmarks/kube: 5 s p50, 48 s p90 with 2,000 Jobs), so gpupool's controller
reads the end from the pod watch as soon as the pod shows it. To prove the row comes from the
pods alone, these Jobs are handed to another controller (`spec.managedBy`, GA in Kubernetes
1.35): the built-in Job controller never touches them, and the test makes their pods as a Job
controller would. The API server, kwok and gpupool's controller are real; the container's exit
is our kwok stage, KAI's eviction is done as KAI does it (tests/cluster/test_train_jobs_real.py).
"""

from __future__ import annotations

import secrets

from gpupool.kube import TrainJobSpec
from gpupool.kube.controller import KubeJobController
from gpupool.kube.objects import train_job
from gpupool.kube.status import JobStatus
from tests.cluster.conftest import HUB_NS
from tests.cluster.resources import Resources
from tests.cluster.test_train_jobs_real import OPTS, evict_as_kai, exit_pod, hub_api, wait_for  # noqa: F401

NOBODY = "example.org/nobody"  # spec.managedBy: the built-in Job controller leaves the Job alone


def unmanaged_job(admin: Resources, prefix: str, backoff_limit: int = 0) -> TrainJobSpec:
    spec = TrainJobSpec(
        id=f"{prefix}{secrets.token_hex(3)}",
        owner="ann",
        project="default",
        num_gpu=1,
        gpu_milli=1000,
        command=["python", "train.py"],
        image="registry.example.org/train:1",
    )
    manifest = train_job(spec, OPTS)
    manifest["spec"].update(managedBy=NOBODY, backoffLimit=backoff_limit)
    admin.apply(manifest)
    return spec


def make_pod(admin: Resources, spec: TrainJobSpec, n: int) -> dict:
    """The pod a Job controller would make from the Job's template, bound to a kwok node."""
    job = train_job(spec, OPTS)
    template = job["spec"]["template"]
    pod_spec = {**template["spec"], "nodeName": "gpu-node-0", "volumes": []}
    pod_spec.pop("schedulerName", None)
    pod_spec["containers"] = [{**c, "volumeMounts": []} for c in pod_spec["containers"]]
    return admin.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "spec": pod_spec,
            "metadata": {
                "name": f"{job['metadata']['name']}-{n}",
                "namespace": HUB_NS,
                "labels": template["metadata"]["labels"],
                "annotations": template["metadata"]["annotations"],
            },
        }
    )


def conditions(admin: Resources, spec: TrainJobSpec) -> list[dict]:
    job = admin.get(f"/apis/batch/v1/namespaces/{HUB_NS}/jobs/gpupool-train-{spec.id}")
    return [c for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"]


async def test_a_preemption_and_the_end_are_seen_through_the_pod_watch(hub_api, admin: Resources) -> None:
    spec = unmanaged_job(admin, "podend")
    seen: list[str] = []

    def on_change(job_id: str, st: JobStatus) -> None:
        if job_id == spec.id and (not seen or seen[-1] != st.state):
            seen.append(st.state)

    ctl = KubeJobController(hub_api, OPTS, None, on_change=on_change, watch_timeout_s=20)
    await ctl.start()
    try:
        first = make_pod(admin, spec, 1)
        await wait_for(lambda: (ctl.status(spec.id) or JobStatus("")).state == "running", what="running")
        evict_as_kai(admin, first)  # the DisruptionTarget condition, then the delete
        await wait_for(lambda: ctl.status(spec.id).state == "preempted", what="the preemption, from the pod")
        second = make_pod(admin, spec, 2)  # the replacement the Job controller would make
        await wait_for(
            lambda: ctl.status(spec.id).state == "running" and ctl.status(spec.id).runs == 2,
            what="running again",
        )
        exit_pod(admin, second, 0)
        await wait_for(
            lambda: ctl.status(spec.id).state == "succeeded",
            timeout=30,
            what="succeeded, read from the pod (no Job controller writes Complete here)",
        )
        assert conditions(admin, spec) == []  # nobody but the pod said so
        st = ctl.status(spec.id)
        assert (st.runs, st.preemptions) == (2, 1)
        assert seen == ["queued", "running", "preempted", "running", "succeeded"], seen
    finally:
        await ctl.stop()


async def test_a_failure_is_read_from_the_pod_and_a_retry_left_is_not_an_end(
    hub_api, admin: Resources
) -> None:
    once = unmanaged_job(admin, "podfail")
    retried = unmanaged_job(admin, "podretry", backoff_limit=1)  # one failure is allowed: not over yet
    ctl = KubeJobController(hub_api, OPTS, None, watch_timeout_s=20)
    await ctl.start()
    try:
        pods = {s.id: make_pod(admin, s, 1) for s in (once, retried)}
        for s in (once, retried):
            await wait_for(lambda s=s: (ctl.status(s.id) or JobStatus("")).state == "running", what="running")
            exit_pod(admin, pods[s.id], 3)
        await wait_for(lambda: ctl.status(once.id).state == "failed", timeout=30, what="failed, from the pod")
        assert ctl.status(once.id).message == "exit code 3"
        await wait_for(lambda: ctl.status(retried.id).exit_code == 3, what="the retried job's exit seen")
        assert ctl.status(retried.id).state not in ("failed", "succeeded")
        assert conditions(admin, once) == []
    finally:
        await ctl.stop()
