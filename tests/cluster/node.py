"""A real Kubernetes node joined to the test control plane: containerd (Debian's) running pods
with runc, the CNI bridge plugin for pod networking, kubelet and kube-proxy built from
k8s.io/kubernetes at the plane's pin, and a device plugin of ours advertising virtual GPUs.

Unlike the kwok nodes beside it, code runs here: containers start from images built on this
machine (tests/cluster/images.py) and imported into containerd, pods get addresses on a bridge,
Services work through kube-proxy (nftables), and pod DNS through CoreDNS running as a pod.

What still stands in, and why:
- the GPUs: `nvidia.com/gpu` devices come from our device plugin (tests/cluster/go/deviceplugin),
  which speaks the kubelet's device-plugin API as NVIDIA's does but has no GPU behind it: a
  pod that asked for one gets `NVIDIA_VISIBLE_DEVICES` naming a fake UUID, and nothing else;
- containerd's `nvidia` runtime handler (what the GPU operator installs, and what KAI's admission
  puts on GPU pods) is plain runc here;
- the host is a VM with cgroup v1: the kubelet runs with `failCgroupV1: false`, and without
  CAP_SYS_RESOURCE (this VM withholds it) containerd is told `restrict_oom_score_adj`.

One node per machine at a time (its paths under /run, its bridge and the kubelet's
device-plugin folder are fixed): it holds the machine's exclusive slot (plane.exclusive()) while
it runs, as KAI does.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from tests.cluster import build
from tests.cluster.plane import ControlPlane, free_port
from tests.cluster.resources import Resources, until

NAME = "gpupool-node"
POD_CIDR = "10.244.0.0/24"
CLUSTER_DNS = "10.96.0.10"
RUN = Path("/run/gpupool-node")  # containerd's state and socket: short paths, gone at reboot
SOCKET = RUN / "containerd.sock"
CNI_BIN = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
PACKAGES = {"containerd": "containerd", "runc": "runc", "nft": "nftables", "iptables": "iptables"}
GPU_RESOURCE = "nvidia.com/gpu"


def missing() -> list[str]:
    """What this machine lacks to run the real node, each with how to get it (empty: all there)."""
    import os

    out = []
    if os.geteuid() != 0:
        out.append("root (containerd, the kubelet and kube-proxy manage mounts, cgroups and the network)")
    for tool, package in PACKAGES.items():
        if not shutil.which(tool):
            out.append(f"{tool} (apt-get install {package})")
    for plugin in ("bridge", "host-local", "loopback", "portmap"):
        if not (CNI_BIN / plugin).exists():
            out.append(f"the CNI plugin {plugin} in {CNI_BIN} (apt-get install containernetworking-plugins)")
    if not Path("/proc/sys/net/bridge/bridge-nf-call-iptables").exists():
        out.append(
            "the kernel's br_netfilter (modprobe br_netfilter): Services need bridged traffic filtered"
        )
    return out


def ctr(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ctr", "-a", str(SOCKET), "-n", "k8s.io", *args],
        capture_output=True,
        text=True,
        check=check,
        timeout=timeout,
    )


def old_images(refs: list[tuple[str, str]], current: set[str]) -> list[str]:
    """Of containerd's image references (name, manifest digest), those of builds other than
    `current`: gpupool.local/* under another tag, and id-named references (`sha256:...`) whose
    manifest no kept name points at."""
    kept = {
        digest
        for ref, digest in refs
        if not ref.startswith("sha256:") and (ref in current or not ref.startswith("gpupool.local/"))
    }
    return [
        ref
        for ref, digest in refs
        if (ref.startswith("gpupool.local/") and ref not in current)
        or (ref.startswith("sha256:") and digest not in kept)
    ]


@dataclass
class RealNode:
    plane: ControlPlane
    folder: Path
    bins: dict[str, Path]  # kubelet, kube-proxy, deviceplugin
    gpus: int = 2
    images: dict[str, Path] = field(default_factory=dict)  # reference -> OCI archive, imported at start
    name: str = NAME
    ip: str = ""
    holds_slot: bool = False  # the machine's exclusive slot, taken by start()

    # --- life cycle ------------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> RealNode:
        if problems := missing():
            raise RuntimeError("the real node cannot start here; missing: " + "; ".join(problems))
        self.ip = self.plane.host_ip
        if self.ip == "127.0.0.1":
            raise RuntimeError(
                "the real node needs a host address other than 127.0.0.1 (a default route): "
                "its pods reach the API server there"
            )
        self.folder.mkdir(parents=True, exist_ok=True)
        self.plane.exclusive()  # one real node per machine: its paths, bridge and device plugins are fixed
        self.holds_slot = True
        # what a killed run left: the kubelet's folders (pod volumes still mounted); its
        # containers are stopped by the new kubelet, which finds them unknown to the API server
        unmount_under(self.kubelet_dir)
        shutil.rmtree(self.kubelet_dir, ignore_errors=True)
        for knob in ("net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables"):
            Path("/proc/sys", knob).write_text("1")  # pod traffic is routed, bridged traffic filtered
        self._start_containerd(timeout)
        for ref, archive in self.images.items():
            self.load(ref, archive)
        self._forget_old_images()
        self._start_kubelet(timeout)
        self._start_kube_proxy()
        if "deviceplugin" in self.bins:
            self._start_device_plugin()
        with self.plane.client() as http:
            until(
                lambda: self.ready(http),
                timeout,
                f"node {self.name} Ready",
                lambda: self.plane.log_tail("kubelet"),
            )
            if "deviceplugin" in self.bins:
                until(
                    lambda: self.allocatable(http).get(GPU_RESOURCE) == str(self.gpus),
                    timeout,
                    f"{self.gpus} {GPU_RESOURCE} on {self.name}",
                    lambda: self.plane.log_tail("deviceplugin"),
                )
        return self

    def stop(self) -> None:
        """Pods first (the kubelet stops their containers and frees their addresses), then the
        node's processes; whatever a killed run left in containerd is removed here too."""
        with contextlib.suppress(httpx.HTTPError, AssertionError), self.plane.client() as http:
            # cordoned first, so that what a controller makes again is not started here
            http.patch(
                f"/api/v1/nodes/{self.name}",
                json={"spec": {"unschedulable": True}},
                headers={"Content-Type": "application/merge-patch+json"},
            )
            pods = http.get("/api/v1/pods", params={"fieldSelector": f"spec.nodeName={self.name}"}).json()
            for pod in pods.get("items", []):
                m = pod["metadata"]
                http.delete(
                    f"/api/v1/namespaces/{m['namespace']}/pods/{m['name']}",
                    params={"gracePeriodSeconds": "1"},
                )
            until(lambda: not self._sandboxes(), 20, "the node's pods to stop")  # then the rest is killed
        for name in ("deviceplugin", "kube-proxy", "kubelet"):
            self.plane.stop_process(name)
        if "kube-proxy" in self.bins:
            subprocess.run(
                [self.bins["kube-proxy"], "--cleanup", f"--config={self.folder / 'kube-proxy.yaml'}"],
                capture_output=True,
                timeout=60,
            )
        self._remove_containers()
        self.plane.stop_process("containerd")
        unmount_under(
            self.kubelet_dir
        )  # the kubelet makes its root folder a shared mount, pods' volumes below it
        with contextlib.suppress(httpx.HTTPError), self.plane.client() as http:
            http.delete(f"/api/v1/nodes/{self.name}")
        if self.holds_slot:
            self.plane.release_exclusive()
            self.holds_slot = False

    @property
    def kubelet_dir(self) -> Path:
        """The kubelet's root folder and pod logs: at a fixed place, so that the next run
        unmounts and removes what a killed one left."""
        return RUN / "kubelet"

    # --- containerd --------------------------------------------------------------------
    def _start_containerd(self, timeout: float) -> None:
        root = build.cache_root() / "node" / "containerd"  # kept: images stay imported between runs
        RUN.mkdir(parents=True, exist_ok=True)
        cni = self.folder / "cni"
        cni.mkdir(exist_ok=True)
        (cni / "10-gpupool.conflist").write_text(json.dumps(self.cni_config(), indent=1))
        runc = {"runtime_type": "io.containerd.runc.v2", "options": {"SystemdCgroup": False}}
        config = {
            "version": 2,
            "root": str(root),
            "state": str(RUN / "state"),
            "grpc": {"address": str(SOCKET)},
            "ttrpc": {"address": str(SOCKET) + ".ttrpc"},
            "plugins": {
                "io.containerd.grpc.v1.cri": {
                    "sandbox_image": self.pause_image,
                    "restrict_oom_score_adj": True,
                    "enable_cdi": False,
                    "containerd": {
                        "snapshotter": "overlayfs",
                        "default_runtime_name": "runc",
                        # the GPU operator's handler name, which KAI's admission sets on GPU pods
                        "runtimes": {"runc": runc, "nvidia": runc},
                    },
                    "cni": {"bin_dir": str(CNI_BIN), "conf_dir": str(cni), "max_conf_num": 1},
                }
            },
        }
        path = self.folder / "containerd.toml"
        path.write_text(_toml(config))
        self.plane._spawn("containerd", ["containerd", f"--config={path}"])
        self.plane._wait(
            lambda: ctr("version", check=False, timeout=5).returncode == 0, "containerd", timeout
        )

    pause_image: str = "gpupool.local/pause:catatonit"

    def cni_config(self) -> dict:
        return {
            "cniVersion": "1.0.0",
            "name": "gpupool",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "gpupool0",
                    "isGateway": True,
                    "ipMasq": True,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_CIDR}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(RUN / "ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }

    def load(self, ref: str, archive: Path) -> None:
        """Imports an image archive into containerd, unless the same image is there already."""
        listed = ctr("images", "ls", "-q", check=False).stdout.split()
        marker = archive.with_suffix(".imported")
        if ref in listed and marker.exists() and marker.read_text() == ref:
            return
        start = time.monotonic()
        proc = ctr("images", "import", str(archive), check=False)
        if proc.returncode:
            raise RuntimeError(f"importing {ref} into containerd failed: {proc.stderr[-2000:]}")
        marker.write_text(ref)
        print(f"imported {ref} in {time.monotonic() - start:.0f} s", flush=True)

    def _forget_old_images(self) -> None:
        """Removes the images of earlier builds (gpupool.local/*, other tags) from containerd,
        whose garbage collector then frees their layers: each change to gpupool makes new ones.
        The CRI plugin also names every image it saw by its id (`sha256:<config digest>`); those
        of old builds go too, else they keep every old build's layers (21 GB after a few days)."""
        proc = ctr("images", "ls", check=False)
        if proc.returncode:
            return
        refs = [(line.split()[0], line.split()[2]) for line in proc.stdout.splitlines()[1:] if line.strip()]
        for ref in old_images(refs, set(self.images)):
            ctr("images", "rm", ref, check=False)

    def _sandboxes(self) -> list[str]:
        proc = ctr("containers", "ls", "-q", check=False, timeout=30)
        return proc.stdout.split() if proc.returncode == 0 else []

    def _remove_containers(self) -> None:
        for cid in self._sandboxes():
            ctr("tasks", "kill", "-s", "SIGKILL", cid, check=False, timeout=30)
        for cid in self._sandboxes():
            ctr("tasks", "delete", "-f", cid, check=False, timeout=30)
            ctr("containers", "delete", cid, check=False, timeout=30)

    # --- kubelet -------------------------------------------------------------------------
    def _start_kubelet(self, timeout: float) -> None:
        pki = self.folder / "pki"
        certs = self.plane.certs
        client = certs.issue(pki, "kubelet-client", f"system:node:{self.name}", "system:nodes")
        serving = certs.issue(pki, "kubelet", self.name, server_ips=(self.ip,), server_names=(self.name,))
        kubeconfig = self.plane.write_kubeconfig(
            self.folder / "kubelet.kubeconfig",
            {"client-certificate": str(client[0]), "client-key": str(client[1])},
        )
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,  # this VM has cgroup v1 (1.35 refuses it unless told)
            "cgroupDriver": "cgroupfs",
            "containerRuntimeEndpoint": f"unix://{SOCKET}",
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(certs.ca)},
            },
            "authorization": {"mode": "Webhook"},
            "tlsCertFile": str(serving[0]),
            "tlsPrivateKeyFile": str(serving[1]),
            "address": self.ip,
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "clusterDomain": "cluster.local",
            "clusterDNS": [CLUSTER_DNS],
            "podLogsDir": str(self.kubelet_dir / "pod-logs"),
            "failSwapOn": False,
            "serializeImagePulls": False,
            "registerNode": True,
            # images come from no registry: never collect them
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "200Mi",
                "nodefs.available": "2%",
                "imagefs.available": "2%",
            },
            "podCIDR": POD_CIDR,
            "maxPods": 60,
            "shutdownGracePeriod": "0s",
        }
        path = self.folder / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config))
        self.plane._spawn(
            "kubelet",
            [
                self.bins["kubelet"],
                f"--config={path}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={self.kubelet_dir / 'root'}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.ip}",
                "--v=1",
                f"--node-labels={self.labels()}",
            ],
        )

    def labels(self) -> str:
        """What NVIDIA's GPU feature discovery would label the node with (the chart's node agent
        selects nvidia.com/gpu.present), for its virtual GPUs."""
        labels = {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.count": str(self.gpus),
            "nvidia.com/gpu.product": "Virtual-GPU",
            "nvidia.com/gpu.memory": "16384",
        }
        return ",".join(f"{k}={v}" for k, v in labels.items())

    def _start_kube_proxy(self) -> None:
        if "kube-proxy" not in self.bins:
            return
        crt, key = self.plane.certs.issue(self.folder / "pki", "kube-proxy", "system:kube-proxy")
        kubeconfig = self.plane.write_kubeconfig(
            self.folder / "kube-proxy.kubeconfig", {"client-certificate": str(crt), "client-key": str(key)}
        )
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "mode": "nftables",
            "hostnameOverride": self.name,
            "clusterCIDR": POD_CIDR,
            "healthzBindAddress": f"127.0.0.1:{free_port()}",
            "metricsBindAddress": f"127.0.0.1:{free_port()}",
            "conntrack": {"maxPerCore": 0, "min": 0},  # leave the host's conntrack sysctls alone
        }
        path = self.folder / "kube-proxy.yaml"
        path.write_text(yaml.safe_dump(config))
        self.plane._spawn("kube-proxy", [self.bins["kube-proxy"], f"--config={path}", "--v=1"])

    def _start_device_plugin(self) -> None:
        # the kubelet serves device plugins at /var/lib/kubelet/device-plugins whatever its --root-dir
        self.plane._spawn(
            "deviceplugin",
            [
                self.bins["deviceplugin"],
                "--kubelet-dir=/var/lib/kubelet",
                f"--gpus={self.gpus}",
                f"--node={self.name}",
            ],
        )

    # --- state ---------------------------------------------------------------------------
    def node(self, http: httpx.Client) -> dict:
        return Resources(http).get(f"/api/v1/nodes/{self.name}") or {}

    def ready(self, http: httpx.Client) -> bool:
        conds = self.node(http).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    def allocatable(self, http: httpx.Client) -> dict:
        return self.node(http).get("status", {}).get("allocatable", {})


def unmount_under(folder: Path) -> None:
    """Unmounts whatever is mounted under `folder`, deepest first (lazily if busy)."""
    prefix = str(folder.resolve()) + "/"
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")  # \040 for spaces
        if point.startswith(prefix) or point == prefix[:-1]:
            points.append(point)
    for point in sorted(set(points), key=len, reverse=True):
        if subprocess.run(["umount", point], capture_output=True).returncode:
            subprocess.run(["umount", "-l", point], capture_output=True)


def _toml(config: dict, prefix: str = "") -> str:
    """The little TOML containerd's config needs (tables, strings, booleans, numbers)."""
    scalars, tables = [], []
    for k, v in config.items():
        name = f'"{k}"' if "." in k else k
        if isinstance(v, dict):
            tables.append((f"{prefix}.{name}" if prefix else name, v))
        else:
            scalars.append(f"{name} = {json.dumps(v)}")
    out = "\n".join(scalars) + "\n"
    for name, table in tables:
        out += f"\n[{name}]\n" + _toml(table, name)
    return out
