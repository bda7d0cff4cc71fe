"""Train jobs at scale on the real control plane of tests/cluster (kube-apiserver, etcd, the Job
controller, kube-scheduler, kwok GPU nodes), gpupool's controller next to a baseline measured in
the same run on the same plane:

- submit: jobs/s through `KubeJobController.submit` (Job + code-free spec, a shared checkpoint
  claim) vs bare `create_namespaced_job` of the same manifests (kubernetes_asyncio);
- lag: from the moment a pod's container "exits" (kwok stage) to gpupool's job state
  `succeeded` (which waits for the Job controller's Complete condition) vs a bare pod watch
  seeing the pod Succeeded;
- the benchmark process's peak RSS (the controller's caches of every Job and pod).

    python -m benchmarks.kube [--nodes 100] [--jobs 200]

Needs Go (the control plane is built as for the tests). Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gpupool.kube import TrainJobSpec
from gpupool.kube.controller import KubeJobController
from gpupool.kube.objects import JobOptions, name_of, train_job
from kubernetes_asyncio import client, config, watch

from tests.cluster import build
from tests.cluster.plane import EXIT_CODE, ControlPlane
from tests.cluster.resources import Resources, gpu_node, until

NS = "bench"


def spec(i: int, prefix: str) -> TrainJobSpec:
    return TrainJobSpec(id=f"{prefix}{i}", owner="bench", project="default", num_gpu=1, gpu_milli=1000,
                        command=["python", "train.py"], image="registry.example.org/train:1")


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


async def run(plane: ControlPlane, jobs: int) -> dict:
    res = Resources(plane.client())
    res.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    res.apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "train"},
               "value": 50})  # KAI's chart installs it
    res.apply({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "bench"},
               "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "bench",
                        "hostPath": {"path": "/tmp/bench"}}})
    res.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "shared", "namespace": NS},
               "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "bench",
                        "resources": {"requests": {"storage": "1Gi"}}}})
    opts = JobOptions(namespace=NS, queue="default", checkpoint_claim="shared", ttl_after_finished_s=3600)
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(plane.kubeconfig), client_configuration=cfg)
    out: dict = {}
    async with client.ApiClient(cfg) as api:
        done_at: dict[str, float] = {}
        ctl = KubeJobController(api, opts, None, watch_timeout_s=300,
                                on_change=lambda jid, st: done_at.setdefault(jid, time.perf_counter())
                                if st.state == "succeeded" and jid.startswith("g") else None)
        await ctl.start()
        # submit: ours, then the bare create of the same manifests
        t0 = time.perf_counter()
        for i in range(jobs):
            await ctl.submit(spec(i, "g"))
        out["submit_ours"] = jobs / (time.perf_counter() - t0)
        batch = client.BatchV1Api(api)
        t0 = time.perf_counter()
        for i in range(jobs):
            await batch.create_namespaced_job(NS, train_job(spec(i, "b"), opts))
        out["submit_bare"] = jobs / (time.perf_counter() - t0)

        def running(prefix: str) -> list[dict]:
            pods = res.get(f"/api/v1/namespaces/{NS}/pods")["items"]
            return [p for p in pods if p["metadata"]["labels"].get("gpupool.io/job-id", "").startswith(prefix)
                    and p["status"].get("phase") == "Running"]

        until(lambda: len(running("g")) == jobs and len(running("b")) == jobs, 300, "every pod running")
        # lag: a bare pod watch next to gpupool's controller
        seen: dict[str, float] = {}

        async def bare_watch() -> None:
            w = watch.Watch()
            async with w.stream(client.CoreV1Api(api).list_namespaced_pod, NS,
                                label_selector="app.kubernetes.io/managed-by=gpupool") as stream:
                async for ev in stream:
                    pod = ev["raw_object"]
                    if pod["status"].get("phase") == "Succeeded":
                        seen.setdefault(pod["metadata"]["labels"]["gpupool.io/job-id"], time.perf_counter())

        watcher = asyncio.create_task(bare_watch())
        await asyncio.sleep(1)
        exited: dict[str, float] = {}
        for pod in running("g") + running("b"):
            jid = pod["metadata"]["labels"]["gpupool.io/job-id"]
            exited[jid] = time.perf_counter()
            res.http.patch(f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}",
                           json={"metadata": {"annotations": {EXIT_CODE: "0"}}},
                           headers={"Content-Type": "application/merge-patch+json"}).raise_for_status()
        deadline = time.monotonic() + 300
        while (len(done_at) < jobs or len(seen) < 2 * jobs) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        watcher.cancel()
        await ctl.stop()
        ours = [done_at[j] - exited[j] for j in done_at if j in exited]
        bare = [seen[j] - exited[j] for j in seen if j.startswith("g")]
        out.update(lag_ours_p50=pct(ours, 50), lag_ours_p90=pct(ours, 90), lag_bare_p50=pct(bare, 50),
                   lag_bare_p90=pct(bare, 90), finished=(len(done_at), jobs),
                   rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        await asyncio.gather(*(batch.delete_namespaced_job(name_of(spec(i, p).id), NS,
                                                           propagation_policy="Background")
                               for p in "gb" for i in range(jobs)), return_exceptions=True)
    res.http.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=100, help="kwok nodes of 8 GPUs")
    ap.add_argument("--jobs", type=int, default=200, help="train jobs per side (ours, bare)")
    args = ap.parse_args(argv)
    if args.jobs * 2 > args.nodes * 8:
        ap.error("every job needs a GPU: --nodes * 8 must be at least 2 * --jobs")
    plane = ControlPlane(Path(tempfile.mkdtemp(prefix="gpupool-bench-")), build.binaries())
    plane.start()
    try:
        with plane.client() as http:
            res = Resources(http)
            t0 = time.perf_counter()
            for i in range(args.nodes):
                res.apply(gpu_node(f"gpu-node-{i}"))
            print(f"{args.nodes} kwok nodes x 8 GPUs created in {time.perf_counter() - t0:.1f} s")
        r = asyncio.run(run(plane, args.jobs))
    finally:
        plane.stop()
    print(f"submit, jobs/s         gpupool {r['submit_ours']:7.1f}   bare create_namespaced_job {r['submit_bare']:7.1f}")
    print(f"exit -> seen, s p50    gpupool {r['lag_ours_p50']:7.2f}   bare pod watch {r['lag_bare_p50']:7.2f}")
    print(f"exit -> seen, s p90    gpupool {r['lag_ours_p90']:7.2f}   bare pod watch {r['lag_bare_p90']:7.2f}")
    print(f"jobs seen succeeded    {r['finished'][0]} of {r['finished'][1]}; peak RSS {r['rss_mib']:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
