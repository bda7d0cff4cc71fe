"""The training pool's Kubernetes back-end where the real control plane cannot serve: a job's
logs (kept by the hub, hub_ext/kube/pod_logs.py). Logs come from `pods/log`, which the API server
proxies to the kubelet of the pod's node;
kwok's nodes run no container and serve one file as every pod's log, so a log per pod (and a
stream that ends with its container) stays on the fake API server (which serves what a test
writes); the real plane's `pods/log` is in tests/cluster/test_train_service_real.py. Everything else the service does is tested on the real plane:
tests/cluster/test_train_service_real.py."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest
from traitlets.config import Config

from gpupool.gpu.sharing import KAISharing
from gpupool.kube.objects import name_of
from gpupool.kube.pod_logs import LogCap
from gpupool.runners.wrap import copy_output
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
    if svc.kept is not None:
        svc.kept.retry_s = 0.1  # a stream that ended before the watch said its pod did: read again soon
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


def job_request(name: str = "resnet") -> JobRequest:
    return JobRequest(
        owner="ann",
        project="vision",
        name=name,
        num_gpu=1,
        gpu_milli=1000,
        code=JobCode.command(["python", "job.py"], {"job.py": b"1"}),
    )


async def running_pod(service: KubeTrainingService, cluster: Cluster, job_id: str, runs: int = 1) -> str:
    pod = cluster.start_job_pod(NS, name_of(job_id))["metadata"]["name"]
    cluster.run_pod(NS, pod)
    await until_async(lambda: service.job(job_id).runs == runs, f"run {runs} of the job")
    return pod


async def shown(service: KubeTrainingService, job_id: str, lines: list[str], tail: int = 5) -> None:
    """Wait until the job's kept log ends with `lines`, then check the API says the same."""
    assert service.kept is not None
    kept = service.kept
    await until_async(
        lambda: (kept._read(job_id, tail, None) or ([], 0))[0] == lines,
        f"the job's log ending {lines[-1:]}",
        detail=lambda: kept._read(job_id, tail, None),
    )
    assert (await service.logs(service.job(job_id), tail))["lines"] == lines


async def test_the_log_is_kept_across_pods_and_after_they_are_gone(
    service: KubeTrainingService, cluster: Cluster
) -> None:
    """The hub copies each pod's log stream into the job's kept log (TrainPool.kube_logs_dir):
    a preempted job's resumed pod goes on the same log, as on one machine, and the job's page
    still shows it once its pods and its Job are gone (a pod's own log goes with the pod)."""
    row = await service.submit(job_request())
    assert await service.logs(service.job(row.id), 5) == {
        "lines": [],
        "before": 0,
        "output_notebook": None,
    }  # no pod
    first = await running_pod(service, cluster, row.id)
    cluster.api.write_log(NS, first, "".join(f"step {i}\n" for i in range(300)))
    await shown(service, row.id, [f"step {i}" for i in range(295, 300)])
    logs = await service.logs(service.job(row.id), 5)
    # paging back, as on the embedded runner: the lines before the first one shown
    earlier = await service.logs(service.job(row.id), 5, before=logs["before"])
    assert earlier["lines"] == [f"step {i}" for i in range(290, 295)]
    assert earlier["before"] == len("".join(f"step {i}\n" for i in range(290)))
    cluster.evict_pod(NS, first)  # its own log goes with it: the kept one stays
    second = await running_pod(service, cluster, row.id, runs=2)
    cluster.api.write_log(NS, second, "resumed at step 300\n")
    await shown(service, row.id, [f"step {i}" for i in range(296, 300)] + ["resumed at step 300"])
    await service.cancel(row.id)
    await until_async(lambda: service.job(row.id).state == "cancelled", "the job cancelled")
    assert cluster.pods(NS, f"batch.kubernetes.io/job-name={name_of(row.id)}") == []
    assert (await service.logs(service.job(row.id), 2))["lines"] == ["step 299", "resumed at step 300"]
    # removed with the job's folder on one machine: c.TrainPool.keep_finished_days after its end
    kept = service.kept
    assert kept is not None
    await until_async(lambda: not kept.tasks, "the pods' logs no longer followed")
    ended, keep_s = service.job(row.id).finished, service.cfg.keep_finished_days * 86400
    assert await service.remove_old_logs(now=ended + keep_s - 60) == []
    assert (await service.logs(service.job(row.id), 1))["lines"] == ["resumed at step 300"]
    assert await service.remove_old_logs(now=ended + keep_s) == [row.id]
    assert (await service.logs(service.job(row.id), 1))["lines"] == []  # ended just now: nothing said
    service._set(row.id, finished=ended - keep_s)  # it ended that long ago (the page is read now)
    assert (await service.logs(service.job(row.id), 1))["lines"] == [
        "gpupool: this job's log is no longer kept (the logs of finished jobs are removed"
        " after c.TrainPool.keep_finished_days)"
    ]


async def test_a_log_over_its_limit_is_cut_with_the_note_and_a_restarted_hub_goes_on_without_repeats(
    tmp_path: Path, api_client, cluster: Cluster
) -> None:
    """The kept log holds at most TrainPool.max_log_mib, then one machine's note; a hub
    restarted while a pod runs goes on from where the kept log stopped (no line twice)."""
    svc = make_service(tmp_path, api_client, max_log_mib=1)
    await svc.start()
    row = await svc.submit(job_request())
    pod = await running_pod(svc, cluster, row.id)
    cluster.api.write_log(NS, pod, "before the restart\n")
    await shown(svc, row.id, ["before the restart"])
    await svc.stop()  # the hub goes down while the pod runs and prints
    cluster.api.write_log(NS, pod, "while it was down\n")
    svc = make_service(tmp_path, api_client, max_log_mib=1)
    await svc.start()
    try:
        await shown(svc, row.id, ["before the restart", "while it was down"])
        line = "x" * 99 + "\n"
        cluster.api.write_log(NS, pod, line * 20_000)  # 2 MB: over the 1 MiB limit
        note = "--- gpupool: the log reached its limit of 1 MiB (c.TrainPool.max_log_mib); the job goes on, its further output is not kept ---"
        await shown(svc, row.id, [note], tail=1)
        kept = (tmp_path / "train-logs" / f"{row.id}.log").read_bytes()
        assert len(kept) == 1024 * 1024 + len(note) + 2  # the limit, then "\n" + the note + "\n"
        assert kept.startswith(b"before the restart\nwhile it was down\n" + line.encode())
    finally:
        await svc.stop()


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


async def test_a_log_stream_left_open_by_a_lost_node_is_dropped_once_its_pod_is_gone(
    service: KubeTrainingService, cluster: Cluster
) -> None:
    """A follow has no read timeout (a job may print nothing for hours): a stream a lost node
    never ends is dropped gone_grace_s after the pod is gone, so it holds no slot for ever,
    and what it copied stays."""
    kept = service.kept
    assert kept is not None
    kept.gone_grace_s = 0.2
    row = await service.submit(job_request())
    pod = await running_pod(service, cluster, row.id)
    cluster.api.write_log(NS, pod, "epoch 1\n")
    await shown(service, row.id, ["epoch 1"])
    cluster.api.lose_node_of(NS, pod)
    cluster.evict_pod(NS, pod)
    await until_async(lambda: service.job(row.id).preemptions == 1, "the pod gone")
    await until_async(lambda: not kept.tasks, "the stream dropped")
    assert (await service.logs(service.job(row.id), 5))["lines"] == ["epoch 1"]


@pytest.mark.parametrize("already", [0, 700_000, 1024 * 1024, 1_500_000])
def test_the_kept_log_is_cut_byte_for_byte_as_on_one_machine(tmp_path: Path, already: int) -> None:
    """LogCap (Kubernetes) and one machine's wrapper (runners/wrap.py) keep the same bytes of the
    same output, whatever the chunks it comes in, also for a resumed run whose log already
    holds `already` bytes (over the limit too: that run gets its own note, as on one machine)."""
    limit = 1024 * 1024
    output = b"".join(f"step {i} loss {i / 7:.5f}\n".encode() for i in range(30_000))  # 0.8 MB
    src, dst = tmp_path / "output", tmp_path / "job.log"
    src.write_bytes(output)
    dst.write_bytes(b"x" * already)
    with open(src, "rb") as fin, open(dst, "ab") as fout:
        copy_output(fin.fileno(), fout.fileno(), limit)
    cap, kept, rng = LogCap(already, limit), [b"x" * already], random.Random(already)
    at = 0
    while at < len(output):
        step = rng.randint(1, 100_000)
        kept.append(cap.feed(output[at : at + step]))
        at += step
    assert b"".join(kept) == dst.read_bytes()
    assert cap.cut == (already + len(output) > limit)
