"""The training pool's Kubernetes back-end where the real control plane cannot serve: a job's
logs. Logs come from `pods/log`, which the API server proxies to the kubelet of the pod's node;
kwok's nodes run no container and serve no logs, so this stays on the fake API server (which
serves what a test writes). Everything else the service does is tested on the real plane:
tests/cluster/test_train_service_real.py."""

from __future__ import annotations

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
