"""Workspaces at scale: N users spawn one 0.25-GPU workspace each through GPUKubeSpawner
(kubespawner's own code, the hub's pool and quotas) next to bare pod creates of the same pod;
then one culler sampling pass over their pods through one node agent per kwok node."""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

from kubernetes_asyncio import client, config

from benchmarks.kube.common import GCClock, held_mib, pct, rss_mib
from gpupool.idle_culler.node_agent.server import Agent, file_token, make_handler
from gpupool.idle_culler.sampler import NodeAgentSampler, Target
from tests.cluster.plane import ControlPlane
from tests.cluster.resources import Resources

NS = "bench-ws"
# each baseline in a namespace of its own: kubespawner's reflectors (pods by label, events of every
# pod in the namespace) see only their own side's, so no side pays for another's events
STOCK_NS = "bench-ws-stock"
BARE_NS = "bench-ws-bare"
CONCURRENCY = 20  # spawns in flight at once, on each side
IMAGE = "quay.io/jupyter/base-notebook:2025-01-06"


def hub_config(plane: ControlPlane, db: Path, nodes: int):
    from traitlets.config import Config

    c = Config()
    c.GPUPool.db_url = f"sqlite:///{db}"
    c.GPUPool.use_nvml = False
    c.GPUPool.virtual_gpus = nodes * 8
    c.GPUPool.virtual_gpu_memory_mib = 81559
    c.GPUPool.default_build_quota = 0.5
    c.GPUPool.allowed_fractions = [0.25, 0.5, 1]
    c.KubeSpawner.namespace = NS
    c.KubeSpawner.k8s_api_host = plane.url
    c.KubeSpawner.k8s_api_ssl_ca_cert = str(plane.certs.ca)
    c.KubeSpawner.start_timeout = 300
    c.KubeSpawner.image = IMAGE
    c.GPUKubeSpawner.kai_queue = "default"
    return c


def spawner(c, root, user: str):
    """A GPUKubeSpawner of the hub whose composition root is `root` (gpupool.wiring.root: one pool for
    every spawner, as in a hub), which JupyterHub hands each User in its settings."""
    from gpupool.spawner.kube import GPUKubeSpawner
    from gpupool.wiring.root import ROOT_KEY

    hub = SimpleNamespace(
        public_host="", url="http://hub:8081/hub/", base_url="/hub/", api_url="http://hub:8081/hub/api"
    )
    u = SimpleNamespace(
        name=user, id=1, url=f"/user/{user}/", escaped_name=user, groups=[], settings={ROOT_KEY: root}
    )
    sp = GPUKubeSpawner(user=u, hub=hub, config=c)
    sp.api_token = "token"
    sp.user_options = {"gpus": "0.25"}
    return sp


FAILED: list[str] = []  # spawns that failed (an overloaded API server answers 504 to a create)


async def timed(
    sem: asyncio.Semaphore, start: Callable[[], Awaitable], failed: list[str] | None = None
) -> float:
    """Times `start()` once the semaphore lets it in. A callable, not a coroutine: KubeSpawner's
    start() schedules its work when called (asyncio.ensure_future), so passing `sp.start()`
    started all of them at once and timed only the wait behind the semaphore."""
    async with sem:
        t0 = time.perf_counter()
        try:
            await start()
        except Exception as err:  # noqa: BLE001 - counted and reported, the run goes on
            (FAILED if failed is None else failed).append(f"{type(err).__name__}: {str(err)[:200]}")
        return time.perf_counter() - t0


# The three sides take turns, each round in another order, so load that drifts and the pods
# already there hit all alike; each round gives one CPU-per-spawn ratio, and the verdict takes
# their median (one whole-run ratio moved with whatever else ran in a stretch).
ROUNDS = 10
SIDES = ("ours", "bare", "stock")


async def side_process(module: str, *args: str, first_line: bytes = b"") -> asyncio.subprocess.Process:
    """A baseline side in a process of its own (benchmarks.kube.bare_creates, .stock_spawns),
    once it says it is ready."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    if first_line:
        proc.stdin.write(first_line)
    if (await proc.stdout.readline()).strip() != b"ready":
        raise RuntimeError(f"{module} did not start")
    return proc


async def spawn_both(plane: ControlPlane, nodes: int, users: int, tmp: Path) -> dict:
    """`users` spawns through GPUKubeSpawner, as many bare pod creates and as many through
    KubeSpawner alone, the two baselines each in a process of its own
    (benchmarks.kube.bare_creates, .stock_spawns: neither their CPU nor their memory is the
    hub's), in ROUNDS rounds whose order rotates (the first round starts with ours: its first pod
    is the template of the bare creates). A side's rate is its spawns over the time it took in
    all; its CPU per spawn is its process's CPU over its rounds, per spawn, and per round."""
    from kubernetes_asyncio.config import kube_config
    from kubespawner import clients

    kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(plane.kubeconfig)
    clients.load_config.cache_clear()
    out: dict = {"rss_before": rss_mib()}
    from gpupool.wiring.root import GPUPoolHub

    c = hub_config(plane, tmp / "gpupool.sqlite", nodes)
    root = GPUPoolHub(c)  # one pool for every spawner, as in a hub
    root.pool  # noqa: B018 - built at the hub's start (gpupool.wiring.setup), not by its first spawn
    spawners = [spawner(c, root, f"u{i}") for i in range(users)]
    out["rss_spawners_made"] = rss_mib()
    sem = asyncio.Semaphore(CONCURRENCY)
    took = dict.fromkeys(SIDES, 0.0)
    cpu = dict.fromkeys(SIDES, 0.0)  # CPU seconds of the process that ran the side
    gc_cpu = dict.fromkeys(SIDES, 0.0)  # of which in the garbage collector
    clock = GCClock()
    per_round: dict[str, list[float]] = {side: [] for side in SIDES}  # CPU ms per spawn, each round
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(plane.kubeconfig), client_configuration=cfg)
    async with client.ApiClient(cfg) as api:
        core = client.CoreV1Api(api)
        procs: dict[str, asyncio.subprocess.Process] = {}  # the baselines' processes, once started

        async def start_baseline(side: str) -> asyncio.subprocess.Process:
            if side == "stock":
                return await side_process(
                    "benchmarks.kube.stock_spawns",
                    str(plane.kubeconfig),
                    plane.url,
                    str(plane.certs.ca),
                    STOCK_NS,
                )
            # the same pod as gpupool's first, created bare
            ref = api.sanitize_for_serialization(await core.read_namespaced_pod(spawners[0].pod_name, NS))
            template = {
                "spec": {k: v for k, v in ref["spec"].items() if k != "nodeName"},
                "labels": {k: v for k, v in ref["metadata"]["labels"].items() if k.startswith("kai.")},
                "annotations": ref["metadata"].get("annotations", {}),
            }
            return await side_process(
                "benchmarks.kube.bare_creates",
                str(plane.kubeconfig),
                BARE_NS,
                first_line=json.dumps(template).encode() + b"\n",
            )

        async def spawn(side: str, part: range) -> None:
            if side == "ours":
                t0, c0, g0 = time.perf_counter(), time.process_time(), clock.seconds
                times[side] += await asyncio.gather(*(timed(sem, spawners[i].start) for i in part))
                took[side] += time.perf_counter() - t0
                spent = time.process_time() - c0
                gc_cpu[side] += clock.seconds - g0
            else:
                if side not in procs:
                    procs[side] = await start_baseline(side)
                proc = procs[side]
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(f"{part.start} {part.stop}\n".encode())
                done = json.loads(await proc.stdout.readline())
                times[side] += done["times"]
                took[side] += done["took"]
                spent = done["cpu"]
                gc_cpu[side] += done["gc"]
                FAILED.extend(done.get("failed", []))
            cpu[side] += spent
            per_round[side].append(1000 * spent / max(len(part), 1))

        for r in range(ROUNDS):
            part = range(r * users // ROUNDS, (r + 1) * users // ROUNDS)
            for side in SIDES[r % 3 :] + SIDES[: r % 3]:
                await spawn(side, part)
            print(
                f"round {r + 1}/{ROUNDS}: {part.stop} spawns on each side; CPU ms per spawn"
                f" GPUKubeSpawner {per_round['ours'][-1]:.1f}, KubeSpawner alone {per_round['stock'][-1]:.1f},"
                f" bare {per_round['bare'][-1]:.1f}",
                flush=True,
            )
        out["rss_after"] = rss_mib()
        # kubespawner's pod reflector keeps every pod as the API server sent it
        out["held_pod_reflector"] = held_mib(spawners[0].pod_reflector.resources)
        out["pods_in_reflector"] = len(spawners[0].pod_reflector.resources)
        for proc in procs.values():
            proc.stdin.close()  # type: ignore[union-attr]
            await proc.wait()
    for side in SIDES:
        out[f"spawn_{side}_s"] = times[side]
        out[f"spawn_{side}_rate"] = users / took[side]
        out[f"spawn_{side}_cpu_ms"] = 1000 * cpu[side] / users
        out[f"spawn_{side}_cpu_ms_rounds"] = per_round[side]
        out[f"spawn_{side}_gc_ms"] = 1000 * gc_cpu[side] / users
    out["cpu_ratio_rounds"] = [o / k for o, k in zip(per_round["ours"], per_round["stock"], strict=True)]
    print(
        f"{users} spawns each: GPUKubeSpawner {took['ours']:.0f} s, bare pods {took['bare']:.0f} s,"
        f" KubeSpawner alone {took['stock']:.0f} s",
        flush=True,
    )
    out["pods"] = [
        (sp.pod_uid(), sp.pod_reflector.pods[f"{NS}/{sp.pod_name}"]["spec"]["nodeName"], sp.user.name)
        for sp in spawners
    ]
    for reflector in list(type(spawners[0]).reflectors.values()):
        await reflector.stop()
    return out


class Agents(ThreadingHTTPServer):
    """One node agent per kwok node, each at its own loopback address (127.0.x.y), served by one
    server that hands each connection to the agent of the address it arrived at."""

    daemon_threads = True

    def __init__(self, handlers: dict[str, type], port: int) -> None:
        self.handlers = handlers
        super().__init__(("0.0.0.0", port), BaseHTTPRequestHandler)

    def finish_request(self, request, client_address) -> None:
        self.handlers[request.getsockname()[0]](request, client_address, self)


class NoGPUProcesses:
    def process_samples(self) -> list:
        return []

    def device_samples(self) -> list:
        return []


def culler_pass(nodes: int, pods: list[tuple[str, str, str]], tmp: Path) -> dict:
    token = tmp / "token"
    token.write_text("bench-token-" + "x" * 40)
    by_node: dict[str, list[str]] = {}
    for uid, node, _user in pods:
        by_node.setdefault(node, []).append(uid)
    handlers, ips = {}, []
    for i in range(nodes):
        ip = f"127.0.{1 + i // 250}.{1 + i % 250}"
        proc = tmp / "proc" / str(i)
        proc.mkdir(parents=True)
        for pid, uid in enumerate(by_node.get(f"gpu-node-{i}", []), start=100):
            (proc / str(pid)).mkdir()
            (proc / str(pid) / "cgroup").write_text(
                f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/c\n"
            )
        agent = Agent(NoGPUProcesses(), proc)
        agent.refresh()
        handlers[ip] = make_handler(agent, file_token(token))
        ips.append(ip)
    server = Agents(handlers, 0)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        sampler = NodeAgentSampler(
            [f"http://agents.bench:{port}/pods"], resolve=lambda _h, _p: ips, token_file=str(token)
        )
        targets = [Target(user, "", pod_uid=uid) for uid, _node, user in pods]
        t0 = time.perf_counter()
        got = sampler.sample(targets)
        ours = time.perf_counter() - t0
        headers = {"Authorization": f"Bearer {token.read_text()}"}
        t0 = time.perf_counter()
        for ip in ips:  # the floor: the same requests, bodies read, nothing parsed
            with urllib.request.urlopen(
                urllib.request.Request(f"http://{ip}:{port}/pods", headers=headers), timeout=5
            ) as r:
                r.read()
        bare = time.perf_counter() - t0
    finally:
        server.shutdown()
        server.server_close()
    return {"culler_ours_s": ours, "culler_bare_s": bare, "culler_seen": (len(got), len(targets))}


async def run(plane: ControlPlane, nodes: int, users: int) -> dict:
    res = Resources(plane.client())
    for ns in (NS, STOCK_NS, BARE_NS):
        res.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    res.apply(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": "build"},
            "value": 100,
        }
    )
    res.http.close()
    tmp = Path(tempfile.mkdtemp(prefix="gpupool-bench-ws-"))
    out = await spawn_both(plane, nodes, users, tmp)
    out.update(culler_pass(nodes, out["pods"], tmp))
    out["users"], out["nodes"] = users, nodes
    return out


def cpu_ratio(r: dict) -> tuple[float, float, float]:
    """gpupool's CPU per spawn over KubeSpawner alone's: the median of the rounds' ratios, and
    their range."""
    ratios = r["cpu_ratio_rounds"]
    return statistics.median(ratios), min(ratios), max(ratios)


def report(r: dict) -> None:
    o, b, k = r["spawn_ours_s"], r["spawn_bare_s"], r["spawn_stock_s"]
    print(
        f"spawns/s ({CONCURRENCY} in flight)      GPUKubeSpawner {r['spawn_ours_rate']:6.2f}   KubeSpawner alone "
        f"{r['spawn_stock_rate']:6.2f}   bare pod create {r['spawn_bare_rate']:6.2f}"
    )
    print(
        f"CPU per spawn, ms (its process)  GPUKubeSpawner {r['spawn_ours_cpu_ms']:.1f}   KubeSpawner alone"
        f" {r['spawn_stock_cpu_ms']:.1f}   bare pod create {r['spawn_bare_cpu_ms']:.1f}   (of which garbage"
        f" collection {r['spawn_ours_gc_ms']:.1f} / {r['spawn_stock_gc_ms']:.1f} / {r['spawn_bare_gc_ms']:.1f})"
    )
    med, lo, hi = cpu_ratio(r)
    print(
        f"CPU per spawn, GPUKubeSpawner / KubeSpawner alone, each of {len(r['cpu_ratio_rounds'])} rounds:"
        f" {' '.join(f'{x:.2f}' for x in r['cpu_ratio_rounds'])} (median {med:.2f}x, range {lo:.2f}-{hi:.2f})"
    )
    print(
        f"spawn -> running, s p50/p90   GPUKubeSpawner {pct(o, 50):.2f}/{pct(o, 90):.2f}   KubeSpawner alone"
        f" {pct(k, 50):.2f}/{pct(k, 90):.2f}   bare pod create {pct(b, 50):.2f}/{pct(b, 90):.2f}"
    )
    print(
        f"culler sampling pass over {r['users']} pods on {r['nodes']} node agents, s: gpupool "
        f"{r['culler_ours_s']:.2f} (found {r['culler_seen'][0]} of {r['culler_seen'][1]})   bare GETs "
        f"{r['culler_bare_s']:.2f}"
    )
    if FAILED:
        print(f"failed spawns (all sides): {len(FAILED)}, e.g. {FAILED[0]}")
    print(
        f"RSS of this process, MiB      before spawning {r['rss_before']:.0f}   with {r['users']} workspaces "
        f"{r['rss_after']:.0f}   (of which making the {r['users']} spawner objects"
        f" {r['rss_spawners_made'] - r['rss_before']:.0f})"
    )
    print(
        f"held, MiB (sizeof walk)       kubespawner's pod reflector {r['held_pod_reflector']:.1f}"
        f" ({r['pods_in_reflector']} pods, as it keeps them)"
    )
