"""The baseline side of benchmarks.kube's workspace spawns, in a process of its own: bare pod
creates awaited Running through one watch, CONCURRENCY in flight. Its own process so that the
baseline's allocations and CPU are not counted as the hub's (the memory target is the hub's).

    python -m benchmarks.kube.bare_creates KUBECONFIG NAMESPACE

stdin: one JSON line with the pod template (spec, labels, annotations), then lines "FIRST LAST"
(pods bare-FIRST … bare-LAST-1); stdout: "ready", then one JSON line per range: the seconds each
pod took, the range's wall time and this process's CPU seconds over it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from kubernetes_asyncio import client, config, watch

from benchmarks.kube.common import GCClock
from benchmarks.kube.workspaces import CONCURRENCY, timed


async def main(kubeconfig: str, namespace: str) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    template = json.loads(await reader.readline())
    cfg = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    async with client.ApiClient(cfg) as api:
        core = client.CoreV1Api(api)
        running: dict[str, asyncio.Future] = {}

        async def follow() -> None:
            w = watch.Watch(return_type="object")
            async with w.stream(
                core.list_namespaced_pod, namespace, label_selector="bench=bare", timeout_seconds=900
            ) as s:
                async for ev in s:
                    pod = ev["raw_object"]
                    fut = running.get(pod["metadata"]["name"])
                    if fut and not fut.done() and pod["status"].get("phase") == "Running":
                        fut.set_result(None)

        follower = asyncio.create_task(follow())
        await asyncio.sleep(0.5)
        sem = asyncio.Semaphore(CONCURRENCY)

        async def bare(i: int) -> None:
            name = f"bare-{i}"
            running[name] = loop.create_future()
            await core.create_namespaced_pod(
                namespace,
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "spec": template["spec"],
                    "metadata": {
                        "name": name,
                        "labels": {**template["labels"], "bench": "bare"},
                        "annotations": template["annotations"],
                    },
                },
            )
            await running[name]

        failed: list[str] = []
        clock = GCClock()
        print("ready", flush=True)
        while line := await reader.readline():
            first, last = map(int, line.split())
            t0, c0, g0 = time.perf_counter(), time.process_time(), clock.seconds
            times = await asyncio.gather(
                *(timed(sem, lambda i=i: bare(i), failed) for i in range(first, last))
            )
            took, cpu = time.perf_counter() - t0, time.process_time() - c0
            print(
                json.dumps(
                    {"times": times, "took": took, "cpu": cpu, "gc": clock.seconds - g0, "failed": failed[:]}
                ),
                flush=True,
            )
            failed.clear()
        follower.cancel()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
