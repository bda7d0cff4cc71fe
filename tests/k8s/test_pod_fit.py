"""Pods that fit a real cluster, without an API server: train Jobs and workspaces tolerate tainted
GPU nodes when they hold a GPU share, ask for CPU and memory, carry pull secrets and the
`restricted` securityContext, get no API token; the chart's values reach the hub's traits, and the
chart's NetworkPolicy fences train pods as z2jh fences workspaces. The apiserver's own Pod Security
admission and KAI's placement are in tests/cluster/test_pod_fit_real.py."""

from __future__ import annotations

from traitlets.config import Config

from gpupool.gpu.sharing import KAISharing
from gpupool.kube import TrainJobSpec
from gpupool.kube.objects import JobOptions, train_job
from gpupool.pool.pools import NodePool
from tests.cluster.netpol import Pod, allowed
from tests.k8s.test_chart import render

GPU_TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def job_pod(num_gpu: int = 1, gpu_milli: int = 250, opts: JobOptions | None = None, **kw) -> dict:
    spec = TrainJobSpec(
        id="fit1",
        owner="ann",
        project=kw.pop("project", "vision"),
        num_gpu=num_gpu,
        gpu_milli=gpu_milli,
        command=["python", "train.py"],
        image="registry.example.org/train:1",
        **kw,
    )
    return train_job(spec, opts or JobOptions(namespace="jobs"), KAISharing())["spec"]["template"]["spec"]


def qos(pod_spec: dict) -> str:
    """The pod's QoS class as the kubelet derives it (one container here)."""
    res = pod_spec["containers"][0].get("resources") or {}
    req, lim = res.get("requests") or {}, res.get("limits") or {}
    if not {"cpu", "memory"} & (set(req) | set(lim)):
        return "BestEffort"
    if all(lim.get(k) and req.get(k, lim[k]) == lim[k] for k in ("cpu", "memory")):
        return "Guaranteed"
    return "Burstable"


def restricted_violations(pod_spec: dict) -> list[str]:
    """What the `restricted` Pod Security level checks on a pod (its securityContext part)."""
    pod_sc = pod_spec.get("securityContext") or {}
    out = []
    for c in pod_spec["containers"] + (pod_spec.get("initContainers") or []):
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{c['name']}: allowPrivilegeEscalation")
        if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
            out.append(f"{c['name']}: capabilities")
        if not sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
            out.append(f"{c['name']}: runAsNonRoot")
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{c['name']}: seccompProfile")
    return out


def test_a_fractional_train_pod_tolerates_gpu_nodes_asks_for_cpu_and_memory_and_is_restricted() -> None:
    """Before, a fractional job had no tolerations (KAI never placed it on a tainted GPU node),
    `resources: {}` (BestEffort), no securityContext and the namespace's token mounted."""
    pod = job_pod()
    assert "nvidia.com/gpu" not in pod["containers"][0]["resources"].get("limits", {})  # a fraction
    assert pod["tolerations"] == [GPU_TAINT]
    assert qos(pod) == "Burstable"
    assert pod["containers"][0]["resources"]["requests"] == {"cpu": "500m", "memory": "1Gi"}
    assert restricted_violations(pod) == []
    assert pod["automountServiceAccountToken"] is False
    # a CPU-only job stays off tainted GPU nodes
    assert "tolerations" not in job_pod(num_gpu=0, gpu_milli=0)


def test_the_admins_placement_resources_and_pull_secrets_reach_the_train_pod() -> None:
    opts = JobOptions(
        namespace="jobs",
        tolerations=[{"key": "dedicated", "operator": "Equal", "value": "train", "effect": "NoSchedule"}],
        node_selector={"cloud.google.com/gke-nodepool": "gpu"},
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                    ]
                }
            }
        },
        resources={
            "requests": {"cpu": "2", "memory": "8Gi"},
            "limits": {"memory": "32Gi", "nvidia.com/gpu": "8"},
        },
        project_resources={"vision": {"requests": {"memory": "16Gi"}, "limits": {"cpu": "8"}}},
        image_pull_secrets=["my-registry"],
        automount_service_account_token=True,
    )
    pod = job_pod(num_gpu=2, gpu_milli=1000, opts=opts, pools=(NodePool("dgx", models=("NVIDIA H100",)),))
    assert pod["tolerations"][0]["key"] == "dedicated" and pod["tolerations"][1] == GPU_TAINT
    assert pod["nodeSelector"] == {"cloud.google.com/gke-nodepool": "gpu"}
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert [e["key"] for e in terms[0]["matchExpressions"]] == ["zone", "nvidia.com/gpu.product"]  # ANDed
    res = pod["containers"][0]["resources"]
    # the project's over the default, key by key; the GPU limit is the share's, never the admin's
    assert res["requests"] == {"cpu": "2", "memory": "16Gi"}
    assert res["limits"] == {"memory": "32Gi", "cpu": "8", "nvidia.com/gpu": "2"}
    assert pod["imagePullSecrets"] == [{"name": "my-registry"}]
    assert pod["automountServiceAccountToken"] is True
    other = job_pod(num_gpu=2, gpu_milli=1000, opts=opts, project="nlp")["containers"][0]["resources"]
    assert other["requests"] == {"cpu": "2", "memory": "8Gi"}


def hub_config(values: dict) -> Config:
    import json

    cm = next(
        d for d in render(values) if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpupool-config"
    )
    return Config(json.loads(cm["data"]["hub-config.json"]))


def test_the_charts_values_reach_the_train_jobs_and_workspaces() -> None:
    from gpupool.settings.config import GPUPool
    from gpupool.train.config import TrainPool

    taint = {"key": "gpu", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}
    c = hub_config(
        {
            "projects": {
                "vision": {"department": "d", "guarantee": 1, "jobResources": {"requests": {"cpu": "4"}}}
            },
            "departments": {"d": {"quota": 1}},
            "gpuNodes": {"tolerations": [taint]},
            "jobs": {
                "nodeSelector": {"pool": "gpu"},
                "imagePullSecrets": [{"name": "my-registry"}],
                "resources": {"limits": {"memory": "32Gi"}},
            },
        }
    )
    opts = TrainPool(config=c).job_options()
    assert opts.gpu_tolerations == [taint] and GPUPool(config=c).gpu_tolerations == [taint]
    assert GPUPool(config=c).gpu_inventory == "kubernetes"  # the cluster's GPUs, not a constant
    assert opts.node_selector == {"pool": "gpu"} and opts.image_pull_secrets == ["my-registry"]
    assert opts.resources == {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "32Gi"}}
    assert opts.project_resources == {"vision": {"requests": {"cpu": "4"}}}
    assert opts.automount_service_account_token is False
    pod = job_pod(opts=opts)
    assert restricted_violations(pod) == [] and pod["securityContext"]["fsGroup"] == 100
    assert pod["tolerations"] == [taint]
    assert c.GPUKubeSpawner.container_security_context["capabilities"] == {"drop": ["ALL"]}


def test_train_pods_are_fenced_like_workspaces() -> None:
    """The chart's NetworkPolicy with z2jh's (rendered from the real chart with
    helm/z2jh-values.yaml): a train pod reaches DNS, the gpupool API, another train pod and the
    internet; never the cloud metadata server, a private address, a workspace or the hub's own
    port; nothing but train pods reaches it."""
    from tests.cluster.install import HUB_NS, z2jh_rendered

    policies = [
        d for d in render({"hub": {"namespace": HUB_NS}}) + z2jh_rendered() if d["kind"] == "NetworkPolicy"
    ]
    for p in policies:
        p["metadata"].setdefault("namespace", HUB_NS)
    ns = {
        HUB_NS: {"kubernetes.io/metadata.name": HUB_NS},
        "kube-system": {"kubernetes.io/metadata.name": "kube-system"},
    }
    train = Pod(HUB_NS, {"app.kubernetes.io/managed-by": "gpupool", "gpupool.io/job-id": "j1"})
    other = Pod(HUB_NS, {"app.kubernetes.io/managed-by": "gpupool", "gpupool.io/job-id": "j2"})
    hub = Pod(HUB_NS, {"component": "hub", "app": "jupyterhub", "release": "jupyterhub"}, {"http": 8081})
    dns = Pod("kube-system", {"k8s-app": "kube-dns"})
    ws = Pod(
        HUB_NS,
        {
            "component": "singleuser-server",
            "app": "jupyterhub",
            "release": "jupyterhub",
            "hub.jupyter.org/network-access-hub": "true",
        },
        {"notebook-port": 8888},
    )
    assert allowed(policies, ns, train, hub, 8095)
    assert allowed(policies, ns, train, dns, 53)
    assert allowed(policies, ns, train, other, 29500)  # an elastic job's workers meet
    assert allowed(policies, ns, train, "142.250.1.1", 443)
    assert not allowed(policies, ns, train, "169.254.169.254", 80)
    assert not allowed(policies, ns, train, "10.1.2.3", 5432)
    assert not allowed(policies, ns, train, ws, 8888)
    assert not allowed(policies, ns, train, hub, 8081)
    assert not allowed(policies, ns, ws, train, 29500)
    closed = [
        d
        for d in render({"hub": {"namespace": HUB_NS}, "jobs": {"networkPolicy": {"internet": False}}})
        if d["kind"] == "NetworkPolicy"
    ]
    assert not allowed(closed, ns, train, "142.250.1.1", 443)


def test_a_kai_queues_quota_and_its_workspaces_decide_the_refusal() -> None:
    from gpupool.spawner.kube_objects import queue_held_milli, queue_quota_milli, queue_refusal

    def pod(name: str, queue: str, fraction: str = "0.25", **status) -> dict:
        return {
            "metadata": {
                "name": name,
                "labels": {"kai.scheduler/queue": queue},
                "annotations": {"gpu-fraction": fraction},
            },
            "spec": {"containers": [{"name": "notebook"}]},
            "status": status,
        }

    assert queue_quota_milli({"spec": {"resources": {"gpu": {"quota": 1}}}}) == 1000
    assert queue_quota_milli({"spec": {"resources": {"gpu": {"quota": -1}}}}) is None  # unlimited
    assert queue_quota_milli({"spec": {"resources": {"gpu": {"quota": "x"}}}}) is None
    pods = [
        pod("a", "vision"),
        pod("b", "vision", "0.5"),
        pod("done", "vision", phase="Succeeded"),
        pod("other", "nlp"),
        pod("me", "vision"),  # the server being started again
    ]
    held = queue_held_milli(pods, "vision", "kai.scheduler/queue", skip="me")
    assert held == 750
    assert queue_refusal("vision", 1000, held, 250) == ""
    assert "quota is 1 GPU and its workspaces hold 0.75" in queue_refusal("vision", 1000, held, 500)
    assert queue_refusal("vision", None, held, 4000) == ""
    # KAI holds only non-preemptible pods to the quota: the project's train pods (priority 50,
    # the chart's `train` class) borrowing the queue's GPUs do not count; a label overrides
    train = dict(pod("train", "vision", "1"), spec={"containers": [{"name": "t"}], "priority": 50})
    pinned = dict(pod("pinned", "vision", "1"), spec={"containers": [{"name": "t"}], "priority": 50})
    pinned["metadata"]["labels"]["kai.scheduler/preemptibility"] = "non-preemptible"
    workspace = dict(pod("ws", "vision"), spec={"containers": [{"name": "n"}], "priority": 100})
    assert queue_held_milli([*pods, train, workspace], "vision", "kai.scheduler/queue", skip="me") == 1000
    assert queue_held_milli([*pods, pinned], "vision", "kai.scheduler/queue", skip="me") == 1750
