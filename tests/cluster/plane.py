"""A real Kubernetes control plane on 127.0.0.1 for the cluster tests: etcd, kube-apiserver
(RBAC on, service-account tokens signed with a key made at test time), kube-controller-manager
(Job controller, garbage collector, namespace and service-account controllers), kube-scheduler
and kwok (fake GPU nodes; pods "run" through kwok's stages, no code runs in them).

kube-scheduler also serves a profile named `kai-scheduler` as a STAND-IN that only binds pods
to nodes, so that most tests need no KAI process; KAI's queues, fractions and reclaim are not
exercised by it. The tests of KAI itself (test_kai_real.py) start KAI-Scheduler's real
components (tests/cluster/kai.py) and take the stand-in away while they run: two schedulers
must not answer to one name.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import httpx
import yaml

from tests.cluster import build
from tests.cluster.certs import Certs, make_certs

SCHEDULER_STANDIN = "kai-scheduler"
KWOK_NODE = "kwok.x-k8s.io/node"
EXIT_CODE = "gpupool.test/exit-code"  # annotation read by our kwok stage: the container "exits" with it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


API_SERVICE_IP = "10.96.0.1"  # the `kubernetes` Service's address: the first of --service-cluster-ip-range


def host_ip() -> str:
    """The host's address on its default route (where a real node's pods reach the API server),
    or 127.0.0.1 where it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("203.0.113.1", 9))  # no packet is sent: only the route is looked up
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def machine_lock() -> TextIO:
    """The machine's one slot for components that cannot run twice on a machine: KAI's pod-group
    controller binds :8080 whatever flags it gets, so two checkouts' KAI (tests, benchmarks)
    would break each other. Planes themselves use free ports and run side by side; whoever starts
    such a component takes this first (`ControlPlane.exclusive`). Blocks until the holder lets go,
    saying who it is; the lock goes with the process, so a killed run never leaves it held."""
    path = build.cache_root() / "plane.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a+")  # noqa: SIM115 (held for the plane's life)
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        print(
            f"waiting for the control plane of another run on this machine to stop ({f.read().strip()})",
            flush=True,
        )
        fcntl.flock(f, fcntl.LOCK_EX)
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}, {' '.join(sys.argv)[:200]}\n")
    f.flush()
    return f


def kwok_module_dir() -> Path:
    """kwok's source in the Go module cache (its stage definitions are read from there)."""
    mod = (build.GO_DIR / "kwok" / "go.mod").read_text()
    version = re.search(r"sigs\.k8s\.io/kwok (v\S+)", mod).group(1)
    return Path(build.go_env()["GOMODCACHE"]) / f"sigs.k8s.io/kwok@{version}"


# Our stages beyond kwok's own, in the kubelet's place (no container runs: exits are simulated):
# - a running pod annotated with an exit code terminates with it (Failed, or Succeeded for 0);
# - a running pod being deleted gets SIGTERM: it ends with the code its annotation
#   SIGTERM_EXIT_CODE names (what its program does on SIGTERM; 143 = killed by it), as the
#   kubelet records a container that ended, then the pod goes once its finalizers are gone.
SIGTERM_EXIT_CODE = "gpupool.test/exit-code-on-sigterm"
_TERMINATED = """
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: {{ $code }}
            finishedAt: {{ $now | Quote }}
            reason: {{ if eq $code "0" }}Completed{{ else }}Error{{ end }}
            startedAt: {{ $now | Quote }}
      {{ end }}
      phase: {{ if eq $code "0" }}Succeeded{{ else }}Failed{{ end }}
"""
EXIT_STAGES = (
    (
        """
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: gpupool-test-exit}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: DoesNotExist}
    - {key: '.status.phase', operator: In, values: [Running]}
    - {key: '.metadata.annotations["@EXIT@"]', operator: Exists}
  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $code := index .metadata.annotations "@EXIT@" }}"""
        + _TERMINATED
        + """
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: gpupool-test-sigterm}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: Exists}
    - {key: '.status.phase', operator: In, values: [Running]}
  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $code := or (index (or .metadata.annotations dict) "@SIGTERM@") "143" }}"""
        + _TERMINATED
        + """
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: gpupool-test-delete}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: Exists}
    - {key: '.status.phase', operator: NotIn, values: [Running]}
  next:
    delete: true
"""
    )
    .replace("@EXIT@", EXIT_CODE)
    .replace("@SIGTERM@", SIGTERM_EXIT_CODE)
)


# The train pods' log on kwok's nodes: kwok serves this file (the CRI log format the kubelet
# reads, `write_pod_log`) as the log of every pod in the tests' hub namespace, followed as it grows.
POD_LOGS = """
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: ClusterLogs
metadata: {name: gpupool-test-train-logs}
spec:
  selector: {matchNamespaces: [jhub]}  # conftest.HUB_NS
  logs:
  - containers: [train]
    logsFile: "@FILE@"
    follow: true
"""


def pod_logs(path: Path) -> str:
    return POD_LOGS.replace("@FILE@", str(path))


def kwok_stages() -> str:
    """kwok's own node and pod stages from its module (nodes become Ready and keep a lease;
    bound pods run), plus ours. Not kwok's pod-complete: a Job's pod finishes only when a test
    says how; not its pod-delete: a deleted pod first ends as a SIGTERMed container does."""
    stage = kwok_module_dir() / "kustomize" / "stage"
    files = [
        stage / "node/fast/node-initialize.yaml",
        stage / "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
        stage / "pod/fast/pod-ready.yaml",
    ]
    return "\n---\n".join([f.read_text() for f in files] + [EXIT_STAGES])


@dataclass
class ControlPlane:
    folder: Path
    bins: dict[str, Path]
    certs: Certs | None = None
    url: str = ""
    kubeconfig: Path | None = None
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    lock: TextIO | None = None  # the machine-wide lock's open file while this plane holds it (exclusive())
    exclusive_users: int = 0  # who asked for it (KAI, the real node): held until the last lets go
    host_ip: str = "127.0.0.1"  # the address the API server advertises (the host's, when it has one)

    @property
    def pod_log(self) -> Path:
        """What every train pod in the hub's namespace printed, as kwok serves it (POD_LOGS)."""
        return self.folder / "train-pods.log"

    def write_pod_log(self, text: str) -> None:
        """Train pods print `text` (lines), in the CRI log format the kubelet keeps."""
        now = time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime())
        with self.pod_log.open("a") as f:
            f.writelines(f"{now} stdout F {line}\n" for line in text.splitlines())

    # --- life cycle ------------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> ControlPlane:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.host_ip = host_ip()
        self.certs = make_certs(
            self.folder / "pki", api_ips=tuple(dict.fromkeys(("127.0.0.1", API_SERVICE_IP, self.host_ip)))
        )
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        etcd = f"http://127.0.0.1:{etcd_port}"
        self._spawn(
            "etcd",
            [
                self.bins["etcd"],
                "--name=test",
                f"--data-dir={self.folder / 'etcd'}",
                f"--listen-client-urls={etcd}",
                f"--advertise-client-urls={etcd}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=test=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        self._wait(lambda: httpx.get(f"{etcd}/health", timeout=1).status_code == 200, "etcd", timeout)
        c = self.certs
        self.url = f"https://127.0.0.1:{api_port}"
        self._spawn(
            "kube-apiserver",
            [
                self.bins["kube-apiserver"],
                f"--etcd-servers={etcd}",
                f"--secure-port={api_port}",
                f"--cert-dir={self.folder / 'pki'}",
                *self._address_flags(),
                f"--tls-cert-file={c.server_cert}",
                f"--tls-private-key-file={c.server_key}",
                f"--client-ca-file={c.ca}",
                f"--service-account-key-file={c.sa_pub}",
                f"--service-account-signing-key-file={c.sa_key}",
                "--service-account-issuer=https://kubernetes.default.svc",
                # a real node's kubelet may touch only its own Node and its pods' objects, as on a cluster
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                # logs, exec and port-forward reach the real node's kubelet at its address, as the admin
                f"--kubelet-client-certificate={c.admin_cert}",
                f"--kubelet-client-key={c.admin_key}",
                "--kubelet-preferred-address-types=InternalIP",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--allow-privileged=true",
                "--v=0",
                # every pod and Job create, with its body: what a test says was never created is read here
                f"--audit-policy-file={self._audit_policy()}",
                f"--audit-log-path={self.folder / 'audit.log'}",
                "--audit-log-mode=blocking",
                # Job watches straight from etcd, compacted every few seconds: a watch resumed from an
                # old resourceVersion gets 410 Gone within seconds (the watch cache would keep minutes)
                "--watch-cache-sizes=jobs.batch#0",
                "--etcd-compaction-interval=3s",
            ],
        )
        self.kubeconfig = self.write_kubeconfig(
            self.folder / "admin.kubeconfig",
            {"client-certificate": str(c.admin_cert), "client-key": str(c.admin_key)},
        )
        self._wait(lambda: self.client().get("/readyz").status_code == 200, "kube-apiserver", timeout)
        self._spawn(
            "kube-controller-manager",
            [
                self.bins["kube-controller-manager"],
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--secure-port=0",
                f"--root-ca-file={c.ca}",
                f"--service-account-private-key-file={c.sa_key}",
                "--controllers=*",
                "--concurrent-job-syncs=10",
                "--v=0",
            ],
        )
        self.start_kube_scheduler(standin=True)
        stages = self.folder / "kwok.yaml"
        self.pod_log.touch()
        stages.write_text(kwok_stages() + pod_logs(self.pod_log))
        kubelet_port = free_port()
        self._spawn(
            "kwok",
            [
                self.bins["kwok"],
                f"--kubeconfig={self.kubeconfig}",
                f"-c={stages}",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE}=fake",
                # kwok's nodes answer the API server's `pods/log` as a kubelet does (pod_logs)
                f"--server-address=127.0.0.1:{kubelet_port}",
                "--node-ip=127.0.0.1",
                f"--node-port={kubelet_port}",
            ],
        )
        # the controller-manager is up when it has made the default namespace's service account
        self._wait(
            lambda: (
                self.client().get("/api/v1/namespaces/default/serviceaccounts/default").status_code == 200
            ),
            "kube-controller-manager",
            timeout,
        )
        return self

    def _address_flags(self) -> list[str]:
        """Where the API server listens and what it advertises: the host's own address (and
        127.0.0.1) when it has one, so that pods on the real node reach it through the
        `kubernetes` Service; else 127.0.0.1 alone, which may not be an Endpoints address."""
        if self.host_ip == "127.0.0.1":
            return [
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                "--endpoint-reconciler-type=none",
            ]
        return ["--bind-address=0.0.0.0", f"--advertise-address={self.host_ip}"]

    def start_kube_scheduler(self, standin: bool) -> None:
        """(Re)starts kube-scheduler: with the `kai-scheduler` stand-in profile, or, while the real
        KAI-Scheduler runs, with the default profile only."""
        self.stop_process("kube-scheduler")
        profiles = [{"schedulerName": "default-scheduler"}] + (
            [{"schedulerName": SCHEDULER_STANDIN}] if standin else []
        )
        sched = self.folder / "scheduler.yaml"
        sched.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {"kubeconfig": str(self.kubeconfig)},
                    "leaderElection": {"leaderElect": False},
                    "profiles": profiles,
                }
            )
        )
        self._spawn("kube-scheduler", [self.bins["kube-scheduler"], f"--config={sched}", "--secure-port=0"])

    def stop_process(self, name: str, grace: float = 10.0) -> None:
        """Stops one of the plane's processes (SIGTERM, then SIGKILL after `grace` s), if it runs."""
        proc = self.procs.pop(name, None)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _audit_policy(self) -> Path:
        path = self.folder / "audit-policy.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "audit.k8s.io/v1",
                    "kind": "Policy",
                    "omitStages": ["RequestReceived"],
                    "rules": [
                        {
                            "level": "Request",
                            "verbs": ["create"],
                            "resources": [
                                {"group": "", "resources": ["pods"]},
                                {"group": "batch", "resources": ["jobs"]},
                            ],
                        },
                        {"level": "None"},
                    ],
                }
            )
        )
        return path

    def created(self, resource: str, namespace: str) -> list[str]:
        """Names (a Job's pods: generateName prefixes) of the `resource` (pods, jobs) anyone asked
        the API server to create in `namespace` (from its audit log), refused requests included:
        what no test can miss by looking too late."""
        import json

        names = []
        for line in (self.folder / "audit.log").read_text().splitlines():
            event = json.loads(line)
            ref = event.get("objectRef") or {}
            if (
                ref.get("resource") == resource
                and ref.get("namespace") == namespace
                and not ref.get("subresource")
            ):
                meta = (event.get("requestObject") or {}).get("metadata") or {}
                names.append(meta.get("name") or meta.get("generateName", ""))  # a Job's pods: generateName
        return names

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()
        self.exclusive_users = 1  # whoever still held it: the plane is gone
        self.release_exclusive()

    def exclusive(self) -> None:
        """Takes the machine's slot for components that cannot run twice (see machine_lock):
        KAI, and the real node (fixed paths, the bridge, the kubelet's device-plugin folder).
        Each caller releases it once; it is held until the last one has."""
        if self.lock is None:
            self.lock = machine_lock()
        self.exclusive_users += 1

    def release_exclusive(self) -> None:
        self.exclusive_users = max(0, self.exclusive_users - 1)
        if self.lock is not None and self.exclusive_users == 0:
            self.lock.close()  # closing the file releases the flock
            self.lock = None

    def _spawn(self, name: str, argv: list, env: dict[str, str] | None = None) -> None:
        log = open(self.folder / f"{name}.log", "ab")  # noqa: SIM115 (lives as long as the process)
        self.procs[name] = subprocess.Popen(
            [str(a) for a in argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(env or {})},
            preexec_fn=_die_with_parent,
        )

    def _wait(self, ready, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited ({proc.returncode}):\n{self.log_tail(name)}")
            with contextlib.suppress(httpx.HTTPError, OSError):
                if ready():
                    return
            time.sleep(0.2)
        raise RuntimeError(f"{what} not ready in {timeout:.0f} s:\n{self.log_tail(what)}")

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.folder / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"

    # --- clients ---------------------------------------------------------------------
    def write_kubeconfig(self, path: Path, user: dict, namespace: str = "default") -> Path:
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "test",
                    "clusters": [
                        {
                            "name": "test",
                            "cluster": {"server": self.url, "certificate-authority": str(self.certs.ca)},
                        }
                    ],
                    "users": [{"name": "u", "user": user}],
                    "contexts": [
                        {"name": "test", "context": {"cluster": "test", "user": "u", "namespace": namespace}}
                    ],
                }
            )
        )
        path.chmod(0o600)
        return path

    def client(self, token: str | None = None) -> httpx.Client:
        """An HTTP client as the admin (client certificate), or as whoever `token` belongs to."""
        ctx = ssl.create_default_context(cafile=str(self.certs.ca))
        if token:
            return httpx.Client(
                base_url=self.url, verify=ctx, timeout=10, headers={"Authorization": f"Bearer {token}"}
            )
        ctx.load_cert_chain(str(self.certs.admin_cert), str(self.certs.admin_key))
        return httpx.Client(base_url=self.url, verify=ctx, timeout=10)

    def token(self, namespace: str, service_account: str, seconds: int = 3600) -> str:
        """A service-account token from the TokenRequest API, as a pod of that account gets one."""
        with self.client() as c:
            r = c.post(
                f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
                json={
                    "apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenRequest",
                    "spec": {"expirationSeconds": seconds},
                },
            )
            r.raise_for_status()
            return r.json()["status"]["token"]

    def sa_kubeconfig(self, path: Path, namespace: str, service_account: str) -> Path:
        return self.write_kubeconfig(path, {"token": self.token(namespace, service_account)}, namespace)


def _die_with_parent() -> None:
    """In the child: SIGTERM when the test process ends, however it ends (a timeout's SIGTERM or
    SIGKILL skips every finally), so no apiserver outlives its session."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").lower() not in ("", "0", "false", "no")
