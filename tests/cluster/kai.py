"""KAI-Scheduler's components as local processes against the test control plane.

Started as KAI's operator deploys them (pkg/operator/operands/*: the same flags), with what a
process outside the cluster needs instead: ports on 127.0.0.1 (or free ones where KAI binds all
interfaces), the plane's kubeconfig, and its admission webhook called by `url:` on 127.0.0.1
with the plane's own serving certificate (signed by the plane's CA, valid for 127.0.0.1).

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
what the flags below spell out), the queue controller's and pod-group controller's validating
webhooks are off (they need their own certificates; the CRDs' schemas still check every object),
no metrics servers, no leader election.
"""

from __future__ import annotations

import base64
import contextlib
import shutil
import threading
from pathlib import Path

import httpx
import yaml

from tests.cluster import build
from tests.cluster.plane import ControlPlane, free_port
from tests.cluster.resources import Resources

MODULE = "github.com/NVIDIA/KAI-scheduler"
SCHEDULER_NAME = "kai-scheduler"
NAMESPACE = "kai-scheduler"
RESERVATION_NS = "kai-resource-reservation"  # its namespace, service account and app label
SCALE_ADJUST_NS = "kai-scale-adjust"
GPU_INDEX = "run.ai/reserve_for_gpu_index"  # what the reservation pod's program writes
GPU_GROUP = "runai-gpu-group"  # the label the binder puts on a shared pod and its reservation pod
QUEUE_LABEL = "kai.scheduler/queue"
NODE_POOL_LABEL = "kai.scheduler/node-pool"
PROCESSES = ("kai-admission", "kai-binder", "kai-podgrouper", "kai-queuecontroller", "kai-podgroupcontroller",
             "kai-scheduler")
WEBHOOKS = (("mutating", "kai-admission"), ("validating", "kai-admission"))


def module_dir() -> Path:
    return build.download("kai", MODULE)


def crds() -> list[dict]:
    """KAI's CRDs from its module, as its chart installs them (deployments/kai-scheduler/crds)."""
    folder = module_dir() / "deployments" / "kai-scheduler" / "crds"
    return [yaml.safe_load(f.read_text()) for f in sorted(folder.glob("*.yaml"))]


def webhook_configurations(url: str, ca_bundle: str) -> list[dict]:
    """The two pod webhooks KAI's operator registers (operands/admission): all pods created
    outside kube-system and KAI's namespace, failurePolicy Fail."""
    common = {"admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail",
              "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                                          "values": ["kube-system", NAMESPACE]}]}}
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}
    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": "kai-admission"},
         "webhooks": [{**common, "name": "admission.run.ai", "reinvocationPolicy": "IfNeeded",
                       "clientConfig": {"url": f"{url}/mutate--v1-pod", "caBundle": ca_bundle},
                       "rules": [{**rule, "operations": ["CREATE"]}]}]},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": "kai-admission"},
         "webhooks": [{**common, "name": "admission.run.ai",
                       "clientConfig": {"url": f"{url}/validate--v1-pod", "caBundle": ca_bundle},
                       "rules": [{**rule, "operations": ["CREATE", "UPDATE"]}]}]},
    ]


def cluster_objects() -> list[dict]:
    """What KAI's chart and the GPU operator leave in a cluster that the processes rely on."""
    ns = lambda name: {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}  # noqa: E731
    return [ns(NAMESPACE), ns(RESERVATION_NS), ns(SCALE_ADJUST_NS),
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": RESERVATION_NS, "namespace": RESERVATION_NS}},
            # the admission webhook sets it on GPU pods (its default, the GPU operator's class)
            {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"},
             "handler": "nvidia"}]


def start(plane: ControlPlane, folder: Path, timeout: float = 90.0) -> None:
    """Installs what KAI needs on `plane`, takes kube-scheduler's stand-in profile away and
    starts KAI's processes (they join the plane's: logs beside theirs, stopped with them)."""
    folder.mkdir(parents=True, exist_ok=True)
    bins = build.optional("kai")
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
        res.apply_all(crds() + cluster_objects())
    plane.start_kube_scheduler(standin=False)
    env = {"KUBECONFIG": str(plane.kubeconfig)}
    plane._spawn("kai-admission", [
        bins / "admission", f"--scheduler-name={SCHEDULER_NAME}", f"--webhook-addr={webhook_port}",
        f"--health-probe-bind-address=127.0.0.1:{probes['admission']}", "--metrics-bind-address=0",
        "--gpu-sharing-enabled=true"], env={**env, "TMPDIR": str(folder / "tmp")})
    plane._spawn("kai-binder", [
        bins / "binder", f"--scheduler-name={SCHEDULER_NAME}", f"--resource-reservation-namespace={RESERVATION_NS}",
        f"--resource-reservation-service-account={RESERVATION_NS}", f"--resource-reservation-app-label={RESERVATION_NS}",
        "--resource-reservation-pod-image=ghcr.io/nvidia/kai-scheduler/resource-reservation:v0.12.0",
        f"--scale-adjust-namespace={SCALE_ADJUST_NS}", f"--health-probe-bind-address=127.0.0.1:{probes['binder']}",
        "--metrics-bind-address=0", "--cdi-enabled=false", "--resource-reservation-allocation-timeout=20"], env=env)
    plane._spawn("kai-podgrouper", [
        bins / "podgrouper", f"--scheduler-name={SCHEDULER_NAME}", f"--queue-label-key={QUEUE_LABEL}",
        f"--nodepool-label-key={NODE_POOL_LABEL}", "--metrics-bind-address=0",
        f"--health-probe-bind-address=127.0.0.1:{probes['podgrouper']}"], env=env)
    plane._spawn("kai-queuecontroller", [
        bins / "queuecontroller", f"--queue-label-key={QUEUE_LABEL}", "--metrics-listen-address=0",
        "--enable-webhook=false"], env=env)
    plane._spawn("kai-podgroupcontroller", [
        bins / "podgroupcontroller", f"--scheduler-name={SCHEDULER_NAME}", "--metrics-bind-address=0",
        f"--health-probe-bind-address=127.0.0.1:{probes['podgroupcontroller']}", "--enable-podgroup-webhook=false"],
        env=env)
    plane._spawn("kai-scheduler", [
        bins / "scheduler", f"--scheduler-name={SCHEDULER_NAME}", f"--namespace={NAMESPACE}",
        f"--nodepool-label-key={NODE_POOL_LABEL}", "--partition-label-value=",
        f"--resource-reservation-app-label={RESERVATION_NS}", f"--listen-address=127.0.0.1:{free_port()}",
        f"--plugin-server-port={free_port()}", "--update-pod-eviction-condition=true"], env=env)
    for name, port in probes.items():
        if name == "binder":  # it registers no readiness check: ready when its BindRequest workers run
            plane._wait(lambda: '"controller": "bindrequest"' in plane.log_tail("kai-binder", 10**6)
                        and "Starting workers" in plane.log_tail("kai-binder", 10**6), "kai-binder", timeout)
            continue
        plane._wait(lambda p=port: httpx.get(f"http://127.0.0.1:{p}/readyz", timeout=1).status_code == 200,
                    f"kai-{name}", timeout)
    with plane.client() as http:  # only now: with failurePolicy Fail, a pod create needs the server up
        Resources(http).apply_all(webhook_configurations(f"https://127.0.0.1:{webhook_port}", ca_bundle))


def stop(plane: ControlPlane) -> None:
    """The webhooks go first (with failurePolicy Fail no pod could be created without the
    server), then KAI's processes; kube-scheduler's stand-in comes back for the other tests."""
    with plane.client() as http:
        for kind, name in WEBHOOKS:
            http.delete(f"/apis/admissionregistration.k8s.io/v1/{kind}webhookconfigurations/{name}")
    for name in PROCESSES:  # all asked at once, then waited for one by one
        if (proc := plane.procs.get(name)) is not None and proc.poll() is None:
            proc.terminate()
    for name in PROCESSES:
        plane.stop_process(name)
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
            held = {p["metadata"]["annotations"][GPU_INDEX] for p in pods
                    if p["spec"].get("nodeName") == node and GPU_INDEX in (p["metadata"].get("annotations") or {})}
            gpus = int(http.get(f"/api/v1/nodes/{node}").json()["status"]["allocatable"].get("nvidia.com/gpu", "0"))
            free = next((f"GPU-{node}-{i}" for i in range(gpus) if f"GPU-{node}-{i}" not in held), None)
            if free is None:
                continue  # the device plugin would not have admitted it either
            r = http.patch(f"/api/v1/namespaces/{RESERVATION_NS}/pods/{meta['name']}",
                           json={"metadata": {"annotations": {GPU_INDEX: free}}},
                           headers={"Content-Type": "application/merge-patch+json"})
            if r.status_code < 400:
                self.annotated.append((meta["name"], free))
                pod["metadata"].setdefault("annotations", {})[GPU_INDEX] = free
