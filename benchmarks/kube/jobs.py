"""Train jobs at scale: gpupool's controller (kubespawner reflectors, level-triggered passes)
next to a bare pod watch and bare Job creates, in the same process on the same plane."""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import httpx
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from benchmarks.kube import accounting
from benchmarks.kube.common import held_mib, pct, rss_mib
from gpupool.kube import TrainJobSpec, pod_spans
from gpupool.kube.controller import KubeJobController
from gpupool.kube.objects import JobOptions, name_of, train_job
from gpupool.store import Store
from tests.cluster.plane import EXIT_CODE, ControlPlane
from tests.cluster.resources import Resources

NS = "bench"
log = logging.getLogger("benchmarks.kube")


def spec(i: int, prefix: str) -> TrainJobSpec:
    return TrainJobSpec(
        id=f"{prefix}{i}",
        owner="bench",
        project="default",
        num_gpu=1,
        gpu_milli=1000,
        command=["python", "train.py"],
        image="registry.example.org/train:1",
    )


def prepare(res: Resources) -> JobOptions:
    res.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    res.apply(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": "train"},
            "value": 50,
        }
    )  # KAI's chart installs it
    res.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": "bench"},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "bench",
                "hostPath": {"path": "/tmp/bench"},
            },
        }
    )
    res.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "shared", "namespace": NS},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "bench",
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }
    )
    return JobOptions(namespace=NS, queue="default", checkpoint_claim="shared", ttl_after_finished_s=3600)


async def bare_pod_watch(
    api: client.ApiClient,
    phases: dict[str, dict[str, float]],
    running: dict[str, str],
    lives: dict[str, list] | None = None,
) -> None:
    """The baseline observer: a plain pod watch, first time each job's pod is seen per phase;
    `running`: job id -> the name of its pod now running (the pods the benchmark ends); `lives`:
    each pod's true running interval (benchmarks.kube.accounting.observe)."""
    core = client.CoreV1Api(api)
    rv = None

    async def follow(w: watch.Watch) -> None:
        nonlocal rv
        kw = {"resource_version": rv} if rv else {}
        async with w.stream(
            core.list_namespaced_pod,
            NS,
            label_selector="app.kubernetes.io/managed-by=gpupool",
            timeout_seconds=600,
            **kw,
        ) as stream:
            async for ev in stream:
                pod = ev["raw_object"]
                if ev["type"] == "ERROR":  # the version is gone (410), said inside the stream
                    raise ApiException(status=pod.get("code", 500), reason=pod.get("message", ""))
                rv = pod["metadata"].get("resourceVersion", rv)
                jid = pod["metadata"].get("labels", {}).get("gpupool.io/job-id", "")
                now = time.perf_counter()
                if lives is not None:
                    accounting.observe(lives, pod, ev["type"] == "DELETED", time.time())
                phases.setdefault(pod["status"].get("phase", ""), {}).setdefault(jid, now)
                if pod["status"].get("phase") == "Running" and ev["type"] != "DELETED":
                    running[jid] = pod["metadata"]["name"]
                else:
                    running.pop(jid, None)
                if (
                    any(c.get("type") == "DisruptionTarget" for c in pod["status"].get("conditions") or [])
                    or ev["type"] == "DELETED"
                ):
                    phases.setdefault("Disrupted", {}).setdefault(jid, now)

    while True:
        try:
            await follow(watch.Watch())
        except (ApiException, aiohttp.ClientError, TimeoutError) as err:
            # a loaded API server drops or times out a watch: watch again, as any client does
            # (from a fresh list when the version is gone; an event seen twice changes nothing)
            if isinstance(err, ApiException) and err.status == 410:
                rv = None
            log.info("bare pod watch ended (%s): watching again", err)
            await asyncio.sleep(0.5)


SUBMITS_IN_FLIGHT = 16
RETRIED = (429, 500, 502, 503, 504)  # what a loaded API server answers that clients try again
TRIES = 8


async def patiently(send: Callable[[], httpx.Response], done: tuple[int, ...] = ()) -> httpx.Response:
    """One request the benchmark makes in another component's place (KAI's eviction, the
    kubelet's end of a container), retried as their clients do when a loaded API server times
    out or answers 429/5xx; `done`: statuses that mean it went through (a delete whose first try
    did, read as 404). Sent from a worker thread: the hub's event loop, whose lags are measured,
    is not held up by the benchmark's own requests."""
    for attempt in range(TRIES):
        try:
            r = await asyncio.to_thread(send)
        except httpx.TransportError as err:  # a read timeout among them
            if attempt == TRIES - 1:
                raise
            log.info("request failed (%s): trying again", err)
        else:
            if r.status_code < 400 or r.status_code in done:
                return r
            if r.status_code not in RETRIED or attempt == TRIES - 1:
                r.raise_for_status()
        await asyncio.sleep(min(0.25 * 2**attempt, 8))
    raise AssertionError("unreachable")


async def retrying(call: Callable[[], Awaitable[Any]], what: str) -> Any:
    """An API call of the hub (gpupool's submit) or of the baseline (a bare create), sent again
    when it fails for the API server's load, as the hub's training service sends a job again;
    both are idempotent here (submit keeps a Job its first try made; a bare create or delete that
    went through answers 409 or 404 the second time, which counts as done)."""
    for attempt in range(TRIES):
        try:
            return await call()
        except (ApiException, aiohttp.ClientError, TimeoutError) as err:
            if isinstance(err, ApiException) and err.status in (404, 409) and attempt:
                return None
            if isinstance(err, ApiException) and err.status not in RETRIED or attempt == TRIES - 1:
                raise
            log.info("%s failed (%s): trying again", what, err)
        await asyncio.sleep(min(0.25 * 2**attempt, 8))
    raise AssertionError("unreachable")


async def evict_as_kai(res: Resources, name: str) -> None:
    """KAI's eviction with --update-pod-eviction-condition: the condition, then the delete."""
    cond = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "PreemptionByScheduler",
        "message": "kai-scheduler: reclaimed",
        "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    await patiently(
        lambda: res.http.patch(
            f"/api/v1/namespaces/{NS}/pods/{name}/status",
            json={"status": {"conditions": [cond]}},
            headers={"Content-Type": "application/strategic-merge-patch+json"},
        )
    )
    await patiently(lambda: res.http.delete(f"/api/v1/namespaces/{NS}/pods/{name}"), done=(404,))


async def hub_usage(core: client.CoreV1Api, store: Store, every_s: float) -> None:
    """What the hub runs (TrainPool.record_usage) every `every_s`: list the train pods, record
    their GPU intervals in the store the usage ledger reads. A pass that fails is logged and the
    next one goes on, as the hub's periodic tasks do (gpupool.hub.tasks.every)."""
    while True:
        try:
            await pod_spans.relist(store, core, NS, pod_spans.readers_for(None))
        except (ApiException, aiohttp.ClientError, TimeoutError) as err:
            log.info("usage relist failed (%s): the next pass reads again", err)
        await asyncio.sleep(every_s)


async def relist_patiently(core: client.CoreV1Api, store: Store, until: int) -> None:
    """The last relist, up to `until`, tried again as the hub's next pass would."""
    for attempt in range(TRIES):
        try:
            await pod_spans.relist(store, core, NS, pod_spans.readers_for(None), until)
            return
        except (ApiException, aiohttp.ClientError, TimeoutError) as err:
            if attempt == TRIES - 1:
                raise
            log.info("usage relist failed (%s): trying again", err)
        await asyncio.sleep(min(0.25 * 2**attempt, 8))


async def run(
    plane: ControlPlane,
    jobs: int,
    bare_jobs: int,
    exits: int,
    wait_s: float,
    preempts: int = 20,
    then: Callable[[], Awaitable[dict]] | None = None,
    relist_s: float = 60.0,
) -> dict:
    """`then`: more work done while the controller still follows every Job (its figures are
    merged into the result), so that the process's memory counts both. `relist_s`: the hub's
    interval between lists of train pods for their GPU-hours (TrainPool.usage_relist_s)."""
    res = Resources(plane.client())
    opts = prepare(res)
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(plane.kubeconfig), client_configuration=cfg)
    out: dict = {"jobs": jobs}
    async with client.ApiClient(cfg) as api:
        ours: dict[str, dict[str, float]] = {}  # state -> job id -> first time gpupool said it
        bare: dict[str, dict[str, float]] = {}  # pod phase -> job id -> first time the bare watch saw it
        pod_of: dict[str, str] = {}  # job id -> its running pod, as the bare watch saw it

        def heard(jid: str, st) -> None:
            ours.setdefault(st.state, {}).setdefault(jid, time.perf_counter())
            if st.preemptions:
                ours.setdefault("preemption", {}).setdefault(jid, time.perf_counter())

        lives: dict[str, list] = {}  # pod uid -> [milli, start, end]: the truth of the GPU-hours
        watcher = asyncio.create_task(bare_pod_watch(api, bare, pod_of, lives))
        ctl = KubeJobController(api, opts, None, on_change=heard)
        await ctl.start()
        # the hub's usage of train pods: its relist (at the hub's default interval) into a store
        db = f"sqlite:///{tempfile.mkdtemp(prefix='gpupool-bench-usage-')}/usage.sqlite"
        core = client.CoreV1Api(api)
        relist = asyncio.create_task(hub_usage(core, Store(db), relist_s))
        out["rss_start"] = rss_mib()
        # the submit rates: gpupool's controller and bare creates of the same Job, one at a time,
        # in two alternating halves of `bare_jobs` each (same count, same stretch of load)
        batch = client.BatchV1Api(api)
        took = {"ours": 0.0, "bare": 0.0}
        t_all = time.perf_counter()
        for half in (range(0, bare_jobs // 2), range(bare_jobs // 2, bare_jobs)):
            t0 = time.perf_counter()
            for i in half:
                await retrying(lambda i=i: ctl.submit(spec(i, "g")), f"submit {i}")
            took["ours"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            for i in half:
                await retrying(
                    lambda i=i: batch.create_namespaced_job(NS, train_job(spec(i, "b"), opts)), f"create {i}"
                )
            took["bare"] += time.perf_counter() - t0
        out["submit_ours"] = bare_jobs / max(took["ours"], 1e-9)
        out["submit_bare"] = bare_jobs / max(took["bare"], 1e-9)
        for i in range(bare_jobs):  # the baseline's Jobs only cost the plane time from here on
            await retrying(
                lambda i=i: batch.delete_namespaced_job(
                    name_of(spec(i, "b").id), NS, propagation_policy="Background"
                ),
                f"delete {i}",
            )
        # the rest as users' submits reach a hub: many at once (one at a time took over half an
        # hour for 2,000 on a loaded 2-core machine)
        sem = asyncio.Semaphore(SUBMITS_IN_FLIGHT)

        async def submit(i: int) -> None:
            async with sem:
                await retrying(lambda i=i: ctl.submit(spec(i, "g")), f"submit {i}")

        await asyncio.gather(*(submit(i) for i in range(bare_jobs, jobs)))
        print(f"submitted {jobs} jobs through gpupool in {time.perf_counter() - t_all:.0f} s", flush=True)

        mine = {spec(i, "g").id for i in range(jobs)}
        deadline = time.monotonic() + wait_s
        while len(mine & set(ours.get("running", {}))) < jobs and time.monotonic() < deadline:
            await asyncio.sleep(1)
        ran = [j for j in mine if j in ours.get("running", {}) and j in bare.get("Running", {})]
        out["running"] = len(mine & set(ours.get("running", {})))
        out["lag_run"] = [ours["running"][j] - bare["Running"][j] for j in ran]
        out["rss_following"] = rss_mib()
        print(f"{out['running']} of {jobs} running; exiting {exits}", flush=True)

        # exits, paced: the kwok stage ends the container, the Job controller completes the Job
        exited: dict[str, float] = {}
        # the pods' names from the bare watch: a full list of 2,000 pods parsed here would stay in
        # this process's memory, which the benchmark counts as the hub's (it was ~70 MiB of it)
        targets = sorted((jid, name) for jid, name in pod_of.items() if jid in mine)
        for jid, name in targets[:exits]:
            exited[jid] = time.perf_counter()
            await patiently(
                lambda name=name: res.http.patch(
                    f"/api/v1/namespaces/{NS}/pods/{name}",
                    json={"metadata": {"annotations": {EXIT_CODE: "0"}}},
                    headers={"Content-Type": "application/merge-patch+json"},
                )
            )
            await asyncio.sleep(0.2)
        deadline = time.monotonic() + 120
        while len(set(exited) & set(ours.get("succeeded", {}))) < len(exited) and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        done = ours.get("succeeded", {})
        out["lag_exit_ours"] = [done[j] - exited[j] for j in exited if j in done]
        out["lag_exit_bare"] = [
            bare["Succeeded"][j] - exited[j] for j in exited if j in bare.get("Succeeded", {})
        ]
        out["exited"] = (len(out["lag_exit_ours"]), len(exited))

        # preemptions, paced: KAI's eviction of running pods of other jobs, while the hub is down
        # (its relist stopped; its store reopened after): a pod deleted meanwhile is closed at
        # the last list that saw it alive, as the hub documents
        relist.cancel()
        evicted: dict[str, float] = {}
        for jid, name in targets[exits : exits + preempts]:
            evicted[jid] = time.perf_counter()
            await evict_as_kai(res, name)
            await asyncio.sleep(0.2)
        deadline = time.monotonic() + 120
        while (
            len(set(evicted) & set(ours.get("preemption", {}))) < len(evicted) and time.monotonic() < deadline
        ):
            await asyncio.sleep(0.5)
        seen = ours.get("preemption", {})
        out["lag_preempt_ours"] = [seen[j] - evicted[j] for j in evicted if j in seen]
        out["lag_preempt_bare"] = [
            bare["Disrupted"][j] - evicted[j] for j in evicted if j in bare.get("Disrupted", {})
        ]
        out["preempted"] = (len(out["lag_preempt_ours"]), len(evicted))
        # the hub stays down until the evicted pods are gone from the API server (the harder
        # case: nothing is left for its relist to read their ends from), 60 s at most
        names = dict(targets[exits : exits + preempts])
        deadline = time.monotonic() + 60
        while names and time.monotonic() < deadline:
            for jid in list(names):
                got = await patiently(
                    lambda name=names[jid]: res.http.get(f"/api/v1/namespaces/{NS}/pods/{name}"), done=(404,)
                )
                if got.status_code == 404:
                    del names[jid]
            await asyncio.sleep(1)
        out["gone_while_down"] = len(evicted) - len(names)
        relist = asyncio.create_task(hub_usage(core, Store(db), relist_s))  # the hub restarted
        await asyncio.sleep(relist_s)  # the replacement pods run a while under the restarted hub
        relist.cancel()
        until = int(time.time())
        store = Store(db)
        await relist_patiently(core, store, until)
        counted, inexact = accounting.recorded(store, mine)
        truth = {uid: (m, a, b) for uid, (m, a, b, job) in lives.items() if job in mine and m > 0}
        out["accounting"] = (accounting.compare(counted, truth, until), inexact)
        out["rss_jobs"] = rss_mib()
        out["lists"] = {k: f.lists for k, f in ctl.reflectors.items()}
        seen: set[int] = set()  # the controller's copies share objects with the followers'
        out["held_followers"] = held_mib(*(f.resources for f in ctl.reflectors.values()), seen=seen)
        out["held_controller"] = held_mib(
            ctl.jobs, ctl.pods, ctl.statuses, ctl._seen, ctl._vanished, ctl.unseen, ctl.deleted, seen=seen
        )
        if then is not None:
            out.update(await then())
        watcher.cancel()
        await ctl.stop()
    res.http.close()
    return out


def report(r: dict) -> None:
    lag = r["lag_run"]
    print(
        f"submit, jobs/s                 gpupool {r['submit_ours']:7.1f}   bare create_namespaced_job "
        f"{r['submit_bare']:7.1f}"
    )
    print(f"pods running, seen by gpupool  {r['running']} of {r['jobs']}")
    print(
        f"pod Running -> job row running, s (after the bare watch saw it): p50 {pct(lag, 50):.2f}"
        f"  p90 {pct(lag, 90):.2f}  p99 {pct(lag, 99):.2f}  (n={len(lag)})"
    )
    o, b = r["lag_exit_ours"], r["lag_exit_bare"]
    print(
        f"exit -> seen, s p50/p90/p99    gpupool succeeded {pct(o, 50):.2f}/{pct(o, 90):.2f}/{pct(o, 99):.2f}"
        f"   bare pod watch Succeeded {pct(b, 50):.2f}/{pct(b, 90):.2f}/{pct(b, 99):.2f}"
        f"   ({r['exited'][0]} of {r['exited'][1]} seen)"
    )
    o, b = r["lag_preempt_ours"], r["lag_preempt_bare"]
    print(
        f"eviction -> preemption seen, s p50/p99  gpupool {pct(o, 50):.2f}/{pct(o, 99):.2f}   bare pod watch"
        f" {pct(b, 50):.2f}/{pct(b, 99):.2f}   ({r['preempted'][0]} of {r['preempted'][1]} seen)"
    )
    print(
        f"RSS of this process, MiB       controller started {r['rss_start']:.0f}   following "
        f"{r['jobs']} Jobs and pods {r['rss_following']:.0f}   after the exits and preemptions {r['rss_jobs']:.0f}"
        f"   (full lists: {r['lists']})"
    )
    print(
        f"held, MiB (sizeof walk)        gpupool's Job and pod followers {r['held_followers']:.1f}"
        f"   the controller's views and statuses {r['held_controller']:.1f}"
    )
    if "accounting" in r:
        print(
            accounting.line(*r["accounting"]),
            f"[{r['gone_while_down']} evicted pods gone while the hub was down]",
        )
