"""gpupool's Kueue adapter against Kueue's real controller manager (v0.17.0, built from its Go
module; started by tests/cluster/kueue.py with its CRDs and webhooks as its manifests install
them). What is real: Kueue's webhooks (a labelled Job is suspended at creation), its
admission within a ClusterQueue's quota, its unsuspending of an admitted Job, the Job
controller and kube-scheduler running the pod on a kwok GPU node. Simulated: the container's
exit (our kwok stage). Waiting on Kueue is real time, bounded.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from gpupool.kube.controller import KubeJobController
from gpupool.kube.job_spec import TrainJobSpec
from gpupool.kube.kueue import kueue_objects
from gpupool.kube.objects import JobOptions, name_of
from gpupool.pool.jobs import Project
from tests.cluster import build, kueue
from tests.cluster.conftest import HUB_NS
from tests.cluster.plane import SIGTERM_EXIT_CODE, ControlPlane, env_flag
from tests.cluster.resources import Resources, until
from tests.cluster.test_train_jobs_real import annotate, exit_pod, hub_api, running_pod, volume_for, wait_for  # noqa: F401 (hub_api: a fixture)

COHORT, FLAVOR, PROJECT = "kueue-test", "kueue-test-gpu", "optics"
API = "/apis/kueue.x-k8s.io/v1beta2"
OPTS = JobOptions(
    namespace=HUB_NS,
    queue="{project}",
    storage_class="gpupool-test",
    checkpoint_size="1Gi",
    grace_s=5,
    ttl_after_finished_s=600,
    kueue=True,
)


@pytest.fixture(scope="session")
def kueue_manager(
    plane: ControlPlane, chart: list[dict], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """Kueue's controller manager beside the plane, for this module's tests only. If Kueue does
    not build, they skip with the error (fail in CI); the rest of the plane never needs it."""
    assert shutil.which("go")  # the plane fixture skipped already otherwise
    try:
        folder = build.optional("kueue", log=lambda line: print(line, flush=True))
    except RuntimeError as err:
        if env_flag("CI"):
            pytest.fail(f"Kueue could not be built: {err}")
        pytest.skip(f"Kueue could not be built: {err}")
    try:
        kueue.start(plane, folder / "kueue", tmp_path_factory.mktemp("kueue"))
        yield plane
    finally:
        kueue.stop(plane)


def queues(admin: Resources, guarantee: int = 1000, limit: int = 1000) -> list[dict]:
    projects = {PROJECT: Project(PROJECT, guarantee, 1.0, limit, 0)}
    docs = kueue_objects(projects, HUB_NS, cohort=COHORT, flavor=FLAVOR)
    admin.apply_all(docs)
    return docs


def workload_of(admin: Resources, job_id: str, ns: str = HUB_NS) -> dict | None:
    """The Workload Kueue made for a Job (it owns it; its name is Kueue's own)."""
    items = admin.get(f"{API}/namespaces/{ns}/workloads")["items"]
    return next(
        (
            w
            for w in items
            if any(
                o["kind"] == "Job" and o["name"] == name_of(job_id)
                for o in w["metadata"].get("ownerReferences") or []
            )
        ),
        None,
    )


def job(admin: Resources, job_id: str) -> dict:
    return admin.get(f"/apis/batch/v1/namespaces/{HUB_NS}/jobs/{name_of(job_id)}") or {}


def spec(job_id: str) -> TrainJobSpec:
    return TrainJobSpec(
        id=job_id,
        owner="ann",
        project=PROJECT,
        num_gpu=1,
        gpu_milli=1000,
        command=["python", "train.py"],
        image="registry.example.org/train:1",
    )


def test_kueue_admits_the_adapters_queues(kueue_manager: ControlPlane, admin: Resources) -> None:
    """What the adapter renders is accepted by Kueue's webhooks and made active by its controller
    (a queue Kueue finds wrong, e.g. with a flavor that does not exist, stays inactive)."""
    queues(admin)
    log = lambda: kueue_manager.log_tail("kueue")  # noqa: E731
    cq = until(
        lambda: (
            kueue.condition(admin.get(f"{API}/clusterqueues/{PROJECT}"), "Active").get("status") == "True"
        ),
        30,
        "the ClusterQueue to be Active",
        log,
    )
    assert cq
    until(
        lambda: (
            kueue.condition(admin.get(f"{API}/namespaces/{HUB_NS}/localqueues/{PROJECT}"), "Active").get(
                "status"
            )
            == "True"
        ),
        30,
        "the LocalQueue to be Active",
        log,
    )
    # stored through Kueue's conversion webhook and read back as v1beta2: the cohort survives
    assert admin.get(f"{API}/clusterqueues/{PROJECT}")["spec"]["cohortName"] == COHORT
    # the control: a queue naming a flavor that does not exist is admitted but never active
    broken = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": "kueue-test-broken"},
        "spec": {
            "cohortName": COHORT,
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["nvidia.com/gpu"],
                    "flavors": [
                        {
                            "name": "no-such-flavor",
                            "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 1}],
                        }
                    ],
                }
            ],
        },
    }
    admin.apply(broken)
    cond = until(
        lambda: kueue.condition(admin.get(f"{API}/clusterqueues/kueue-test-broken"), "Active"),
        30,
        "Kueue's verdict on the broken queue",
        log,
    )
    assert cond["status"] == "False" and "FlavorNotFound" in cond["reason"], cond
    admin.http.delete(f"{API}/clusterqueues/kueue-test-broken")


async def test_kueue_admits_a_train_job_within_its_quota_and_holds_the_next(
    kueue_manager: ControlPlane, hub_api, admin: Resources
) -> None:
    """Two 1-GPU train Jobs through gpupool's controller (as the hub's account) into a project
    whose ClusterQueue has 1 GPU and may not borrow: Kueue admits the first and unsuspends it;
    the second stays suspended, its job row `queued`, no pod made, until the first ends."""
    queues(admin)
    log = lambda: kueue_manager.log_tail("kueue")  # noqa: E731
    until(
        lambda: (
            kueue.condition(admin.get(f"{API}/clusterqueues/{PROJECT}"), "Active").get("status") == "True"
        ),
        30,
        "the ClusterQueue to be Active",
        log,
    )
    ctl = KubeJobController(hub_api, OPTS, None, watch_timeout_s=20)
    first, second = spec("kueue-a"), spec("kueue-b")
    for s in (first, second):
        volume_for(admin, s.id)
    await ctl.start()
    try:
        await ctl.submit(first)
        wl = await wait_for(
            lambda: (
                (w := workload_of(admin, first.id))
                and kueue.condition(w, "Admitted").get("status") == "True"
                and w
            ),
            30,
            "the first Workload to be admitted",
        )
        assert kueue.condition(wl, "QuotaReserved")["status"] == "True"
        assert wl["status"]["admission"]["clusterQueue"] == PROJECT
        assignment = wl["status"]["admission"]["podSetAssignments"][0]
        # the GPU counted against the project's quota; the pod's CPU and memory requests are
        # covered by the same flavor (unrationed), else Kueue would never admit the Job
        assert assignment["flavors"] == {"nvidia.com/gpu": FLAVOR, "cpu": FLAVOR, "memory": FLAVOR}
        assert assignment["resourceUsage"]["nvidia.com/gpu"] == "1"
        await wait_for(
            lambda: job(admin, first.id)["spec"].get("suspend") is False, 30, "the Job unsuspended"
        )
        pod = await wait_for(lambda: running_pod(admin, first.id, set()), 30, "the first pod to run")
        await wait_for(lambda: ctl.status(first.id).state == "running", 30, "job row running")

        await ctl.submit(second)
        wl2 = await wait_for(
            lambda: (w := workload_of(admin, second.id)) and kueue.condition(w, "QuotaReserved") and w,
            30,
            "Kueue's verdict on the second Workload",
        )
        cond = kueue.condition(wl2, "QuotaReserved")
        assert cond["status"] == "False" and "insufficient" in cond["message"], cond
        assert job(admin, second.id)["spec"]["suspend"] is True  # Kueue's webhook suspended it at creation
        await wait_for(
            lambda: ctl.status(second.id).state == "queued" and "Kueue" in ctl.status(second.id).message,
            30,
            "the second row queued on Kueue",
        )
        assert not [n for n in kueue_manager.created("pods", HUB_NS) if n.startswith(name_of(second.id))]

        # the first ends: its quota comes back and Kueue admits the second
        exit_pod(admin, pod, 0)
        await wait_for(lambda: ctl.status(first.id).state == "succeeded", 60, "the first to succeed")
        await wait_for(
            lambda: kueue.condition(workload_of(admin, second.id), "Admitted").get("status") == "True",
            60,
            "the second Workload to be admitted",
        )
        await wait_for(lambda: running_pod(admin, second.id, set()), 30, "the second pod to run")
        await wait_for(lambda: ctl.status(second.id).state == "running", 30, "the second row running")
    finally:
        for s in (first, second):
            await ctl.cancel(s.id)
        await ctl.stop()


async def test_kueue_reclaims_a_borrowed_gpu_and_the_job_resumes(
    kueue_manager: ControlPlane, hub_api, admin: Resources
) -> None:
    """reclaimWithinCohort, for real: `lenses` (guarantee 1, limit 2) borrows the idle GPU of
    `mirrors` (guarantee 1) in their own cohort; a job of `mirrors` takes it back. Kueue evicts
    the borrower (suspends its Job, the Job controller stops its pod; the program saves and exits
    with the checkpoint helper's 75, which the Job does not count); when `mirrors` is done,
    Kueue admits `lenses` again and a new pod resumes. The row: running, preempted, running."""
    projects = {
        "lenses": Project("lenses", 1000, 1.0, 2000, 0),
        "mirrors": Project("mirrors", 1000, 1.0, 1000, 0),
    }
    admin.apply_all(kueue_objects(projects, HUB_NS, cohort="kueue-reclaim", flavor=FLAVOR))
    log = lambda: kueue_manager.log_tail("kueue")  # noqa: E731
    for name in projects:
        until(
            lambda n=name: (
                kueue.condition(admin.get(f"{API}/clusterqueues/{n}"), "Active").get("status") == "True"
            ),
            30,
            f"ClusterQueue {name} Active",
            log,
        )
    seen: list[str] = []

    def on_change(job_id: str, st) -> None:
        if job_id == "kueue-borrow" and (not seen or seen[-1] != st.state):
            seen.append(st.state)

    ctl = KubeJobController(hub_api, OPTS, None, on_change=on_change, watch_timeout_s=20)
    borrower = TrainJobSpec(
        id="kueue-borrow",
        owner="ann",
        project="lenses",
        num_gpu=2,
        gpu_milli=1000,
        command=["python", "train.py"],
        image="registry.example.org/train:1",
    )
    owner = TrainJobSpec(
        id="kueue-own",
        owner="bob",
        project="mirrors",
        num_gpu=1,
        gpu_milli=1000,
        command=["python", "train.py"],
        image="registry.example.org/train:1",
    )
    for s in (borrower, owner):
        volume_for(admin, s.id)
    await ctl.start()
    try:
        await ctl.submit(borrower)
        pod = await wait_for(lambda: running_pod(admin, borrower.id, set()), 30, "the borrower's pod to run")
        await wait_for(lambda: ctl.status(borrower.id).state == "running", 30, "borrower running")
        annotate(admin, pod, SIGTERM_EXIT_CODE, "75")  # its program saves and exits as the helper does

        await ctl.submit(owner)
        wl = await wait_for(
            lambda: (
                (w := workload_of(admin, borrower.id))
                and kueue.condition(w, "Evicted").get("status") == "True"
                and w
            ),
            60,
            "Kueue to evict the borrower",
        )
        assert kueue.condition(wl, "Preempted").get("reason") == "InCohortReclamation", wl["status"]
        await wait_for(lambda: running_pod(admin, owner.id, set()), 60, "the owner's pod to run")
        assert job(admin, borrower.id)["spec"]["suspend"] is True
        await wait_for(lambda: ctl.status(borrower.id).state == "preempted", 30, "borrower row preempted")

        exit_pod(admin, running_pod(admin, owner.id, set()), 0)
        await wait_for(lambda: ctl.status(owner.id).state == "succeeded", 60, "the owner to succeed")
        await wait_for(
            lambda: running_pod(admin, borrower.id, {pod["metadata"]["uid"]}),
            60,
            "the borrower resumed in a new pod",
        )
        await wait_for(lambda: ctl.status(borrower.id).state == "running", 30, "borrower running again")
        jobobj = job(admin, borrower.id)
        assert not jobobj["status"].get("failed"), jobobj["status"]  # the eviction was not counted
        assert seen == ["queued", "running", "preempted", "running"], seen
    finally:
        for s in (borrower, owner):
            await ctl.cancel(s.id)
        await ctl.stop()


async def test_kueue_makes_the_charts_queues_active(
    kueue_manager: ControlPlane, hub_api, admin: Resources, chart: list[dict]
) -> None:
    """The chart's own Kueue objects (what a cluster admin installs with `kueue.enabled`) pass
    Kueue's webhooks and become active with the quotas the values give; with user namespaces a
    user's Job waits in the LocalQueue the hub makes in their namespace (as the chart's hub
    account), and Kueue admits it there through the chart's ClusterQueue."""
    from dataclasses import replace

    from tests.k8s.test_chart import render

    values = {
        "hub": {"namespace": HUB_NS, "serviceAccountName": "hub"},
        "userNamespaces": {"enabled": True},
        "kueue": {"enabled": True, "cohort": "kueue-chart", "namespace": HUB_NS, "flavor": FLAVOR},
        "departments": {"optics": {"quota": 3}},
        "build": {"defaultProject": "prisms"},
        "projects": {
            "prisms": {"department": "optics", "guarantee": 1.5, "limit": 3},
            "filters": {"department": "optics", "guarantee": 1},
        },
    }
    rendered = render(values)
    docs = [d for d in rendered if d["apiVersion"].startswith("kueue.x-k8s.io/")]
    assert {d["kind"] for d in docs} == {"Cohort", "ResourceFlavor", "ClusterQueue", "LocalQueue"}
    admin.apply_all(docs)
    log = lambda: kueue_manager.log_tail("kueue")  # noqa: E731
    for name in ("prisms", "filters"):
        until(
            lambda n=name: (
                kueue.condition(admin.get(f"{API}/clusterqueues/{n}"), "Active").get("status") == "True"
            ),
            30,
            f"ClusterQueue {name} Active",
            log,
        )
        until(
            lambda n=name: (
                kueue.condition(admin.get(f"{API}/namespaces/{HUB_NS}/localqueues/{n}"), "Active").get(
                    "status"
                )
                == "True"
            ),
            30,
            f"LocalQueue {name} Active",
            log,
        )
    quota = admin.get(f"{API}/clusterqueues/prisms")["spec"]["resourceGroups"][0]["flavors"][0]["resources"][
        0
    ]
    # quantities, as Kueue's conversion webhook writes them: "2"
    assert (str(quota["nominalQuota"]), str(quota["borrowingLimit"])) == ("2", "1")  # 1.5 rounds up; limit 3

    # a user's Job in their own namespace (gpupool-ann), with the hub's ClusterRole and admission
    # policy as this chart renders them with Kueue (restored to the session's after)
    fence = ("ClusterRole", "ValidatingAdmissionPolicy")
    ours = [
        d for d in rendered if d["kind"] in fence and d["metadata"]["name"] == "gpupool-hub-user-namespaces"
    ]
    admin.apply_all(ours)
    ctl = KubeJobController(hub_api, replace(OPTS, user_namespace_template="gpupool-{username}"), None)
    users_job, ns = replace(spec("kueue-ns"), project="filters"), "gpupool-ann"
    volume_for(admin, users_job.id)
    await ctl.start()
    try:
        await ctl.submit(users_job)
        assert admin.get(f"{API}/namespaces/{ns}/localqueues/filters")["spec"]["clusterQueue"] == "filters"
        wl = await wait_for(
            lambda: (
                (w := workload_of(admin, users_job.id, ns))
                and kueue.condition(w, "Admitted").get("status") == "True"
                and w
            ),
            30,
            "the user's Workload admitted in their namespace",
        )
        assert wl["status"]["admission"]["clusterQueue"] == "filters"
        await wait_for(
            lambda: (
                (admin.get(f"/apis/batch/v1/namespaces/{ns}/jobs/{name_of(users_job.id)}") or {})["spec"].get(
                    "suspend"
                )
                is False
            ),
            30,
            "the user's Job unsuspended",
        )
    finally:
        await ctl.cancel(users_job.id)
        await ctl.stop()
        admin.http.delete(f"{API}/namespaces/{ns}/localqueues/filters")
        admin.apply_all(
            d for d in chart if d["kind"] in fence and d["metadata"]["name"] == "gpupool-hub-user-namespaces"
        )
