"""Train jobs on Kubernetes without an API server: the Job builder (validated against the
Kubernetes OpenAPI schemas), the Kueue objects and the pure state mapping. The controller itself
runs against the real control plane (tests/cluster/test_train_jobs_real.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest

from gpupool.gpu.sharing import HAMiSharing, KAISharing, MIGSharing, requested_milli
from gpupool.kube import TrainJobSpec
from gpupool.kube.follow import trim_job, trim_pod
from gpupool.kube.kueue import kueue_objects
from gpupool.kube.objects import JOB_ID, JobOptions, checkpoint_claim, train_job
from gpupool.kube.status import PodView, job_status, observe_pod
from gpupool.pool import InvalidRequest
from gpupool.pool.training import Project
from tests.k8s.test_chart import crd_schema

K8S = kubernetes_validate.latest_version()
NS = "jobs"
OPTS = JobOptions(namespace=NS, queue="{project}", device_memory_mib=81920)


def spec(job_id: str = "a1b2c3", num_gpu: int = 1, gpu_milli: int = 250, **kw) -> TrainJobSpec:
    return TrainJobSpec(
        id=job_id,
        owner=kw.pop("owner", "ann@uni.edu"),
        project=kw.pop("project", "vision"),
        num_gpu=num_gpu,
        gpu_milli=gpu_milli,
        command=["python", "train.py", "--epochs", "3"],
        image="registry.example.org/train:1",
        **kw,
    )


def env_of(job: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}


# --- the Job manifest -------------------------------------------------------------------
@pytest.mark.parametrize(
    "backend, num_gpu, milli, expect",
    [
        (KAISharing(), 1, 250, {"annotations": {"gpu-fraction": "0.25"}}),
        (KAISharing(), 2, 1000, {"limits": {"nvidia.com/gpu": "2"}}),
        (KAISharing(by_memory=True), 1, 500, {"annotations": {"gpu-memory": "40960"}}),
        (
            HAMiSharing(),
            2,
            500,
            {"limits": {"nvidia.com/gpu": "2", "nvidia.com/gpucores": "50", "nvidia.com/gpumem": "40960"}},
        ),
        (MIGSharing(), 1, 500, {"limits": {"nvidia.com/mig-3g.40gb": "1"}}),
        (None, 4, 1000, {"limits": {"nvidia.com/gpu": "4"}}),
    ],
)
def test_a_train_job_is_a_valid_job_that_asks_for_exactly_its_gpus(backend, num_gpu, milli, expect) -> None:
    job = train_job(spec(num_gpu=num_gpu, gpu_milli=milli, max_runtime_s=3600), OPTS, backend)
    kubernetes_validate.validate(job, K8S, strict=True)
    tmpl = job["spec"]["template"]
    pod = {"metadata": tmpl["metadata"], "spec": tmpl["spec"]}
    assert requested_milli(pod, 81920) == num_gpu * milli
    assert tmpl["spec"]["priorityClassName"] == "train"
    for key, value in expect.get("annotations", {}).items():
        assert tmpl["metadata"]["annotations"][key] == value
    limits = tmpl["spec"]["containers"][0].get("resources", {}).get("limits", {})
    assert limits == expect.get("limits", {})
    if isinstance(backend, KAISharing):
        assert tmpl["spec"]["schedulerName"] == "kai-scheduler"
        assert tmpl["metadata"]["labels"]["kai.scheduler/queue"] == "vision"
    assert job["spec"]["activeDeadlineSeconds"] == 3600


def test_preempted_pods_are_replaced_and_resume_from_the_checkpoint_claim() -> None:
    job = train_job(spec(), OPTS, KAISharing())
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert rules[0]["action"] == "Ignore" and rules[0]["onPodConditions"][0]["type"] == "DisruptionTarget"
    assert job["spec"]["podReplacementPolicy"] == "Failed"  # never two runs on one checkpoint
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    claim = checkpoint_claim(spec(), OPTS)
    kubernetes_validate.validate(claim, K8S, strict=True)
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    mount = pod["containers"][0]["volumeMounts"][0]
    assert env_of(job)["GPUPOOL_CHECKPOINT_DIR"] == mount["mountPath"] == "/checkpoint"
    assert job["metadata"]["labels"]["gpupool.io/owner"] == "ann-uni.edu"  # '@' is not a label character
    assert job["metadata"]["annotations"]["gpupool.io/owner"] == "ann@uni.edu"


def test_the_working_folder_is_bounded_by_the_job_folder_limit() -> None:
    """A job's snapshotted code runs in an emptyDir; without sizeLimit it could fill the node's disk."""
    job = train_job(spec(files=("train.py",)), JobOptions(namespace=NS, work_size_mib=2048), KAISharing())
    kubernetes_validate.validate(job, K8S, strict=True)
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    assert volumes["work"]["emptyDir"] == {"sizeLimit": "2048Mi"}
    unbounded = train_job(spec(files=("train.py",)), JobOptions(namespace=NS), KAISharing())
    assert {v["name"]: v for v in unbounded["spec"]["template"]["spec"]["volumes"]}["work"]["emptyDir"] == {}


def test_the_hubs_job_folder_limit_reaches_the_pods() -> None:
    from traitlets.config import Config

    from gpupool.train.config import TrainPool

    cfg = Config()
    cfg.TrainPool.max_job_folder_mib = 3000
    assert TrainPool(config=cfg).job_options().work_size_mib == 3000


def test_the_hubs_train_pods_carry_the_usage_finalizer_and_a_bare_controllers_do_not() -> None:
    """The hub (which relists train pods and takes it off once a pod's end is recorded) puts the
    usage finalizer on every train pod through the Job's template, by default (the chart's
    uninstall hook takes it off once the hub is gone); a controller with no relist behind it
    puts none (nothing would take it off: the pods could never go)."""
    from traitlets.config import Config

    from gpupool.train.config import TrainPool

    hub = TrainPool(config=Config()).job_options()
    job = train_job(spec(), replace(hub, namespace=NS), KAISharing())
    kubernetes_validate.validate(job, K8S, strict=True)
    assert job["spec"]["template"]["metadata"]["finalizers"] == ["gpupool.io/usage"]
    assert "finalizers" not in job["metadata"]  # the Job itself goes as before
    assert "finalizers" not in train_job(spec(), OPTS, KAISharing())["spec"]["template"]["metadata"]
    off = Config()
    off.TrainPool.usage_finalizer = False
    assert not TrainPool(config=off).job_options().usage_finalizer


def test_a_shared_claim_gets_one_folder_per_job_and_kueue_gets_its_label() -> None:
    opts = JobOptions(namespace=NS, checkpoint_claim="claim-{owner}", kueue=True)
    job = train_job(spec(owner="bob"), opts, KAISharing())
    kubernetes_validate.validate(job, K8S, strict=True)
    mount = job["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]
    assert mount["subPath"] == "gpupool-jobs/a1b2c3"
    assert job["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "claim-bob"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "vision"


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"job_id": "Bad_ID"}, "lower-case"),
        ({"num_gpu": 2, "gpu_milli": 1500}, "not a GPU request"),
        ({"max_runtime_s": -1}, "max_runtime_s"),
    ],
)
def test_bad_job_specs_are_refused(kw, message) -> None:
    with pytest.raises(InvalidRequest, match=message):
        spec(**kw)


def test_kai_refuses_fractions_of_several_gpus() -> None:
    with pytest.raises(InvalidRequest, match="a fraction of one GPU or whole GPUs"):
        train_job(spec(num_gpu=2, gpu_milli=500), OPTS, KAISharing())


def test_kueue_queues_follow_the_project_guarantees(schemas: Path) -> None:
    projects = {"vision": Project("vision", 8000, 2.0, 16000), "nlp": Project("nlp", 1500, 1.0, -1)}
    docs = kueue_objects(projects, NS, cohort="research")
    for doc in docs:
        group, _, version = doc["apiVersion"].rpartition("/")
        jsonschema.validate(doc, crd_schema(schemas, group, doc["kind"], version))
    cqs = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "ClusterQueue"}
    vision = cqs["vision"]["resourceGroups"][0]["flavors"][0]["resources"][0]
    assert (vision["nominalQuota"], vision["borrowingLimit"]) == (8, 8)
    nlp = cqs["nlp"]["resourceGroups"][0]["flavors"][0]["resources"][0]
    assert nlp["nominalQuota"] == 2 and "borrowingLimit" not in nlp  # 1.5 rounds up; no limit
    assert {c["cohortName"] for c in cqs.values()} == {"research"}
    assert all(c["preemption"]["reclaimWithinCohort"] == "Any" for c in cqs.values())


# --- the state of a job from its Job and pods -------------------------------------------
def pv(name: str, **kw) -> PodView:
    return PodView(uid=name, name=name, order=int(name[1:]), **kw)


@pytest.mark.parametrize(
    "job, pods, kw, state, message",
    [
        ({}, [], {}, "queued", "waiting for GPUs"),
        ({"spec": {"suspend": True}}, [], {}, "queued", "Kueue"),
        # Kueue's eviction (reclaim): the Job suspended again after it ran, its pod checkpointed and gone
        (
            {"spec": {"suspend": True}},
            [
                pv(
                    "p1",
                    phase="Failed",
                    ran=True,
                    disrupted="checkpointed and stopped",
                    exit_code=75,
                    gone=True,
                )
            ],
            {},
            "preempted",
            "preempted by Kueue",
        ),
        ({}, [pv("p1", phase="Running", ran=True)], {}, "running", ""),
        (
            {},
            [pv("p1", phase="Failed", ran=True, disrupted="PreemptionByScheduler", gone=True)],
            {},
            "preempted",
            "resumes from its checkpoint",
        ),
        (
            {},
            [
                pv("p1", phase="Failed", ran=True, disrupted="X", gone=True),
                pv("p2", phase="Running", ran=True),
            ],
            {},
            "running",
            "resumed from its checkpoint",
        ),
        ({"status": {"conditions": [{"type": "Complete", "status": "True"}]}}, [], {}, "succeeded", ""),
        (
            {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]}},
            [],
            {},
            "failed",
            "max runtime",
        ),
        (
            {
                "status": {
                    "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]
                }
            },
            [pv("p1", phase="Failed", ran=True, exit_code=3)],
            {},
            "failed",
            "exit code 3",
        ),
        ({}, [pv("p1", phase="Running", ran=True)], {"cancel_requested": True}, "running", "cancelling"),
        (
            {},
            [pv("p1", phase="Running", ran=True, gone=True)],
            {"cancel_requested": True, "job_deleted": True},
            "cancelled",
            "cancelled",
        ),
        ({}, [], {"job_deleted": True}, "cancelled", "deleted outside gpupool"),
        # the end read from the pods, before the Job controller writes its condition
        (
            {"spec": {"backoffLimit": 0}},
            [pv("p1", phase="Succeeded", ran=True, exit_code=0)],
            {},
            "succeeded",
            "",
        ),
        (
            {"spec": {"backoffLimit": 0}},
            [pv("p1", phase="Failed", ran=True, exit_code=3)],
            {},
            "failed",
            "exit code 3",
        ),
        ({"spec": {"backoffLimit": 1}}, [pv("p1", phase="Failed", ran=True, exit_code=3)], {}, "queued", ""),
        # SIGTERM's exit in a Job with a max runtime is no end by itself: its DeadlineExceeded follows
        (
            {"spec": {"backoffLimit": 0, "activeDeadlineSeconds": 2}},
            [pv("p1", phase="Failed", ran=True, exit_code=143)],
            {},
            "running",
            "stopping",
        ),
        (
            {
                "spec": {"backoffLimit": 0, "activeDeadlineSeconds": 2},
                "status": {
                    "conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]
                },
            },
            [pv("p1", phase="Failed", ran=True, exit_code=143)],
            {},
            "failed",
            "stopped at its max runtime",
        ),
        # without a max runtime, a program that ends on SIGTERM by itself fails as before
        (
            {"spec": {"backoffLimit": 0}},
            [pv("p1", phase="Failed", ran=True, exit_code=143)],
            {},
            "failed",
            "143",
        ),
        # the checkpoint helper's exit (75) and a deleted pod are no end: the Job replaces them
        (
            {"spec": {"backoffLimit": 0}},
            [pv("p1", phase="Failed", ran=True, exit_code=75, disrupted="checkpointed and stopped")],
            {},
            "preempted",
            "resumes",
        ),
        (
            {"spec": {"backoffLimit": 0}},
            [pv("p1", phase="Succeeded", ran=True, exit_code=0, gone=True)],
            {},
            "running",
            "finishing",
        ),
        # an elastic job: done when one worker succeeded and none is left
        (
            {"spec": {"parallelism": 4}},
            [pv("p1", phase="Succeeded", ran=True, exit_code=0), pv("p2", phase="Running", ran=True)],
            {},
            "running",
            "",
        ),
        (
            {"spec": {"parallelism": 4}},
            [
                pv("p1", phase="Succeeded", ran=True, exit_code=0),
                pv("p2", phase="Succeeded", ran=True, exit_code=0),
            ],
            {},
            "succeeded",
            "",
        ),
        (
            None,
            [pv("p1", phase="Succeeded", ran=True, exit_code=0)],
            {},
            "running",
            "finishing",
        ),  # Job not seen yet
    ],
)
def test_job_states(job, pods, kw, state, message) -> None:
    st = job_status(job, pods, **kw)
    assert st.state == state and message in st.message
    # the hub keeps each Job trimmed (follow.py): what it keeps must say the same
    assert job_status(None if job is None else trim_job(job), pods, **kw) == st


def test_a_queued_jobs_message_is_its_schedulers_reason_while_it_cannot_place_it() -> None:
    """KAI (and kube-scheduler) write why a pod waits into its PodScheduled condition: that is
    the job's wait reason on Kubernetes, not a guess from the hub's nominal inventory."""
    from gpupool.kube.status import job_status, observe_pod

    pod = {
        "metadata": {"uid": "u1", "name": "p1"},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "NodePool 'ws': Resources were found for 0 pods,\n  requested 1 GPU",
                }
            ],
        },
    }
    view = observe_pod(None, pod)
    st = job_status({"status": {}}, [view])
    assert (st.state, st.message) == (
        "queued",
        "unschedulable: NodePool 'ws': Resources were found for 0 pods, requested 1 GPU",
    )
    placed = observe_pod(
        view,
        {**pod, "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}},
    )
    assert job_status({"status": {}}, [placed]).message == "waiting for GPUs in its queue"


def test_the_hub_keeps_of_each_train_pod_what_its_state_is_made_of_and_little_else() -> None:
    """The controller follows every train pod as a trimmed copy (follow.py): through a pod's life
    (waiting for a node, running, evicted by the scheduler, ended) the copy says the same as the
    pod the API server sent, at a small part of its size (2,000 Jobs: benchmarks.kube)."""
    import json

    job = train_job(spec(max_runtime_s=3600), OPTS, KAISharing())
    tmpl = job["spec"]["template"]
    labels = {**tmpl["metadata"]["labels"], "batch.kubernetes.io/job-name": "x", "controller-uid": "c" * 36}
    meta = {
        "name": "p1",
        "namespace": "train",
        "uid": "u" * 36,
        "resourceVersion": "17",
        "creationTimestamp": "2026-11-29T04:00:00Z",
        "labels": labels,
        "annotations": tmpl["metadata"].get("annotations", {}),
        "managedFields": [{"manager": "kube-controller-manager", "fieldsV1": {"f:spec": {"f:x": {}}}}] * 4,
    }
    unscheduled = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0 of 8"}
    evicted = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    ready = {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-29T04:00:01Z"}
    ended = {"terminated": {"exitCode": 143, "reason": "Error", "finishedAt": "2026-11-29T04:09:00Z"}}
    lives = [
        {"phase": "Pending", "conditions": [unscheduled]},
        {
            "phase": "Running",
            "conditions": [ready],
            "containerStatuses": [{"name": "t", "state": {"running": {}}}],
        },
        {"phase": "Running", "conditions": [ready, evicted]},
        {"phase": "Failed", "conditions": [evicted], "containerStatuses": [{"name": "t", "state": ended}]},
    ]
    whole = trimmed = None
    for status in lives:
        pod = {"metadata": meta, "spec": {**tmpl["spec"], "nodeName": "n1"}, "status": status}
        whole, trimmed = observe_pod(whole, pod), observe_pod(trimmed, trim_pod(pod))
        assert trimmed == whole
        assert len(json.dumps(trim_pod(pod))) * 5 < len(json.dumps(pod))
    assert trimmed is not None and (trimmed.disrupted, trimmed.exit_code) == ("PreemptionByScheduler", 143)
    assert job_status(trim_job(job), [trimmed]) == job_status(job, [whole])
    assert trim_pod(pod)["metadata"]["labels"] == {JOB_ID: labels[JOB_ID]}
