"""A train job as a batch/v1 Job and its checkpoint claim: pure functions of the spec.

Preemption on Kubernetes: KAI-Scheduler (or Kueue) evicts an over-quota pod, the pod gets the
DisruptionTarget condition (KAI only with --update-pod-eviction-condition) and is deleted; the
checkpoint helper saves and exits with exit_codes.PREEMPTED. The podFailurePolicy ignores
both (they do not count toward backoffLimit) and the Job controller creates a new pod once the old one
has stopped (podReplacementPolicy: Failed, so two runs never write one checkpoint). The new
pod mounts the same claim at GPUPOOL_CHECKPOINT_DIR and resumes from it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from gpupool.gpu.sharing import SharingBackend, WholeGPUs
from gpupool.kube.home_mount import expanded, home_volume, pinned
from gpupool.kube.job_namespace import owner_namespace
from gpupool.kube.job_spec import TrainJobSpec
from gpupool.kube.pod_fit import (
    RESTRICTED_CONTAINER,
    RESTRICTED_POD,
    container_resources,
    merged_affinity,
    resources_for,
    tolerations_for,
)
from gpupool.kube.pod_usage import FINALIZER
from gpupool.kube.pool_objects import KAI_NODE_POOL, MIN_MEMBER, node_affinity, pool_queue_name
from gpupool.vocab.cluster import GPU_TOLERATION
from gpupool.vocab.exit_codes import PREEMPTED

MANAGED_BY = "app.kubernetes.io/managed-by"
JOB_ID = "gpupool.io/job-id"
OWNER = "gpupool.io/owner"
PROJECT = "gpupool.io/project"
KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
SELECTOR = f"{MANAGED_BY}=gpupool,{JOB_ID}"  # every gpupool train Job and its pods
CONTAINER = "train"
WORKDIR = "/gpupool/job"  # the working folder of a job with snapshotted code (an emptyDir)


@dataclass(frozen=True)
class JobOptions:
    """Cluster-wide settings of train Jobs (from the hub's config)."""

    namespace: str = "default"
    queue: str = "{project}"  # KAI leaf queue; {project} and {owner} are replaced
    priority_class: str = "train"
    high_priority_class: str = "gpupool-train-high"  # jobs with priority > 0 (the chart renders it, value 75)
    checkpoint_dir: str = "/checkpoint"
    checkpoint_size: str = "10Gi"
    storage_class: str | None = None
    checkpoint_claim: str = ""  # an existing claim (e.g. "claim-{owner}") instead of one per job
    backoff_limit: int = 0  # real failures (not preemptions) tolerated before the job fails
    grace_s: int = 60  # SIGTERM to SIGKILL: time to write a checkpoint
    ttl_after_finished_s: int = 7 * 24 * 3600
    service_account: str | None = None
    kueue: bool = False  # label the Job for Kueue (queue-name) instead of relying on KAI alone
    # the usage finalizer on train pods (gpupool.kube.pod_usage.FINALIZER): only where the hub's
    # usage relist runs to take it off again (TrainPool.usage_finalizer); a controller alone puts none
    usage_finalizer: bool = False
    device_memory_mib: int = 0  # one GPU's memory, for memory-based shares
    # the working folder's sizeLimit (TrainPool.max_job_folder_mib; 0: none): the kubelet evicts
    # a pod whose emptyDir grows past it, as the embedded runner stops a job over its folder limit
    work_size_mib: int = 0
    node_pool_label: str = KAI_NODE_POOL  # nodes of a pool defined by neither models nor nodes
    kai_namespace: str = "kai-scheduler"  # where KAI runs: its pod-grouper Deployment tells its version
    kai_version: str = ""  # the KAI version the cluster runs ("": read it from that Deployment)
    # each project queue's preempt/reclaimMinRuntime as the chart renders it (its minRuntime, a Go
    # duration such as "10m"): the start estimates forecast reclaim with it (kai_estimates)
    queue_min_runtime: dict[str, str] = field(default_factory=dict)
    # gpupool's start-up hook in the jobs' image (gpupool/gpu/startup): first on PYTHONPATH, so a
    # fraction's PyTorch allocator is capped at its share, as in the workspace ("": no hook)
    startup_dir: str = ""
    # --- fitting the pods to the cluster (pod_fit.py) ---
    tolerations: list[dict[str, object]] = field(default_factory=list)  # every train pod's
    gpu_tolerations: list[dict[str, object]] = field(
        default_factory=lambda: [dict(GPU_TOLERATION)]
    )  # pods with a GPU
    node_selector: dict[str, str] = field(default_factory=dict)
    affinity: dict[str, object] = field(default_factory=dict)  # node pools' affinity is added to it
    # CPU and memory: a pod without requests is BestEffort, the first evicted and placed anywhere
    resources: dict[str, dict[str, str]] = field(
        default_factory=lambda: {"requests": {"cpu": "500m", "memory": "1Gi"}}
    )
    project_resources: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)  # over `resources`
    image_pull_secrets: list[str] = field(default_factory=list)
    # the `restricted` Pod Security level; fsGroup 100 (the Jupyter images' group) makes a fresh
    # checkpoint volume writable by the non-root user
    pod_security_context: dict[str, object] = field(
        default_factory=lambda: {**RESTRICTED_POD, "fsGroup": 100}
    )
    container_security_context: dict[str, object] = field(default_factory=lambda: dict(RESTRICTED_CONTAINER))
    automount_service_account_token: bool = False  # user code gets no API token unless asked
    # --- user namespaces (job_namespace.py): kubespawner's settings, so a job goes where its
    # owner's workspace goes ("": every Job in `namespace`, the hub's) ---
    user_namespace_template: str = ""
    slug_scheme: str = "safe"
    user_namespace_labels: dict[str, str] = field(default_factory=dict)  # if the hub makes the namespace
    # the train pods' NetworkPolicy spec, made in each user namespace before its first Job (the
    # chart's policy covers the hub's namespace only); empty: none
    network_policy: dict[str, object] = field(default_factory=dict)
    # --- the owner's home in the job (home_mount.py): the claim the workspace mounts at
    # home_mount_path, as kubespawner names it (templates; "" claim: no home in jobs) ---
    home_claim: str = ""  # the home volume's claimName, e.g. z2jh's "{pvc_name}"
    home_pvc_template: str = "claim-{user_server}"  # KubeSpawner.pvc_name_template
    home_sub_path: str = ""
    home_mount_path: str = ""
    home_read_only: bool = True


def job_namespace(spec: TrainJobSpec, opts: JobOptions) -> str:
    """The namespace of the job's Job, claim and code: its owner's with user namespaces."""
    return owner_namespace(spec.owner, opts.namespace, opts.user_namespace_template, opts.slug_scheme)


def home_of(owner: str, opts: JobOptions) -> tuple[str, str, str]:
    """The claim, subPath and mount path of `owner`'s home, as kubespawner expands them for
    their workspace (in the namespace their jobs go to, where it made the claim)."""
    ns = owner_namespace(owner, opts.namespace, opts.user_namespace_template, opts.slug_scheme)

    def one(template: str) -> str:
        return expanded(template, owner, ns, opts.namespace, opts.home_pvc_template, opts.slug_scheme)

    return one(opts.home_claim), one(opts.home_sub_path), one(opts.home_mount_path)


def name_of(job_id: str) -> str:
    return f"gpupool-train-{job_id}"


def claim_name(spec: TrainJobSpec, opts: JobOptions) -> str:
    if opts.checkpoint_claim:
        return opts.checkpoint_claim.format(owner=label_value(spec.owner), project=spec.project)
    return f"gpupool-ckpt-{spec.id}"


def label_value(text: str) -> str:
    """A label value (63 chars of [A-Za-z0-9-_.], alphanumeric at both ends)."""
    value = re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:63].strip("-_.")
    return value or "x"


def queue_name(project: str, owner: str, opts: JobOptions) -> str:
    """The KAI (or Kueue) queue a job of `project` waits in."""
    return opts.queue.format(project=project, owner=label_value(owner))


def labels(spec: TrainJobSpec) -> dict[str, str]:
    return {
        MANAGED_BY: "gpupool",
        JOB_ID: spec.id,
        OWNER: label_value(spec.owner),
        PROJECT: label_value(spec.project),
    }


def code_name(job_id: str) -> str:
    return f"gpupool-code-{job_id}"


def code_config_map(
    spec: TrainJobSpec, opts: JobOptions, files: dict[str, bytes], job_uid: str = ""
) -> dict[str, object]:
    """The job's snapshotted code (a script or a notebook). Owned by its Job when `job_uid` is
    given, so Kubernetes' garbage collector deletes it with the Job."""
    import base64

    meta: dict[str, object] = {
        "name": code_name(spec.id),
        "namespace": job_namespace(spec, opts),
        "labels": labels(spec),
        **owned_by(spec, job_uid),
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta,
        "binaryData": {k: base64.b64encode(v).decode() for k, v in sorted(files.items())},
    }


def owned_by(spec: TrainJobSpec, job_uid: str) -> dict[str, object]:
    """Metadata that makes an object its Job's: Kubernetes deletes it with the Job (on cancel,
    or when ttlSecondsAfterFinished removes a finished Job)."""
    if not job_uid:
        return {}
    return {
        "ownerReferences": [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": name_of(spec.id),
                "uid": job_uid,
                "blockOwnerDeletion": False,
            }
        ]
    }


def checkpoint_claim(spec: TrainJobSpec, opts: JobOptions, job_uid: str = "") -> dict[str, Any]:
    """A claim of its own for the job's checkpoints: it outlives preempted pods, and goes with
    its Job when `job_uid` is given."""
    # an elastic job's workers may run on several nodes at once: they share the claim
    mode = "ReadWriteMany" if spec.min_gpus else "ReadWriteOnce"
    claim: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": claim_name(spec, opts),
            "namespace": job_namespace(spec, opts),
            "labels": labels(spec),
            **owned_by(spec, job_uid),
        },
        "spec": {"accessModes": [mode], "resources": {"requests": {"storage": opts.checkpoint_size}}},
    }
    if opts.storage_class:
        claim["spec"]["storageClassName"] = opts.storage_class
    return claim


def train_job(
    spec: TrainJobSpec, opts: JobOptions, backend: SharingBackend | None = None, home_node: str = ""
) -> dict[str, Any]:
    """The batch/v1 Job of a train job; GPUs through `backend` (whole GPUs by default); with
    opts.home_claim its owner's home mounted, on `home_node` only when given (a ReadWriteOnce
    home is attached there: home_mount.home_node)."""
    backend = backend or WholeGPUs()
    # KAI orders a queue's jobs, and picks whom to preempt, by the pod's priority class
    priority_class = opts.high_priority_class if spec.priority > 0 else opts.priority_class
    pod_labels = labels(spec)
    annotations = {OWNER: spec.owner}
    limits: dict[str, str] = {}
    scheduler = None
    queue = queue_name(spec.project, spec.owner, opts)
    if spec.queue_pool:  # KAI: the pool's shard (its label) and the project's queue there
        queue = pool_queue_name(queue, spec.queue_pool)
        pod_labels[KAI_NODE_POOL] = spec.queue_pool
    per_pod = 1 if spec.min_gpus else spec.num_gpu  # elastic: one pod per GPU
    if spec.num_gpu:
        share = backend.pod_gpu(per_pod, spec.gpu_milli, opts.device_memory_mib, queue, priority_class)
        pod_labels.update(share.labels)
        annotations.update(share.annotations)
        limits.update(share.limits)
        scheduler = share.scheduler_name
    elif backend.scheduler_name:  # a CPU-only job still goes through the queue
        pod_labels["kai.scheduler/queue"] = queue
        scheduler = backend.scheduler_name
    job_labels = labels(spec)
    if spec.queue_pool:  # KAI's pod grouper copies it from the Job to the PodGroup
        job_labels[KAI_NODE_POOL] = spec.queue_pool
    if opts.kueue:
        job_labels[KUEUE_QUEUE] = queue
    sub_path = f"gpupool-jobs/{spec.id}" if opts.checkpoint_claim else None
    env = {
        **spec.env,
        "GPUPOOL_JOB_ID": spec.id,
        "GPUPOOL_CHECKPOINT_DIR": opts.checkpoint_dir,
        "GPUPOOL_GPU_FRACTION": f"{per_pod * spec.gpu_milli / 1000:g}",
        "PYTHONUNBUFFERED": "1",
    }
    if opts.startup_dir:  # the hook first, then whatever path the job itself was given
        env["PYTHONPATH"] = ":".join(p for p in (opts.startup_dir, spec.env.get("PYTHONPATH", "")) if p)
    if spec.min_gpus:  # each pod is one worker of an elastic job: it rendezvouses with the others
        env.update(
            {
                "GPUPOOL_GPUS": "1",
                "GPUPOOL_MIN_WORKERS": str(spec.min_gpus),
                "GPUPOOL_MAX_WORKERS": str(spec.num_gpu),
            }
        )
    mount = {"name": "checkpoint", "mountPath": opts.checkpoint_dir}
    if sub_path:
        mount["subPath"] = sub_path
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.image,
        "command": list(spec.command),
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "volumeMounts": [mount],
    }
    resources = container_resources(
        resources_for(opts.resources, opts.project_resources, spec.project), limits
    )
    if resources:
        container["resources"] = resources
    if opts.container_security_context:
        container["securityContext"] = dict(opts.container_security_context)
    code_volumes: list[dict[str, object]] = []
    if spec.files:
        # a writable working folder with each code file mounted into it (read-only), as the
        # embedded runner's job folder holds the snapshot beside what the run writes
        container["workingDir"] = WORKDIR
        container["volumeMounts"] += [{"name": "work", "mountPath": WORKDIR}] + [
            {"name": "code", "mountPath": f"{WORKDIR}/{f}", "subPath": f, "readOnly": True}
            for f in spec.files
        ]
        code_volumes = [
            {
                "name": "work",
                "emptyDir": {"sizeLimit": f"{opts.work_size_mib}Mi"} if opts.work_size_mib else {},
            },
            {"name": "code", "configMap": {"name": code_name(spec.id)}},
        ]
    home_volumes: list[dict[str, object]] = []
    if opts.home_claim:
        claim, sub_path, mount_path = home_of(spec.owner, opts)
        volume, home_mount = home_volume(claim, sub_path, mount_path, opts.home_read_only)
        home_volumes.append(volume)
        container["volumeMounts"].append(home_mount)
    pod_spec: dict[str, object] = {
        "restartPolicy": "Never",  # the Job makes a new pod; podFailurePolicy needs Never
        "priorityClassName": priority_class,
        "terminationGracePeriodSeconds": opts.grace_s,
        "containers": [container],
        "volumes": [
            {"name": "checkpoint", "persistentVolumeClaim": {"claimName": claim_name(spec, opts)}},
            *code_volumes,
            *home_volumes,
        ],
    }
    if scheduler:
        pod_spec["schedulerName"] = scheduler
    affinity = merged_affinity(opts.affinity, node_affinity(spec.pools, opts.node_pool_label))
    if home_node:
        affinity = merged_affinity(affinity, pinned(home_node))
    if affinity:
        pod_spec["affinity"] = affinity
    if opts.service_account:
        pod_spec["serviceAccountName"] = opts.service_account
    pod_spec["automountServiceAccountToken"] = bool(opts.automount_service_account_token)
    tolerations = tolerations_for(opts.tolerations, opts.gpu_tolerations, spec.num_gpu > 0)
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if opts.node_selector:
        pod_spec["nodeSelector"] = dict(opts.node_selector)
    if opts.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in opts.image_pull_secrets]
    if opts.pod_security_context:
        pod_spec["securityContext"] = dict(opts.pod_security_context)
    template_meta: dict[str, object] = {"labels": pod_labels, "annotations": annotations}
    if opts.usage_finalizer:
        # a pod deleted while the hub is down stays (Terminating, its containers ended) until
        # the hub's relist has recorded its end (gpupool.kube.pod_spans), then goes
        template_meta["finalizers"] = [FINALIZER]
    job_spec: dict[str, object] = {
        "backoffLimit": opts.backoff_limit,
        "podReplacementPolicy": "Failed",
        "podFailurePolicy": {
            "rules": [
                # preempted or evicted: not the job's fault; a new pod resumes from the checkpoint
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                # the checkpoint helper's "preempted, resume me" (a scheduler that deletes the pod without
                # the DisruptionTarget condition still lets it save and exit with this)
                {
                    "action": "Ignore",
                    "onExitCodes": {"containerName": CONTAINER, "operator": "In", "values": [PREEMPTED]},
                },
            ]
        },
        "ttlSecondsAfterFinished": opts.ttl_after_finished_s,
        "template": {"metadata": template_meta, "spec": pod_spec},
    }
    if spec.max_runtime_s:
        job_spec["activeDeadlineSeconds"] = int(spec.max_runtime_s)
    job_annotations = {OWNER: spec.owner}
    if spec.min_gpus:
        # up to num_gpu workers at once; done when one succeeds and all have ended (no completions:
        # a worker that exits 0 means the training is over, and no new pod starts after it)
        job_spec["parallelism"] = spec.num_gpu
        job_annotations[MIN_MEMBER] = str(spec.min_gpus)  # KAI gang-schedules this many
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name_of(spec.id),
            "namespace": job_namespace(spec, opts),
            "labels": job_labels,
            "annotations": job_annotations,
        },
        "spec": job_spec,
    }
