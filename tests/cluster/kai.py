"""KAI-Scheduler's components as local processes against the test control plane.

ONE PIN: tests/cluster/go/kai/go.mod names KAI's module path and version (the module moved
from github.com/NVIDIA/KAI-scheduler to github.com/kai-scheduler/KAI-scheduler at v0.13.1);
everything here derives from it (`pin()`): the CRDs read from that module, the flags each
version takes (`flags()`), the image names a cluster would run. A newer KAI is a new pin
(`python tests/cluster/build.py --repin kai <module>@<version>`), nothing else.

Started as KAI's operator deploys them (pkg/operator/operands/*: the same flags), with what a
process outside the cluster needs instead: ports on 127.0.0.1 (or free ones where KAI binds all
interfaces), the plane's kubeconfig, and its admission webhook called by `url:` on 127.0.0.1
with the plane's own serving certificate (signed by the plane's CA, valid for 127.0.0.1).

Scheduling shards: KAI's operator runs one scheduler per SchedulingShard, with
`--partition-label-value=<shard's partitionLabelValue>` and the shard's `spec.args` as flags
(operands/scheduler/resources_for_shard.go, buildArgsList). `start_shard` does the same for a
SchedulingShard object, KAI's default shard included (as KAI's chart renders it with
`--set-string scheduler.args.update-pod-eviction-condition=true`); a shard field the harness
does not translate (placement strategy, plugins, min runtime...) is refused, not ignored. The
scheduler's configuration is its built-in default, which is what the operator renders for a
shard with none of those fields (binpack; conf_util.defaultSchedulerConf).

What runs for real: the scheduler (allocate, consolidation, reclaim, preempt; with
--update-pod-eviction-condition, the flag gpupool's chart asks for), the binder (BindRequests,
the GPU-sharing plugin, reservation pods), the pod grouper (PodGroups from pods, queue label,
priority class), the queue and pod-group controllers (status) and the admission webhook (what a
fractional pod needs at creation: its GPU-sharing ConfigMap names and environment).

SIMULATED, and why: KAI reserves a shared GPU with a reservation pod in
`kai-resource-reservation` whose program reads NVML and annotates itself with the UUID of the
GPU the device plugin gave it. kwok pods run no program and there is no GPU here, so
`ReservationStandIn` does that one write: the lowest GPU index of the node that no other
reservation pod holds, as a fake UUID. Everything KAI decides from it is KAI's own.

Differences from a cluster install: no operator (its Config and SchedulingShard objects are
what the flags below spell out; the harness also writes the Deployment `pod-grouper` the
operator would make, with no replicas, so that gpupool reads KAI's version as on a cluster),
the queue controller's and pod-group controller's validating webhooks are off (they need their
own certificates; the CRDs' schemas still check every object), no metrics servers, no leader
election.
"""

from __future__ import annotations

import base64
import contextlib
import re
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from tests.cluster import build
from tests.cluster.plane import ControlPlane, free_port
from tests.cluster.resources import Resources

SCHEDULER_NAME = "kai-scheduler"
NAMESPACE = "kai-scheduler"
RESERVATION_NS = "kai-resource-reservation"  # its namespace, service account and app label
SCALE_ADJUST_NS = "kai-scale-adjust"
GPU_INDEX = "run.ai/reserve_for_gpu_index"  # what the reservation pod's program writes
GPU_GROUP = "runai-gpu-group"  # the label the binder puts on a shared pod and its reservation pod
QUEUE_LABEL = "kai.scheduler/queue"
NODE_POOL_LABEL = "kai.scheduler/node-pool"
WEBHOOKS = (("mutating", "kai-admission"), ("validating", "kai-admission"))
# KAI's default shard as its chart renders it with the install command docs/kubernetes.md gives
DEFAULT_SHARD = {
    "apiVersion": "kai.scheduler/v1",
    "kind": "SchedulingShard",
    "metadata": {"name": "default"},
    "spec": {"partitionLabelValue": "", "args": {"update-pod-eviction-condition": "true"}},
}
SHARD_FIELDS = {"partitionLabelValue", "args"}  # what start_shard translates


@dataclass(frozen=True)
class Pin:
    module: str  # github.com/kai-scheduler/KAI-scheduler
    version: str  # v0.13.1

    @property
    def release(self) -> tuple[int, int, int]:
        return tuple(int(x) for x in re.match(r"v(\d+)\.(\d+)\.(\d+)", self.version).groups())

    @property
    def registry(self) -> str:
        """Where that release's images live (named on objects only: kwok pulls nothing)."""
        return (
            "ghcr.io/nvidia/kai-scheduler"
            if self.module.startswith("github.com/NVIDIA/")
            else "ghcr.io/kai-scheduler/kai-scheduler"
        )


def pin() -> Pin:
    """KAI's module and version, from the one place they are written: go/kai/go.mod."""
    mod = (build.GO_DIR / "kai" / "go.mod").read_text()
    module = re.search(r"^\s*(?:tool\s+)?(\S+)/cmd/scheduler\s*$", mod, re.M).group(1)
    return Pin(module, build.module_version("kai", module))


def module_dir(download: bool = True) -> Path:
    """KAI's source at the pinned version in the Go module cache (downloaded if missing)."""
    return build.download("kai", pin().module) if download else build.module_dir("kai", pin().module)


def flags(component: str, p: Pin | None = None) -> list[str]:
    """The flags of `component` that depend on KAI's version."""
    p = p or pin()
    if component == "binder" and p.release < (0, 15, 0):
        return ["--cdi-enabled=false"]  # removed in v0.15 (it probes for CDI itself)
    if component == "queuecontroller" and p.release < (0, 13, 0):
        return [f"--queue-label-key={QUEUE_LABEL}"]  # removed in v0.13
    return []


def crds() -> list[dict]:
    """KAI's CRDs from its module, as its chart installs them (deployments/kai-scheduler/crds)."""
    folder = module_dir() / "deployments" / "kai-scheduler" / "crds"
    return [yaml.safe_load(f.read_text()) for f in sorted(folder.glob("*.yaml"))]


def webhook_configurations(url: str, ca_bundle: str) -> list[dict]:
    """The two pod webhooks KAI's operator registers (operands/admission): all pods created
    outside kube-system and KAI's namespace, failurePolicy Fail."""
    common = {
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "namespaceSelector": {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": ["kube-system", NAMESPACE],
                }
            ]
        },
    }
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "kai-admission"},
            "webhooks": [
                {
                    **common,
                    "name": "admission.run.ai",
                    "reinvocationPolicy": "IfNeeded",
                    "clientConfig": {"url": f"{url}/mutate--v1-pod", "caBundle": ca_bundle},
                    "rules": [{**rule, "operations": ["CREATE"]}],
                }
            ],
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "kai-admission"},
            "webhooks": [
                {
                    **common,
                    "name": "admission.run.ai",
                    "clientConfig": {"url": f"{url}/validate--v1-pod", "caBundle": ca_bundle},
                    "rules": [{**rule, "operations": ["CREATE", "UPDATE"]}],
                }
            ],
        },
    ]


def cluster_objects(p: Pin) -> list[dict]:
    """What KAI's chart, its operator and the GPU operator leave in a cluster that the processes
    (and gpupool) rely on."""
    ns = lambda name: {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}  # noqa: E731
    return [
        ns(NAMESPACE),
        ns(RESERVATION_NS),
        ns(SCALE_ADJUST_NS),
        operator_deployment("pod-grouper", "podgrouper", p),
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": RESERVATION_NS, "namespace": RESERVATION_NS},
        },
        # what the reservation pod's program may do: annotate its own pod (KAI's chart's rbac/)
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": RESERVATION_NS},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["pods"],
                    "verbs": ["get", "list", "patch", "update", "watch"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": RESERVATION_NS, "namespace": RESERVATION_NS},
            "subjects": [{"kind": "ServiceAccount", "name": RESERVATION_NS, "namespace": RESERVATION_NS}],
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": RESERVATION_NS,
            },
        },
        # the admission webhook sets it on GPU pods (its default, the GPU operator's class)
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": "nvidia"},
            "handler": "nvidia",
        },
    ]


def operator_deployment(name: str, image: str, p: Pin) -> dict:
    """A Deployment as KAI's operator makes it for a component (operands/*/resources.go: the
    image <registry>/<name>:<version>), with no replicas: the process runs beside the plane."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": name, "image": f"{p.registry}/{image}:{p.version}"}]},
            },
        },
    }


def start_shard(plane: ControlPlane, shard: dict) -> str:
    """A scheduler for a SchedulingShard object, as KAI's operator starts one (the shard is also
    applied, so that what reads shards sees it); returns its process name."""
    spec, name = shard.get("spec") or {}, shard["metadata"]["name"]
    untranslated = set(spec) - SHARD_FIELDS
    if untranslated:
        raise ValueError(f"SchedulingShard {name}: the harness does not translate {sorted(untranslated)}")
    with plane.client() as http:
        Resources(http).apply(shard)
    process = SCHEDULER_NAME if name == "default" else f"{SCHEDULER_NAME}-{name}"
    args = [f"--{k}={v}" for k, v in sorted((spec.get("args") or {}).items())]
    plane._spawn(
        process,
        [
            build.optional("kai") / "scheduler",
            f"--scheduler-name={SCHEDULER_NAME}",
            f"--namespace={NAMESPACE}",
            f"--nodepool-label-key={NODE_POOL_LABEL}",
            f"--partition-label-value={spec.get('partitionLabelValue', '')}",
            f"--resource-reservation-app-label={RESERVATION_NS}",
            f"--listen-address=127.0.0.1:{free_port()}",
            f"--plugin-server-port={free_port()}",
            *args,
        ],
        env={"KUBECONFIG": str(plane.kubeconfig)},
    )
    return process


def start(plane: ControlPlane, folder: Path, timeout: float = 90.0, reservation_image: str = "") -> None:
    """Installs what KAI needs on `plane`, takes kube-scheduler's stand-in profile away and
    starts KAI's processes (they join the plane's: logs beside theirs, stopped with them)."""
    folder.mkdir(parents=True, exist_ok=True)
    bins, p = build.optional("kai"), pin()
    plane.exclusive()  # one KAI per machine: its pod-group controller binds :8080
    webhook_port = free_port()
    probes = {name: free_port() for name in ("admission", "binder", "podgrouper", "podgroupcontroller")}
    # controller-runtime's webhook server reads its certificate from $TMPDIR/k8s-webhook-server/serving-certs
    certs = folder / "tmp" / "k8s-webhook-server" / "serving-certs"
    certs.mkdir(parents=True, exist_ok=True)
    shutil.copy(plane.certs.server_cert, certs / "tls.crt")
    shutil.copy(plane.certs.server_key, certs / "tls.key")
    ca_bundle = base64.b64encode(plane.certs.ca.read_bytes()).decode()
    with plane.client() as http:
        res = Resources(http)
        res.apply_all(crds() + cluster_objects(p))
    plane.start_kube_scheduler(standin=False)
    env = {"KUBECONFIG": str(plane.kubeconfig)}
    plane._spawn(
        "kai-admission",
        [
            bins / "admission",
            f"--scheduler-name={SCHEDULER_NAME}",
            f"--webhook-addr={webhook_port}",
            f"--health-probe-bind-address=127.0.0.1:{probes['admission']}",
            "--metrics-bind-address=0",
            "--gpu-sharing-enabled=true",
        ],
        env={**env, "TMPDIR": str(folder / "tmp")},
    )
    plane._spawn(
        "kai-binder",
        [
            bins / "binder",
            f"--scheduler-name={SCHEDULER_NAME}",
            f"--resource-reservation-namespace={RESERVATION_NS}",
            f"--resource-reservation-service-account={RESERVATION_NS}",
            f"--resource-reservation-app-label={RESERVATION_NS}",
            # KAI's image by default; a real node runs a locally built stand-in (no NVML there)
            f"--resource-reservation-pod-image={reservation_image or f'{p.registry}/resource-reservation:{p.version}'}",
            f"--scale-adjust-namespace={SCALE_ADJUST_NS}",
            f"--health-probe-bind-address=127.0.0.1:{probes['binder']}",
            "--metrics-bind-address=0",
            "--resource-reservation-allocation-timeout=20",
            *flags("binder", p),
        ],
        env=env,
    )
    plane._spawn(
        "kai-podgrouper",
        [
            bins / "podgrouper",
            f"--scheduler-name={SCHEDULER_NAME}",
            f"--queue-label-key={QUEUE_LABEL}",
            f"--nodepool-label-key={NODE_POOL_LABEL}",
            "--metrics-bind-address=0",
            f"--health-probe-bind-address=127.0.0.1:{probes['podgrouper']}",
        ],
        env=env,
    )
    plane._spawn(
        "kai-queuecontroller",
        [
            bins / "queuecontroller",
            "--metrics-listen-address=0",
            "--enable-webhook=false",
            *flags("queuecontroller", p),
        ],
        env=env,
    )
    plane._spawn(
        "kai-podgroupcontroller",
        [
            bins / "podgroupcontroller",
            f"--scheduler-name={SCHEDULER_NAME}",
            "--metrics-bind-address=0",
            f"--health-probe-bind-address=127.0.0.1:{probes['podgroupcontroller']}",
            "--enable-podgroup-webhook=false",
        ],
        env=env,
    )
    start_shard(plane, DEFAULT_SHARD)
    for name, port in probes.items():
        if name == "binder":  # it registers no readiness check: ready when its BindRequest workers run
            plane._wait(
                lambda: (
                    '"controller": "bindrequest"' in plane.log_tail("kai-binder", 10**6)
                    and "Starting workers" in plane.log_tail("kai-binder", 10**6)
                ),
                "kai-binder",
                timeout,
            )
            continue
        plane._wait(
            lambda p=port: httpx.get(f"http://127.0.0.1:{p}/readyz", timeout=1).status_code == 200,
            f"kai-{name}",
            timeout,
        )
    with plane.client() as http:  # only now: with failurePolicy Fail, a pod create needs the server up
        Resources(http).apply_all(webhook_configurations(f"https://127.0.0.1:{webhook_port}", ca_bundle))


def stop(plane: ControlPlane) -> None:
    """The webhooks go first (with failurePolicy Fail no pod could be created without the
    server), then KAI's processes; kube-scheduler's stand-in comes back for the other tests."""
    with plane.client() as http:
        for kind, name in WEBHOOKS:
            http.delete(f"/apis/admissionregistration.k8s.io/v1/{kind}webhookconfigurations/{name}")
    names = [n for n in plane.procs if n.startswith("kai-")]  # the components and every shard's scheduler
    for name in names:  # all asked at once, then waited for one by one
        if (proc := plane.procs.get(name)) is not None and proc.poll() is None:
            proc.terminate()
    for name in names:  # they keep no state a test needs: a short grace, then SIGKILL
        plane.stop_process(name, grace=3)
    plane.release_exclusive()
    plane.start_kube_scheduler(standin=True)


class ReservationStandIn:
    """The one write of KAI's reservation pod program (see the module docstring): a bound
    reservation pod gets the UUID of a GPU of its node that no other reservation pod holds."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane, self.stopped = plane, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="kai-reservation-stand-in")
        self.annotated: list[tuple[str, str]] = []  # (pod, uuid), what it wrote

    def __enter__(self) -> ReservationStandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join(10)

    def _run(self) -> None:
        with self.plane.client() as http:
            while not self.stopped.wait(0.2):
                with contextlib.suppress(httpx.HTTPError):
                    self._pass(http)

    def _pass(self, http: httpx.Client) -> None:
        pods = http.get(f"/api/v1/namespaces/{RESERVATION_NS}/pods").json().get("items", [])
        for pod in pods:
            meta, node = pod["metadata"], pod["spec"].get("nodeName")
            if not node or GPU_INDEX in (meta.get("annotations") or {}) or meta.get("deletionTimestamp"):
                continue
            held = {
                p["metadata"]["annotations"][GPU_INDEX]
                for p in pods
                if p["spec"].get("nodeName") == node and GPU_INDEX in (p["metadata"].get("annotations") or {})
            }
            gpus = int(
                http.get(f"/api/v1/nodes/{node}").json()["status"]["allocatable"].get("nvidia.com/gpu", "0")
            )
            free = next((f"GPU-{node}-{i}" for i in range(gpus) if f"GPU-{node}-{i}" not in held), None)
            if free is None:
                continue  # the device plugin would not have admitted it either
            r = http.patch(
                f"/api/v1/namespaces/{RESERVATION_NS}/pods/{meta['name']}",
                json={"metadata": {"annotations": {GPU_INDEX: free}}},
                headers={"Content-Type": "application/merge-patch+json"},
            )
            if r.status_code < 400:
                self.annotated.append((meta["name"], free))
                pod["metadata"].setdefault("annotations", {})[GPU_INDEX] = free
