"""Train Jobs through the real kube-apiserver and Job controller, created and watched by
gpupool's controller with the chart's hub service account (its Role is all it may use).

What is real: admission, RBAC, the Job controller's podFailurePolicy and pod replacement, the
garbage collector, the PV controller binding the checkpoint claim, scheduling onto kwok GPU
nodes (kube-scheduler standing in for KAI, see plane.py; KAI's own reclaim of a train pod is in
test_kai_real.py). What is simulated: inside a
container nothing runs, so its exit is one of our kwok stages (plane.py: an exit code on
request, or the code a deleted pod's program returns on SIGTERM), with the code a REAL local
run of the checkpoint helper returned; KAI's eviction is done as KAI does it: with
--update-pod-eviction-condition a DisruptionTarget condition then the delete, without it the
delete alone.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kubernetes_asyncio import client, config

from gpupool.kube import TrainJobSpec
from gpupool.kube.controller import KubeJobController
from gpupool.kube.objects import JobOptions, name_of
from gpupool.kube.status import JobStatus
from gpupool.train.code import JobCode
from gpupool.train.request import JobRequest
from tests.cluster.conftest import HUB_NS
from tests.cluster.plane import EXIT_CODE, SIGTERM_EXIT_CODE, ControlPlane
from tests.cluster.resources import Resources
from tests.support.wait import until_async

STORAGE = "gpupool-test"  # a class with no provisioner: the test makes one PV per claim
OPTS = JobOptions(
    namespace=HUB_NS,
    queue="{project}",
    storage_class=STORAGE,
    checkpoint_size="1Gi",
    grace_s=5,
    ttl_after_finished_s=600,
)


def checkpoint_helper_exit_code(tmp_path: Path) -> int:
    """A real process: the documented checkpoint loop, SIGTERMed mid-run, and how it exits."""
    script = (
        "import time\nfrom gpupool.widgets.checkpoint import Checkpoint\n"
        "ckpt = Checkpoint()\nstate = ckpt.load(default={'step': 0})\n"
        "print('ready', flush=True)\n"
        "while state['step'] < 10**6:\n    state['step'] += 1\n    time.sleep(0.01)\n"
        "    if ckpt.preempted:\n        ckpt.save(state)\n        ckpt.exit()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        env={"GPUPOOL_CHECKPOINT_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert proc.stdout.readline().strip() == "ready"
    proc.terminate()
    code = proc.wait(20)
    assert (tmp_path / "state.json").exists()  # it did save before leaving
    return code


@pytest.fixture
async def hub_api(plane: ControlPlane, chart: list[dict], tmp_path: Path):
    """kubernetes_asyncio as the hub's service account (a token from the TokenRequest API)."""
    cfg = client.Configuration()
    path = plane.sa_kubeconfig(tmp_path / "hub.kubeconfig", HUB_NS, "hub")
    await config.load_kube_config(config_file=str(path), client_configuration=cfg)
    async with client.ApiClient(cfg) as api:
        yield api


def volume_for(admin: Resources, job_id: str) -> None:
    """A PV the job's checkpoint claim binds to (what a provisioner would make)."""
    admin.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"pv-{job_id}"},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": STORAGE,
                "hostPath": {"path": f"/tmp/gpupool-test/{job_id}"},
                "persistentVolumeReclaimPolicy": "Delete",
            },
        }
    )


def pods_of(admin: Resources, job_id: str) -> list[dict]:
    items = admin.get(f"/api/v1/namespaces/{HUB_NS}/pods?labelSelector=gpupool.io/job-id={job_id}")["items"]
    return sorted(items, key=lambda p: p["metadata"]["creationTimestamp"])


def running_pod(admin: Resources, job_id: str, not_uid: set[str]) -> dict | None:
    return next(
        (
            p
            for p in pods_of(admin, job_id)
            if p["status"].get("phase") == "Running"
            and p["metadata"]["uid"] not in not_uid
            and not p["metadata"].get("deletionTimestamp")
        ),
        None,
    )


def annotate(admin: Resources, pod: dict, key: str, value: str) -> None:
    r = admin.http.patch(
        f"/api/v1/namespaces/{HUB_NS}/pods/{pod['metadata']['name']}",
        json={"metadata": {"annotations": {key: value}}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    r.raise_for_status()


def exit_pod(admin: Resources, pod: dict, code: int) -> None:
    annotate(admin, pod, EXIT_CODE, str(code))


def evict_as_kai(admin: Resources, pod: dict, condition: bool = True) -> None:
    """KAI's eviction: with --update-pod-eviction-condition the condition first, then the delete;
    without the flag, the delete alone."""
    name = pod["metadata"]["name"]
    if condition:
        cond = {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "PreemptionByScheduler",
            "message": "kai-scheduler: reclaimed by queue paper",
            "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        r = admin.http.patch(
            f"/api/v1/namespaces/{HUB_NS}/pods/{name}/status",
            json={"status": {"conditions": [cond]}},
            headers={"Content-Type": "application/strategic-merge-patch+json"},
        )
        r.raise_for_status()
    admin.http.delete(f"/api/v1/namespaces/{HUB_NS}/pods/{name}").raise_for_status()


async def wait_for(check, timeout: float = 60, what: str = "") -> object:
    return await until_async(check, what, timeout=timeout)


async def test_a_preempted_job_comes_back_through_the_job_and_succeeds_only_when_done(
    hub_api, admin: Resources, tmp_path: Path
) -> None:
    seen: list[str] = []

    def on_change(job_id: str, st: JobStatus) -> None:
        if job_id != "resume1":  # Jobs other tests left in the namespace are followed too
            return
        if not seen or seen[-1] != st.state:
            seen.append(st.state)

    ctl = KubeJobController(hub_api, OPTS, None, on_change=on_change, watch_timeout_s=20)
    job = TrainJobSpec(
        id="resume1",
        owner="ann",
        project="default",
        num_gpu=1,
        gpu_milli=1000,
        command=["python", "train.py"],
        image="registry.example.org/train:1",
    )
    volume_for(admin, job.id)
    await ctl.start()
    try:
        await ctl.submit(job)
        done: set[str] = set()
        first = await wait_for(lambda: running_pod(admin, job.id, done), what="the first pod to run")
        await wait_for(lambda: ctl.status(job.id).state == "running", what="state running")

        # 1. KAI reclaims the GPU: the condition says why, the Job makes a new pod
        evict_as_kai(admin, first)
        done.add(first["metadata"]["uid"])
        second = await wait_for(lambda: running_pod(admin, job.id, done), what="a replacement pod")
        await wait_for(
            lambda: ctl.status(job.id).state == "running" and ctl.status(job.id).runs == 2,
            what="running again",
        )

        # 2. KAI without --update-pod-eviction-condition: a bare delete; the program gets SIGTERM
        # and the checkpoint helper leaves with its code (measured from a real run), not 0
        code = checkpoint_helper_exit_code(tmp_path)
        assert code not in (0, 143)
        annotate(admin, second, SIGTERM_EXIT_CODE, str(code))
        evict_as_kai(admin, second, condition=False)
        done.add(second["metadata"]["uid"])
        third = await wait_for(lambda: running_pod(admin, job.id, done), what="a pod after the helper's exit")
        jobobj = admin.get(f"/apis/batch/v1/namespaces/{HUB_NS}/jobs/{name_of(job.id)}")
        assert not [c for c in jobobj["status"].get("conditions", []) if c["status"] == "True"], jobobj[
            "status"
        ]

        # 3. the work is done: only now it succeeds
        exit_pod(admin, third, 0)
        await wait_for(lambda: ctl.status(job.id).state == "succeeded", what="succeeded")
        st = ctl.status(job.id)
        assert (st.runs, st.preemptions) == (3, 2)
        assert seen == ["queued", "running", "preempted", "running", "preempted", "running", "succeeded"], (
            seen
        )
    finally:
        await ctl.cancel(job.id)
        await ctl.stop()


async def test_a_real_failure_still_fails_the_job(hub_api, admin: Resources) -> None:
    """The control: an exit code other than the helper's counts against backoffLimit 0."""
    ctl = KubeJobController(hub_api, OPTS, None, watch_timeout_s=20)
    job = TrainJobSpec(
        id="crash1",
        owner="ann",
        project="default",
        num_gpu=1,
        gpu_milli=1000,
        command=["python", "train.py"],
        image="registry.example.org/train:1",
    )
    volume_for(admin, job.id)
    await ctl.start()
    try:
        await ctl.submit(job)
        pod = await wait_for(lambda: running_pod(admin, job.id, set()), what="the pod to run")
        exit_pod(admin, pod, 1)
        await wait_for(lambda: ctl.status(job.id).state == "failed", what="failed")
        assert ctl.status(job.id).message == "exit code 1"
        assert len(pods_of(admin, job.id)) == 1  # no second try
    finally:
        await ctl.stop()


async def test_a_job_past_its_max_runtime_is_stopped_by_the_job_controller(hub_api, admin: Resources) -> None:
    """max_runtime_s is the Job's activeDeadlineSeconds: the real Job controller ends it."""
    ctl = KubeJobController(hub_api, OPTS, None, watch_timeout_s=20)
    job = TrainJobSpec(
        id="deadline1",
        owner="ann",
        project="default",
        num_gpu=1,
        gpu_milli=1000,
        command=["python", "train.py"],
        image="registry.example.org/train:1",
        max_runtime_s=2,
    )
    volume_for(admin, job.id)
    await ctl.start()
    try:
        await ctl.submit(job)
        await wait_for(lambda: running_pod(admin, job.id, set()), what="the pod to run")
        await wait_for(
            lambda: ctl.status(job.id).state == "failed", timeout=60, what="failed at its deadline"
        )
        assert ctl.status(job.id).message == "stopped at its max runtime"
    finally:
        await ctl.cancel(job.id)
        await ctl.stop()


async def test_without_the_kai_flag_a_program_without_the_helper_fails_its_job(
    hub_api, admin: Resources
) -> None:
    """Why the chart asks for --update-pod-eviction-condition: a bare delete of a pod whose
    program simply dies of SIGTERM (143) is a failure to the Job."""
    ctl = KubeJobController(hub_api, OPTS, None, watch_timeout_s=20)
    job = TrainJobSpec(
        id="bare1",
        owner="ann",
        project="default",
        num_gpu=1,
        gpu_milli=1000,
        command=["python", "train.py"],
        image="registry.example.org/train:1",
    )
    volume_for(admin, job.id)
    await ctl.start()
    try:
        await ctl.submit(job)
        pod = await wait_for(lambda: running_pod(admin, job.id, set()), what="the pod to run")
        evict_as_kai(admin, pod, condition=False)
        await wait_for(lambda: ctl.status(job.id).state == "failed", what="failed")
        assert ctl.status(job.id).message == "exit code 143"
    finally:
        await ctl.stop()


async def test_cancel_deletes_the_job_and_everything_it_owns(hub_api, admin: Resources) -> None:
    ctl = KubeJobController(hub_api, OPTS, None, watch_timeout_s=20)
    job = TrainJobSpec(
        id="cancel1",
        owner="ann",
        project="default",
        num_gpu=1,
        gpu_milli=1000,
        command=["python", "job.py"],
        image="registry.example.org/train:1",
        files=("job.py",),
    )
    volume_for(admin, job.id)
    await ctl.start()
    try:
        await ctl.submit(job, {"job.py": b"print('hi')\n"})
        await wait_for(lambda: running_pod(admin, job.id, set()), what="the pod to run")
        ns = f"/api/v1/namespaces/{HUB_NS}"
        assert admin.get(f"{ns}/configmaps/gpupool-code-{job.id}") is not None
        await ctl.cancel(job.id)
        await wait_for(lambda: ctl.status(job.id).state == "cancelled", what="cancelled")
        # the garbage collector removes what the Job owned; kwok's stage ends the pod
        await wait_for(lambda: admin.get(f"{ns}/configmaps/gpupool-code-{job.id}") is None, what="code gone")
        await wait_for(
            lambda: admin.get(f"{ns}/persistentvolumeclaims/gpupool-ckpt-{job.id}") is None, what="claim gone"
        )
        await wait_for(lambda: not pods_of(admin, job.id), what="pods gone")
        assert admin.get(f"/apis/batch/v1/namespaces/{HUB_NS}/jobs/{name_of(job.id)}") is None
    finally:
        await ctl.stop()


def make_service(
    tmp_path: Path,
    api,
    projects: dict | None = None,
    train: dict | None = None,
    spawner: dict | None = None,
    **job_options,
):
    """The hub's training pool in Kubernetes mode, as the chart configures it (`projects`:
    c.TrainPool.projects, one project "default" with 4 GPUs guaranteed unless given; `train`:
    more TrainPool settings; `spawner`: KubeSpawner settings, user namespaces among them)."""
    from traitlets.config import Config

    from gpupool.alloc.manager import PoolManager
    from gpupool.gpu.sharing import KAISharing
    from gpupool.pool import BuildLimits, BuildQuotaPolicy, get_policy, virtual_inventory
    from gpupool.store import Store
    from gpupool.train.config import TrainPool
    from gpupool.train.kube_service import KubeTrainingService

    c = Config()
    c.TrainPool.projects = projects or {"default": {"guarantee": 4}}
    c.TrainPool.runner = "kubernetes"
    c.TrainPool.image = "registry.example.org/train:1"
    c.TrainPool.jobs_root = str(tmp_path / "jobs" / "{username}")
    c.TrainPool.kube_logs_dir = str(tmp_path / "train-logs")  # not the default, relative to the cwd
    c.TrainPool.kube_job_options = {
        "namespace": HUB_NS,
        "storage_class": STORAGE,
        "checkpoint_size": "1Gi",
        # no usage finalizer unless a test asks: these tests run no periodic usage relist to take
        # it off, and wait for deleted pods to go (test_train_service_real's usage test asks)
        "usage_finalizer": False,
        **job_options,
    }
    for key, value in (train or {}).items():
        setattr(c.TrainPool, key, value)
    for key, value in (spawner or {}).items():
        setattr(c.KubeSpawner, key, value)
    pool = PoolManager(
        virtual_inventory(4),
        Store(f"sqlite:///{tmp_path}/pool.sqlite"),
        BuildQuotaPolicy(BuildLimits(1000, (250, 1000), 1000, 2)),
        get_policy("best-fit"),
    )
    svc = KubeTrainingService(pool, TrainPool(config=c), api, KAISharing())
    svc.controller.watch_timeout_s = 20
    return svc


async def test_a_restarted_hub_adopts_a_job_that_was_preempted_while_it_was_down(
    hub_api, admin: Resources, tmp_path: Path
) -> None:
    first = make_service(tmp_path, hub_api)
    await first.start()
    row = await first.submit(
        JobRequest(
            owner="ann",
            project="default",
            name="long",
            num_gpu=1,
            gpu_milli=1000,
            code=JobCode.command(["python", "train.py"]),
        )
    )
    volume_for(admin, row.id)
    pod = await wait_for(lambda: running_pod(admin, row.id, set()), what="the pod to run")
    await wait_for(lambda: first.job(row.id).state == "running", what="row running")
    await first.stop()
    # while the hub is down, KAI reclaims the GPU and the Job's new pod runs
    evict_as_kai(admin, pod)
    await wait_for(lambda: running_pod(admin, row.id, {pod["metadata"]["uid"]}), what="the new pod")
    second = make_service(tmp_path, hub_api)
    await second.start()
    try:
        await wait_for(lambda: second.job(row.id).state == "running", what="the restarted hub to adopt it")
        # the evicted pod is gone from the cluster and the Job does not count ignored failures:
        # a preemption that began and ended while the hub was down is not in the row (a limit)
        assert second.job(row.id).preemptions == 0
        exit_pod(admin, running_pod(admin, row.id, {pod["metadata"]["uid"]}), 0)
        await wait_for(lambda: second.job(row.id).state == "succeeded", what="succeeded")
        kinds = [e.kind for e in reversed(second.pool.store.events(name=row.id))]
        assert kinds[0] == "job" and kinds[-1] == "job" and "start" in kinds
        creates = admin.get(
            f"/apis/batch/v1/namespaces/{HUB_NS}/jobs?labelSelector=gpupool.io/job-id={row.id}"
        )
        assert len(creates["items"]) == 1  # never sent twice
    finally:
        await second.stop()


async def test_a_watch_that_gets_410_gone_relists_and_misses_nothing(
    plane: ControlPlane, chart: list[dict], admin: Resources, tmp_path: Path
) -> None:
    """The hub's connection drops; kubespawner's reflector lists the Jobs again and resumes its
    watch from that list, but the network holds the watch request back (relay.WatchRelay) while
    a Job is deleted and etcd compacts its history. When the request arrives, the API server
    itself answers it with 410 Gone (the relay sees the 410 go back to the reflector): the
    deletion is in no event the watch will ever send. The reflector lists again after the
    error and the controller's next pass finds the Job gone."""
    from tests.cluster.relay import WatchRelay

    relay = WatchRelay(plane)
    port = await relay.start()
    path = plane.sa_kubeconfig(tmp_path / "hub.kubeconfig", HUB_NS, "hub")
    path.write_text(path.read_text().replace(plane.url, f"https://127.0.0.1:{port}"))
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(path), client_configuration=cfg)
    jobs = f"/apis/batch/v1/namespaces/{HUB_NS}/jobs"
    async with client.ApiClient(cfg) as api:
        ctl = KubeJobController(api, OPTS, None, watch_timeout_s=300)
        keep = TrainJobSpec(
            id="keep410",
            owner="ann",
            project="default",
            num_gpu=1,
            gpu_milli=1000,
            command=["python", "train.py"],
            image="registry.example.org/train:1",
        )
        gone = TrainJobSpec(**{**keep.__dict__, "id": "gone410"})
        await ctl.start()
        try:
            await ctl.submit(keep)
            await ctl.submit(gone)
            # seen through the watch, not only submitted (submit() reports "queued" at once): the
            # case where the watch never showed a Job is the next test's
            await wait_for(lambda: {"gone410", "keep410"} <= set(ctl.jobs), what="both seen by the watch")
            relay.hold_watches_of = jobs
            relay.drop_connections()  # the outage: the reflector lists again, then resumes its watch
            await wait_for(lambda: relay.held, what="the reflector's new Job watch (held by the network)")
            held = relay.held[0]
            resumes_from = dict(q.split("=", 1) for q in held.split("?", 1)[1].split("&"))["resourceVersion"]
            admin.http.delete(f"{jobs}/{name_of('gone410')}", params={"propagationPolicy": "Background"})
            for i in range(3):  # more history for etcd to compact away
                admin.http.patch(
                    f"{jobs}/{name_of('keep410')}",
                    json={"metadata": {"annotations": {"n": str(i)}}},
                    headers={"Content-Type": "application/merge-patch+json"},
                ).raise_for_status()
            await asyncio.sleep(8)  # two compaction intervals (--etcd-compaction-interval=3s)
            r = admin.http.get(
                jobs, params={"watch": "1", "resourceVersion": resumes_from, "timeoutSeconds": "1"}
            )
            assert '"code":410' in r.text.replace(" ", "") or r.status_code == 410, r.text[:300]  # compacted
            # the Job watch has said nothing since (its pod's watch may have: its pod went with it)
            assert "gone410" not in ctl.deleted and ctl.status("gone410").state != "cancelled"
            relay.hold_watches_of = ""
            relay.release.set()  # the network delivers the held watch request

            def answered_410() -> bool:
                return any(
                    x.path_qs == held and (x.status == 410 or b'"code":410' in x.head.replace(b" ", b""))
                    for x in relay.relayed
                )

            await wait_for(answered_410, what="the API server's 410 Gone relayed to the reflector")
            await wait_for(
                lambda: ctl.status("gone410").state == "cancelled",
                timeout=60,
                what="the deletion seen after the 410",
            )
            assert "outside gpupool" in ctl.status("gone410").message
            assert ctl.status("keep410").state not in ("cancelled", "failed")
        finally:
            await ctl.stop()
            await relay.stop()
            admin.http.delete(
                f"/apis/batch/v1/namespaces/{HUB_NS}/jobs/{name_of('keep410')}",
                params={"propagationPolicy": "Background"},
            )


async def test_a_job_deleted_before_its_watch_showed_it_ends_cancelled(hub_api, admin: Resources) -> None:
    """Submitted, then deleted outside gpupool before the watch delivered it (a dropped
    connection right after the create does that; here the Job watch is stopped so its copy
    lags for certain). After `confirm_after_s` the controller reads the Job from the API
    server: the deleted one ends cancelled, the one that exists stays queued."""
    now = [0.0]
    ctl = KubeJobController(hub_api, OPTS, None, watch_timeout_s=20, confirm_after_s=5, clock=lambda: now[0])
    lost = TrainJobSpec(
        id="lost",
        owner="ann",
        project="default",
        num_gpu=1,
        gpu_milli=1000,
        command=["python", "train.py"],
        image="registry.example.org/train:1",
    )
    late = TrainJobSpec(**{**lost.__dict__, "id": "late"})
    await ctl.start()
    try:
        await ctl.reflectors["jobs"].stop()  # the Job watch shows nothing new from here on
        await ctl.submit(lost)
        await ctl.submit(late)
        admin.http.delete(
            f"/apis/batch/v1/namespaces/{HUB_NS}/jobs/{name_of('lost')}",
            params={"propagationPolicy": "Background"},
        ).raise_for_status()
        await asyncio.sleep(1)  # passes within confirm_after_s: no read yet, nothing concluded
        assert ctl.status("lost").state == "queued" and set(ctl.unseen) == {"lost", "late"}
        now[0] += 6
        await wait_for(
            lambda: ctl.status("lost").state == "cancelled",
            timeout=30,
            what="the Job the watch never showed seen as deleted",
        )
        assert "outside gpupool" in ctl.status("lost").message
        # the same pass read `late` too: it exists, so it is only late, and is read again later
        assert ctl.status("late").state == "queued" and set(ctl.unseen) == {"late"}, ctl.status("late")
    finally:
        await ctl.stop()
        admin.http.delete(
            f"/apis/batch/v1/namespaces/{HUB_NS}/jobs/{name_of('late')}",
            params={"propagationPolicy": "Background"},
        )
