"""The training pool's Kubernetes back-end where the real control plane cannot serve: a job's
logs. Logs come from `pods/log`, which the API server proxies to the kubelet of the pod's node;
kwok's nodes run no container and serve no logs, so this stays on the fake API server (which
serves what a test writes). Everything else the service does is tested on the real plane:
tests/cluster/test_train_service_real.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from traitlets.config import Config

from gpupool.gpu.sharing import KAISharing
from gpupool.kube.objects import name_of
from gpupool.train.code import JobCode
from gpupool.train.config import TrainPool
from gpupool.train.kube_service import KubeTrainingService
from gpupool.train.request import JobRequest
from tests.k8s.fake_apiserver import Cluster
from tests.support.pools import make_pool, train_config
from tests.support.wait import until_async

NS = "jhub"


def make_service(tmp_path: Path, api_client, **train) -> KubeTrainingService:
    settings = {
        "projects": {"vision": {"guarantee": 1}},
        "runner": "kubernetes",
        "image": "registry.example.org/train:1",
        "kube_job_options": {"namespace": NS, "device_memory_mib": 81920},
        **train,
    }
    c = train_config(tmp_path, **settings)
    svc = KubeTrainingService(make_pool(tmp_path, 4), TrainPool(config=c), api_client, KAISharing())
    svc.controller.watch_timeout_s = 2
    return svc


@pytest.fixture
async def service(tmp_path: Path, api_client):
    svc = make_service(tmp_path, api_client)
    await svc.start()
    yield svc
    await svc.stop()


def only_pod(cluster: Cluster, job_id: str) -> str:
    pods = [p for p in cluster.pods(NS, f"batch.kubernetes.io/job-name={name_of(job_id)}")]
    return pods[-1]["metadata"]["name"]


async def test_logs_are_the_tail_of_the_newest_pod(service: KubeTrainingService, cluster: Cluster) -> None:
    row = await service.submit(
        JobRequest(
            owner="ann",
            project="vision",
            name="resnet",
            num_gpu=1,
            gpu_milli=1000,
            code=JobCode.command(["python", "job.py"], {"job.py": b"1"}),
        )
    )
    assert await service.logs(service.job(row.id), 5) == {
        "lines": [],
        "before": 0,
        "output_notebook": None,
    }  # no pod
    first = cluster.start_job_pod(NS, name_of(row.id))["metadata"]["name"]
    cluster.run_pod(NS, first)
    await until_async(lambda: service.job(row.id).state == "running", "the job running")
    cluster.api.write_log(NS, first, "".join(f"step {i}\n" for i in range(300)))
    logs = await service.logs(service.job(row.id), 5)
    assert logs["lines"] == [f"step {i}" for i in range(295, 300)]
    # paging back, as on the embedded runner: the lines before the first one shown
    earlier = await service.logs(service.job(row.id), 5, before=logs["before"])
    assert earlier["lines"] == [f"step {i}" for i in range(290, 295)]
    assert earlier["before"] == len("".join(f"step {i}\n" for i in range(290)))
    cluster.evict_pod(NS, first)  # the evicted pod's logs go with it; the new pod's are shown
    second = cluster.start_job_pod(NS, name_of(row.id))["metadata"]["name"]
    cluster.run_pod(NS, second)
    cluster.api.write_log(NS, second, "resumed at step 300\n")
    await until_async(lambda: service.job(row.id).runs == 2, "the second run")
    assert (await service.logs(service.job(row.id), 5))["lines"] == ["resumed at step 300"]


def test_kubernetes_mode_needs_an_image_and_known_job_options(tmp_path: Path) -> None:
    from traitlets import TraitError

    c = Config()
    c.TrainPool.kube_job_options = {"namespace": NS, "colour": "blue"}
    with pytest.raises(TraitError, match="unknown keys \\['colour'\\]"):
        TrainPool(config=c)
    with pytest.raises(ValueError, match="TrainPool.image"):
        make_service(tmp_path, None, image="")


async def test_one_guarantee_across_kai_shards_stops_the_hub_with_the_reason(tmp_path: Path) -> None:
    """On KAI every node pool is a scheduling shard with its own queues: a project's single
    guarantee over two pools has nowhere to live. The chart refuses it too (test_chart.py)."""
    pools = {"dgx": {"models": ["NVIDIA H100 80GB HBM3"]}, "ws": {}}
    with pytest.raises(ValueError, match="one guarantee of 1 GPUs across node pools ws, dgx cannot be said"):
        make_service(
            tmp_path, None, node_pools=pools, projects={"lab": {"guarantee": 1, "pools": ["ws", "dgx"]}}
        )
    ok = make_service(
        tmp_path,
        None,
        node_pools=pools,
        projects={"lab": {"guarantee": {"ws": 1}}, "borrow": {"guarantee": 0, "pools": ["ws", "dgx"]}},
    )
    assert ok.shards and ok.queue_pool("borrow", ("dgx",), 1000) == "dgx"  # one shard: the job's first pool


async def test_code_travels_as_data_and_each_back_end_runs_it_its_own_way(
    service: KubeTrainingService, cluster: Cluster
) -> None:
    """The API sends what the user gave (files and an entry); the Job runs it with the image's
    python, its notebook's executed copy beside the checkpoints; the embedded back-end runs the
    same code with the hub's TrainPool.python, the notebook beside its input."""
    nb = await service.submit(
        JobRequest(
            owner="ann", project="vision", name="nb", num_gpu=1, gpu_milli=1000, code=JobCode.notebook(b"{}")
        )
    )
    assert service.job(nb.id).command == [
        "python",
        "-m",
        "gpupool.widgets.execute",
        "input.ipynb",
        f"{service.opts.checkpoint_dir}/output.ipynb",
    ]
    job = cluster.job(NS, name_of(nb.id))
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == service.job(nb.id).command
    script = await service.submit(
        JobRequest(
            owner="ann",
            project="vision",
            name="s",
            num_gpu=1,
            gpu_milli=1000,
            code=JobCode.script(b"print(1)"),
        )
    )
    assert service.job(script.id).command == ["python", "job.py"]
    mine = ["/opt/env/bin/python", "-u", "train.py", "output.ipynb"]  # a user's command is run as given
    assert (
        await service.submit(
            JobRequest(
                owner="ann", project="vision", name="c", num_gpu=1, gpu_milli=1000, code=JobCode.command(mine)
            )
        )
    ).command == mine
    assert JobCode.notebook(b"{}").command_line("/usr/bin/python3") == [
        "/usr/bin/python3",
        "-m",
        "gpupool.widgets.execute",
        "input.ipynb",
        "output.ipynb",
    ]


async def test_jobs_waiting_in_kai_get_a_start_estimate_with_kais_reason(tmp_path: Path, api_client) -> None:
    """The jobs API's `eta` on Kubernetes (ApiServices' estimates, as the handlers read them):
    made from the hub's copy of the cluster by forecasting KAI's order. `nlp` borrowed all 4
    GPUs beyond its guarantee; a `vision` job due its guarantee reclaims them at once, while
    nlp's next job waits for the reclaimed one to resume and end (run times: the mean of nlp's
    finished jobs)."""
    from gpupool.api.services import ApiServices
    from gpupool.kube.kai_forecast import forecast
    from gpupool.store import PodSpanRow
    from gpupool.train.kai_estimates import KaiEstimates, kai_snapshot
    from gpupool.vocab.states import Intent
    from tests.support.jobs import job_request

    svc = make_service(
        tmp_path,
        api_client,
        projects={
            "vision": {"guarantee": 2, "department": "research"},
            "nlp": {"guarantee": 0, "department": "research"},
        },
        departments={"research": {"guarantee": 2, "limit": 4}},
    )
    now = 50_000.0

    def row(
        project: str, state: str = "queued", started: float | None = None, at: float = now - 600, **kw: object
    ) -> str:
        job = job_request(owner="ann", project=project, name="r", command=["true"], num_gpu=2)
        rid = svc._record_new(job, ["python"], at, message="waiting for GPUs in queue " + project).id
        svc._set(rid, state=state, started=started, **kw)
        return rid

    row("nlp", "succeeded", started=now - 5000, finished=now - 5000 + 1800)  # nlp's runs last 30 min
    n1 = row("nlp", "running", started=now - 300)
    n2 = row("nlp", "running", started=now - 200)  # the younger: KAI reclaims it first
    v1 = row("vision")
    n3 = row("nlp", at=now - 10)
    held = row("vision", intent=Intent.BUDGET_HOLD)
    estimates = ApiServices(svc.pool, None, training=svc).estimates  # type: ignore[arg-type]
    assert isinstance(estimates, KaiEstimates)
    estimates.clock = lambda: now
    eta = await estimates.for_job(svc.job(v1))
    assert eta is not None and eta["start"] == now and eta["in_s"] == 0
    assert eta["text"].endswith(
        "reclaims GPUs for queue vision (within its fair share) from queue nlp over theirs (job "
        + f"{n2} of nlp)"
    )
    assert "KAI-Scheduler's order" in eta["basis"] and "finished jobs of vision" not in eta["basis"]
    later = await estimates.for_job(svc.job(n3))
    # n1 ends at +25 min; the reclaimed n2 (older) resumes then with its 26 min left, and n3 follows
    assert later is not None and later["start"] == now + 1500 + 1600
    assert later["after"] == f"job {n2} of nlp is expected to end"
    assert "run times from the finished jobs of nlp (1)" in later["basis"]
    assert await estimates.for_job(svc.job(held)) is None  # its hold is its wait reason
    assert await estimates.for_job(svc.job(n1)) is None  # running
    # one forecast serves every request within its ttl, a held job's (which gets none) too
    computed = []
    counted = KaiEstimates(svc, clock=lambda: now, compute=lambda snap: computed.append(1) or forecast(snap))
    for job_id in (held, held, v1, n3):
        await counted.for_job(svc.job(job_id))
    assert len(computed) == 1
    # a forecast that took 3 s (a big cluster's) is made again only after 30 s
    ticks = iter([0.0, 3.0, 100.0, 100.0])
    slow = KaiEstimates(svc, clock=lambda: now, compute=lambda snap: computed.append(1) or forecast(snap))
    slow.timer = lambda: next(ticks)
    await slow.for_job(svc.job(v1))
    await slow.for_job(svc.job(v1), now=now + 29)
    assert len(computed) == 2
    await slow.for_job(svc.job(v1), now=now + 31)
    assert len(computed) == 3
    snap = kai_snapshot(svc, now)  # the queues as the chart renders them: projects under their department
    assert snap is not None and snap.queues["nlp"].parent == "department-research"
    assert snap.parents["department-research"].limit_milli == 4000
    # the running pods' nodes, from the relist's open spans; the nodes' GPUs from the inventory
    with svc.pool.store.session() as session:
        session.add(
            PodSpanRow(uid="p1", job=n1, owner="ann", milli=2000, start=int(now - 300), node="localhost")
        )
    snap = kai_snapshot(svc, now)
    assert snap is not None and snap.nodes == {"localhost": 4000}
    assert {j.id: j.placed for j in snap.running} == {n1: (("localhost", 2000),), n2: ()}
    # the chart's minRuntime of nlp's queue (20 min): KAI reclaims only a run that has lasted that
    # long, so vision's job starts when n1, the first to get there, does
    svc.opts = replace(svc.opts, queue_min_runtime={"nlp": "20m"})
    kept = KaiEstimates(svc, clock=lambda: now)
    eta = await kept.for_job(svc.job(v1))
    assert eta is not None and eta["start"] == now + 900 and eta["text"].endswith(f"(job {n1} of nlp)")
    assert eta["after"] == f"job {n1} of nlp passes its queue's min runtime"
