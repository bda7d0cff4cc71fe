"""The KubeSpawner-alone side of benchmarks.kube's workspace spawns, in a process of its own:
JupyterHub's KubeSpawner with the same settings and no gpupool, in a namespace of its own, so
that its CPU per spawn is measured the way gpupool's is (the process that ran the spawns, over
the same rounds) and neither its CPU nor its pod reflector's memory is counted as the hub's.
Its reflector sees only its own pods, as the hub's sees only gpupool's.

    python -m benchmarks.kube.stock_spawns KUBECONFIG API_URL CA_FILE NAMESPACE

stdin: lines "FIRST LAST" (servers k-FIRST … k-LAST-1 started); stdout: "ready", then one JSON
line per range: the seconds each spawn took, the range's wall time and this process's CPU
seconds over it (as benchmarks.kube.bare_creates). At the end of stdin its pods are left to the
plane (the run's plane is thrown away).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from types import SimpleNamespace

from benchmarks.kube.common import GCClock
from benchmarks.kube.workspaces import CONCURRENCY, IMAGE, timed


def stock_spawner(host: str, ca: str, namespace: str, user: str):
    """JupyterHub's KubeSpawner alone: what kubespawner's own machinery costs (its pod
    reflector, its backoff waits)."""
    from kubespawner import KubeSpawner
    from traitlets.config import Config

    c = Config()
    c.KubeSpawner.namespace = namespace
    c.KubeSpawner.k8s_api_host = host
    c.KubeSpawner.k8s_api_ssl_ca_cert = ca
    c.KubeSpawner.start_timeout = 300
    c.KubeSpawner.image = IMAGE
    hub = SimpleNamespace(
        public_host="", url="http://hub:8081/hub/", base_url="/hub/", api_url="http://hub:8081/hub/api"
    )
    u = SimpleNamespace(name=user, id=1, url=f"/user/{user}/", escaped_name=user, groups=[])
    sp = KubeSpawner(user=u, hub=hub, config=c)
    sp.api_token = "token"
    return sp


async def main(kubeconfig: str, host: str, ca: str, namespace: str) -> None:
    from kubernetes_asyncio.config import kube_config
    from kubespawner import clients

    kube_config.KUBE_CONFIG_DEFAULT_LOCATION = kubeconfig
    clients.load_config.cache_clear()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    sem = asyncio.Semaphore(CONCURRENCY)
    failed: list[str] = []
    clock = GCClock()
    print("ready", flush=True)
    while line := await reader.readline():
        first, last = map(int, line.split())
        # made before the clock starts, as the hub's spawners are (JupyterHub makes a User's
        # spawner when it loads the user, not as part of a start)
        spawners = [stock_spawner(host, ca, namespace, f"k{i}") for i in range(first, last)]
        t0, c0, g0 = time.perf_counter(), time.process_time(), clock.seconds
        times = await asyncio.gather(*(timed(sem, sp.start, failed) for sp in spawners))
        took, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(
            json.dumps(
                {"times": times, "took": took, "cpu": cpu, "gc": clock.seconds - g0, "failed": failed[:]}
            ),
            flush=True,
        )
        failed.clear()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
