"""When will it start, on KAI: the hub's forecast of KAI's order against KAI's real scheduler.

A small cluster (kwok nodes of 8 GPUs) runs KAI-Scheduler's real components (tests/cluster/kai.py:
scheduler, binder, pod grouper, queue controllers, admission), with three project queues under
one department as the chart renders them (guarantees of half, a quarter and a quarter of the
GPUs, no limits, over-quota weight 1). For each seed, train Jobs are submitted through
gpupool's controller in two waves, far more GPUs than the cluster has: jobs wait, KAI starts them as others end, and
reclaims GPUs lent over quota when the second wave comes. Each job runs its own drawn run time
(seeded) from the moment the benchmark sees its pod Running; then its container "exits" (our
kwok stage) and the Job completes. A pod KAI evicts is replaced; the job runs what it had left.

When a job starts waiting (still pending `WAITING_S` after it was submitted: KAI had its cycles
to start what fits), two estimates of its start are recorded, from what the hub knows then:

* gpupool's: `gpupool.kube.kai_forecast.forecast` on a snapshot built as the hub's
  `kai_estimates.kai_snapshot` builds it (the queues, the running jobs with their start and
  node, the pending jobs by submit time, nodes' GPUs, each project's mean run time);
* the fair baseline of benchmarks.eta: its position in the queue (by submit time, 1 = next) x
  the mean run time / the jobs running at that moment.

Both get the same history: each project's mean of its drawn run times (as a hub that has seen
such runs would hold; the baseline takes the mean over all of them). When the job's first pod
is seen Running, each estimate's absolute error is recorded; the verdict compares the medians
pooled over the seeds (3 by default, one after the other on the same cluster) and gives each
seed's ratio.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from kubernetes_asyncio import client, config

from benchmarks.kube.jobs import NS, prepare
from gpupool.gpu.sharing import KAISharing
from gpupool.kube import TrainJobSpec
from gpupool.kube.controller import KubeJobController
from gpupool.kube.kai_forecast import KaiJob, KaiQueue, KaiSnapshot, forecast
from tests.cluster import kai
from tests.cluster.plane import EXIT_CODE, ControlPlane
from tests.cluster.resources import Resources

DEPARTMENT = "department-bench"
# project -> (share of the cluster's GPUs guaranteed, GPUs per job, mean run time s, jobs per wave)
PROJECTS = {
    "vision": (0.5, 4, 40.0, 8),
    "nlp": (0.25, 2, 30.0, 8),
    "speech": (0.25, 1, 20.0, 10),
}
WAVE_GAP_S = 60.0  # the second wave comes this long after the first
WAITING_S = 3.0  # a job still pending this long after its submit is waiting
POLL_S = 0.5
TARGET = 0.5  # gpupool's median error at most this times the fair baseline's


@dataclass
class Job:
    id: str
    project: str
    gpus: int
    run_s: float  # drawn run time
    submitted: float = 0.0
    first_start: float | None = None
    running_since: float | None = None  # the current pod's start, as seen
    pod: str = ""
    node: str = ""
    ran_s: float = 0.0  # run time used by evicted pods
    done: bool = False
    estimates: list[tuple[float, float, float]] = field(default_factory=list)  # made at, ours, fair


def draw(seed: int, wave: int) -> list[Job]:
    """One wave's jobs, interleaved across the projects as users submit them."""
    rnd = random.Random(seed * 1000 + wave)
    jobs: list[Job] = []
    for project, (_, gpus, mean, count) in PROJECTS.items():
        for i in range(count):
            jobs.append(Job(f"e{seed}w{wave}{project[:2]}{i}", project, gpus, rnd.uniform(0.5, 1.5) * mean))
    rnd.shuffle(jobs)
    return jobs


def queues(gpus: int) -> list[dict]:
    """The department and project queues as the chart renders them (templates/queues.yaml)."""

    def queue(name: str, quota: float, parent: str = "") -> dict:
        spec: dict = {
            "displayName": name,
            "resources": {
                "gpu": {"quota": quota, "overQuotaWeight": 1, "limit": -1},
                "cpu": {"quota": -1, "overQuotaWeight": 1, "limit": -1},
                "memory": {"quota": -1, "overQuotaWeight": 1, "limit": -1},
            },
        }
        if parent:
            spec |= {"parentQueue": parent, "priority": 100}
        return {
            "apiVersion": "scheduling.run.ai/v2",
            "kind": "Queue",
            "metadata": {"name": name},
            "spec": spec,
        }

    return [queue(DEPARTMENT, gpus)] + [
        queue(p, share * gpus, DEPARTMENT) for p, (share, *_) in PROJECTS.items()
    ]


def snapshot(now: float, gpus: int, nodes: list[str], jobs: list[Job]) -> KaiSnapshot:
    """What the hub's kai_snapshot reads, from the benchmark's own view of the jobs."""
    qs = {p: KaiQueue(p, int(share * gpus * 1000), parent=DEPARTMENT) for p, (share, *_) in PROJECTS.items()}

    def kj(j: Job, running: bool) -> KaiJob:
        return KaiJob(
            j.id,
            j.project,
            j.gpus * 1000,
            submitted=j.submitted,
            started=j.running_since if running else None,
            placed=((j.node, j.gpus * 1000),) if running and j.node else (),
        )

    running = [kj(j, True) for j in jobs if j.running_since is not None and not j.done]
    pending = [kj(j, False) for j in jobs if j.running_since is None and not j.done and j.submitted]
    return KaiSnapshot(
        now,
        gpus * 1000,
        qs,
        running,
        pending,
        {p: mean for p, (_, _, mean, _) in PROJECTS.items()},
        parents={DEPARTMENT: KaiQueue(DEPARTMENT, gpus * 1000)},
        nodes={n: 8000 for n in nodes},
    )


async def run(plane: ControlPlane, nodes: int, seeds: list[int]) -> dict:
    """KAI started once; each seed's two waves replayed after the previous seed's jobs are done;
    errors pooled over the seeds, and each seed's medians kept (the range)."""
    gpus = nodes * 8
    t0 = time.perf_counter()
    kai.start(plane, Path(tempfile.mkdtemp(prefix="gpupool-bench-kai-")))
    print(f"KAI-Scheduler started in {time.perf_counter() - t0:.0f} s", flush=True)
    res = Resources(plane.client())
    opts = replace(prepare(res), queue="{project}")  # KAI's leaf queue: the job's project
    res.apply_all(queues(gpus))
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(plane.kubeconfig), client_configuration=cfg)
    out: dict = {"gpus": gpus, "seeds": {}}
    async with client.ApiClient(cfg) as api:
        ctl = KubeJobController(api, opts, KAISharing())
        await ctl.start()
        for seed in seeds:
            r = await replay(
                ctl, client.CoreV1Api(api), res, gpus, [f"gpu-node-{i}" for i in range(nodes)], seed
            )
            out["seeds"][seed] = r
            print(f"seed {seed}: {line(r)}", flush=True)
        await ctl.stop()
    res.http.close()
    for key in ("jobs", "done", "waited", "never", "evicted"):
        out[key] = sum(r[key] for r in out["seeds"].values())
    for key in ("ours", "fair", "waits"):
        out[key] = [v for r in out["seeds"].values() for v in r[key]]
    out["forecast_s"] = sum(r["forecast_s"] for r in out["seeds"].values())
    return out


async def replay(
    ctl: KubeJobController, core: client.CoreV1Api, res: Resources, gpus: int, names: list[str], seed: int
) -> dict:
    waves = [draw(seed, 0), draw(seed, 1)]
    jobs: list[Job] = []
    by_id: dict[str, Job] = {}
    mean_all = statistics.mean(j.run_s for w in waves for j in w)
    forecast_s = 0.0
    start = time.time()
    next_wave = 0
    deadline = start + 900
    while time.time() < deadline:
        now = time.time()
        if next_wave < len(waves) and now >= start + next_wave * WAVE_GAP_S:
            for j in waves[next_wave]:
                await ctl.submit(
                    TrainJobSpec(
                        id=j.id,
                        owner="bench",
                        project=j.project,
                        num_gpu=j.gpus,
                        gpu_milli=1000,
                        command=["python", "train.py"],
                        image="registry.example.org/train:1",
                    )
                )
                j.submitted = time.time()
                jobs.append(j)
                by_id[j.id] = j
            print(f"seed {seed} wave {next_wave}: {len(waves[next_wave])} jobs submitted", flush=True)
            next_wave += 1
        # the pods: which job runs where since when, and the ends that are due
        body = await core.list_namespaced_pod(NS, label_selector="gpupool.io/job-id")
        now = time.time()
        live: dict[str, tuple[str, str]] = {}
        for pod in body.items:
            j = by_id.get((pod.metadata.labels or {}).get("gpupool.io/job-id", ""))
            if j is None or j.done:
                continue
            if pod.status.phase == "Succeeded":
                j.done = True
                continue
            if pod.status.phase == "Running" and not pod.metadata.deletion_timestamp:
                live[j.id] = (pod.metadata.name, pod.spec.node_name or "")
        for j in jobs:
            if j.done:
                continue
            if j.id in live and j.pod != live[j.id][0]:  # a (new) pod of the job runs
                j.pod, j.node = live[j.id]
                j.running_since = now
                j.first_start = j.first_start or now
            elif j.id not in live and j.running_since is not None:  # evicted: it waits again
                j.ran_s += now - j.running_since
                j.running_since, j.pod = None, ""
            if j.running_since is not None and j.ran_s + now - j.running_since >= j.run_s and j.pod:
                res.http.patch(
                    f"/api/v1/namespaces/{NS}/pods/{j.pod}",
                    json={"metadata": {"annotations": {EXIT_CODE: "0"}}},
                    headers={"Content-Type": "application/merge-patch+json"},
                )
        # jobs that start waiting now: both estimates, from what is known now
        newly = [
            j for j in jobs if j.first_start is None and not j.estimates and now - j.submitted >= WAITING_S
        ]
        if newly:
            t1 = time.perf_counter()
            est = forecast(snapshot(now, gpus, names, jobs))
            forecast_s += time.perf_counter() - t1
            queue = sorted(
                (j for j in jobs if j.running_since is None and not j.done), key=lambda j: j.submitted
            )
            position = {j.id: k + 1 for k, j in enumerate(queue)}
            lanes = max(1, sum(j.running_since is not None and not j.done for j in jobs))
            for j in newly:
                ours = est[j.id].start if j.id in est and est[j.id].start is not None else now + 86400
                j.estimates.append((now, ours, now + position[j.id] * mean_all / lanes))
        if next_wave == len(waves) and all(j.done for j in jobs):
            break
        await asyncio.sleep(POLL_S)
    waited = [j for j in jobs if j.estimates and j.first_start is not None]
    return {
        "jobs": len(jobs),
        "done": sum(j.done for j in jobs),
        "waited": len(waited),
        "never": sum(1 for j in jobs if j.estimates and j.first_start is None),
        "ours": [abs(j.estimates[0][1] - j.first_start) for j in waited],
        "fair": [abs(j.estimates[0][2] - j.first_start) for j in waited],
        "waits": [j.first_start - j.estimates[0][0] for j in waited],
        "evicted": sum(j.ran_s > 0 for j in jobs),
        "forecast_s": forecast_s,
    }


def line(r: dict) -> str:
    """The verdict: medians pooled over the seeds, and each seed's ratio (the range)."""
    ours, fair = statistics.median(r["ours"]), statistics.median(r["fair"])
    met = ours <= TARGET * fair
    per = r.get("seeds") or {}
    ratios = [statistics.median(x["ours"]) / statistics.median(x["fair"]) for x in per.values()]
    spread = (
        f", per seed {min(ratios):.2f}-{max(ratios):.2f}x over {len(ratios)} seeds" if len(ratios) > 1 else ""
    )
    return (
        f"ETA median error {ours:.1f} s vs fair baseline {fair:.1f} s (= {ours / fair:.2f}x{spread};"
        f" target <= {TARGET}x: {'met' if met else 'NOT met'}; {r['waited']} jobs waited in KAI's real"
        f" scheduler, median wait {statistics.median(r['waits']):.0f} s)"
    )


def report(r: dict) -> None:
    print(
        f"ETA on KAI: {r['jobs']} jobs on {r['gpus']} GPUs, {r['done']} done, {r['waited']} waited"
        f" ({r['never']} never started), {r['evicted']} evicted by KAI's reclaim; forecast CPU"
        f" {r['forecast_s']:.2f} s in all"
    )
    for name in ("ours", "fair"):
        v = sorted(r[name])
        print(
            f"  |error| s {'gpupool (KAI forecast)' if name == 'ours' else 'fair baseline':24}"
            f" median {statistics.median(v):7.1f}  p90 {v[int(0.9 * (len(v) - 1))]:7.1f}"
        )
    print("kube " + line(r))
