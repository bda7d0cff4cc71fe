"""Node pools, per-pool guarantees and elastic jobs as Kubernetes and KAI objects (pure
rendering, validated against Kubernetes' schemas and KAI's Queue CRD); KAI's real schedulers
place them in tests/cluster/test_kai_real.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.gpu.sharing import KAISharing, WholeGPUs
from gpupool.kube import TrainJobSpec
from gpupool.kube.objects import JobOptions, checkpoint_claim, train_job
from gpupool.kube.pool_objects import kai_shard, node_affinity, pool_queues, pool_term, shard_problem
from gpupool.pool import InvalidRequest
from gpupool.pool.pool_quotas import queue_pool
from gpupool.pool.pools import NodePool
from gpupool.pool.training import Project
from tests.k8s.test_chart import validate

OPTS = JobOptions(namespace="jobs", queue="{project}")
DGX = NodePool("dgx", models=frozenset({"NVIDIA H100 80GB HBM3"}))
WS = NodePool("ws")  # no models, no nodes: the nodes labelled kai.scheduler/node-pool=ws
VISION = Project(
    "vision", 6000, limit_milli=8000, pools=("dgx", "ws"), pool_guarantees=(("dgx", 4000), ("ws", 2000))
)


def spec(**kw) -> TrainJobSpec:
    return TrainJobSpec(
        id="a1b2c3",
        owner="ann",
        project="vision",
        num_gpu=kw.pop("num_gpu", 2),
        gpu_milli=1000,
        command=["python", "train.py"],
        image="registry.example.org/train:1",
        **kw,
    )


def test_pools_become_required_affinity_with_the_order_as_preference(schemas: Path) -> None:
    """Without KAI (kube-scheduler places the pods): any of the pools, the first preferred."""
    job = train_job(spec(pools=(DGX, WS)), OPTS, WholeGPUs())
    validate(job, schemas)
    aff = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    terms = aff["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [
        {
            "matchExpressions": [
                {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}
            ]
        },
        {"matchExpressions": [{"key": "kai.scheduler/node-pool", "operator": "In", "values": ["ws"]}]},
    ]
    assert [
        (p["weight"], p["preference"]) for p in aff["preferredDuringSchedulingIgnoredDuringExecution"]
    ] == [(100, terms[0]), (50, terms[1])]
    one = train_job(spec(pools=(WS,)), OPTS, KAISharing())["spec"]["template"]["spec"]["affinity"][
        "nodeAffinity"
    ]
    assert "preferredDuringSchedulingIgnoredDuringExecution" not in one
    assert "affinity" not in train_job(spec(), OPTS, KAISharing())["spec"]["template"]["spec"]
    nodes = pool_term(NodePool("n", nodes=frozenset({"b", "a"})), "x")
    assert nodes == {
        "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["a", "b"]}]
    }
    with pytest.raises(InvalidRequest, match="GPU indices, which mean nothing on a cluster"):
        node_affinity([NodePool("cards", gpus=frozenset({0}))], "x")


def test_every_project_has_a_queue_in_every_pools_shard(schemas: Path) -> None:
    """KAI's shards see only queues labelled for them: a project's workspaces or jobs on a pool
    wait in its leaf there, holding its guarantee there (0 where it only borrows)."""
    lab = Project("lab", 1000, pools=("ws",))  # one pool: its whole guarantee lives there
    queues = pool_queues(
        [VISION, lab, Project("flat", 2000)], labels={"app.kubernetes.io/managed-by": "gpupool"}
    )
    for q in queues:
        validate(q, schemas)
    by_name = {q["metadata"]["name"]: q for q in queues}
    assert sorted(by_name) == [
        "flat-dgx",
        "flat-ws",
        "lab-dgx",
        "lab-ws",
        "pool-dgx",
        "pool-ws",
        "vision-dgx",
        "vision-ws",
    ]
    assert all(
        q["metadata"]["labels"]["kai.scheduler/node-pool"] == q["metadata"]["name"].rsplit("-", 1)[1]
        for q in queues
    )
    leaf = by_name["vision-dgx"]
    assert leaf["spec"]["parentQueue"] == "pool-dgx" and leaf["spec"]["resources"]["gpu"]["quota"] == 4
    assert leaf["spec"]["resources"]["gpu"]["limit"] == 8
    gpu = {n: q["spec"]["resources"]["gpu"]["quota"] for n, q in by_name.items()}
    assert (gpu["pool-ws"], gpu["lab-ws"], gpu["lab-dgx"], gpu["flat-ws"]) == (3, 1, 0, 0)
    job = train_job(spec(pools=(WS,), queue_pool="ws"), OPTS, KAISharing())
    validate(job, schemas)
    assert job["metadata"]["labels"]["kai.scheduler/node-pool"] == "ws"  # the pod grouper copies it
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["kai.scheduler/queue"] == "vision-ws" and pod_labels["kai.scheduler/node-pool"] == "ws"


def test_a_job_goes_to_one_shard_and_one_guarantee_across_shards_is_refused() -> None:
    assert kai_shard(VISION, (), "ws") == "ws"  # a guarantee per pool: where the core sent it
    assert kai_shard(Project("lab", 1000, pools=("ws", "dgx")), (), None) == "ws"  # its first pool
    assert kai_shard(Project("lab", 0, pools=("ws", "dgx")), ("dgx",), None) == "dgx"  # the job's choice
    assert kai_shard(Project("flat", 1000), (), None) is None  # the default shard
    assert (
        shard_problem(Project("lab", 0, pools=("ws", "dgx"))) is None
    )  # borrows only: no guarantee to place
    assert shard_problem(VISION) is None and shard_problem(Project("one", 1000, pools=("ws",))) is None
    why = shard_problem(Project("lab", 1000, pools=("ws", "dgx")))
    assert "one guarantee of 1 GPUs across node pools ws, dgx" in why and '"ws": 1' in why


def test_the_core_picks_the_pool_whose_guarantee_the_job_fits() -> None:
    assert queue_pool(VISION, (), {}, 2000) == "dgx"
    assert queue_pool(VISION, (), {"dgx": 4000}, 1000) == "ws"  # the DGX guarantee is used up
    assert queue_pool(VISION, (), {"dgx": 4000, "ws": 2000}, 1000) == "dgx"  # borrows in its first pool
    assert queue_pool(VISION, ("ws", "dgx"), {}, 1000) == "ws"  # the job's own order
    assert queue_pool(Project("flat", 1000), (), {}, 1000) is None
    with pytest.raises(ValueError, match="has a guarantee only in"):
        queue_pool(Project("p", 1000, pools=("a", "b"), pool_guarantees=(("a", 1000),)), ("b",), {}, 1000)


def test_an_elastic_job_is_one_pod_per_gpu_with_kais_min_member(schemas: Path) -> None:
    job = train_job(spec(num_gpu=4, min_gpus=2), OPTS, KAISharing())
    validate(job, schemas)
    assert job["spec"]["parallelism"] == 4 and "completions" not in job["spec"]
    assert job["metadata"]["annotations"]["kai.scheduler/batch-min-member"] == "2"
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert (env["GPUPOOL_GPUS"], env["GPUPOOL_MIN_WORKERS"], env["GPUPOOL_MAX_WORKERS"]) == ("1", "2", "4")
    assert checkpoint_claim(spec(num_gpu=4, min_gpus=2), OPTS)["spec"]["accessModes"] == ["ReadWriteMany"]
    fixed = train_job(spec(num_gpu=4), OPTS, KAISharing())
    assert (
        "parallelism" not in fixed["spec"]
        and "kai.scheduler/batch-min-member" not in fixed["metadata"]["annotations"]
    )
    with pytest.raises(InvalidRequest, match="whole GPUs"):
        spec(num_gpu=2, min_gpus=3)


POOL_VALUES = {
    "departments": {"research": {"quota": 8}},
    "projects": {
        "vision": {
            "department": "research",
            "guarantee": {"dgx": 4, "ws": 2},
            "limit": 8,
            "overQuotaWeight": 2,
        },
        "lab": {"department": "research", "guarantee": 1, "pools": ["ws"]},
    },
    "nodePools": {"dgx": {"models": ["NVIDIA H100 80GB HBM3"]}, "ws": {}},
    "build": {"defaultProject": "lab"},
}


def test_the_chart_renders_the_same_per_pool_queues_and_the_hub_reads_the_pools(
    schemas: Path, tmp_path: Path
) -> None:
    """One source of truth: the chart's queues for a guarantee per pool are what
    gpupool.kube.pool_objects renders from the project table the hub reads from the chart."""
    from traitlets.config import Config

    from gpupool.kube.chart_config import load_chart_config
    from gpupool.train.config import TrainPool
    from tests.k8s.test_chart import hub_config, render

    docs = render(POOL_VALUES)
    for d in docs:
        validate(d, schemas)
    queues = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Queue"}
    # a guarantee lives in one shard: the project's queue in the default shard holds none of it
    assert queues["vision"]["spec"]["resources"]["gpu"]["quota"] == 0
    c = Config()
    load_chart_config(c, hub_config(docs, tmp_path))
    train = TrainPool(config=c)
    projects = train.project_table()
    assert projects["vision"].pool_guarantees == (("dgx", 4000), ("ws", 2000)) and projects["lab"].pools == (
        "ws",
    )
    assert train.pool_table()["ws"] == NodePool("ws")
    ours = pool_queues(list(projects.values()), list(train.pool_table()))
    for q in ours:
        chart = queues[q["metadata"]["name"]]
        assert (
            chart["metadata"]["labels"]["kai.scheduler/node-pool"]
            == q["metadata"]["labels"]["kai.scheduler/node-pool"]
        )
        assert chart["spec"] == q["spec"], q["metadata"]["name"]
    assert {n for n in queues if "-" in n and not n.startswith("department-")} == {
        q["metadata"]["name"] for q in ours
    }
    shards = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "SchedulingShard"}
    assert shards == {
        f"gpupool-{p}": {"partitionLabelValue": p, "args": {"update-pod-eviction-condition": "true"}}
        for p in ("dgx", "ws")
    }
    from tests.k8s.test_chart import render as again

    with pytest.raises(Exception, match="node pool cloud, which is not in .Values.nodePools"):
        again({**POOL_VALUES, "projects": {"v": {"department": "research", "guarantee": {"cloud": 1}}}})
    with pytest.raises(Exception, match="one guarantee of 1 GPUs across node pools ws, dgx cannot be said"):
        again(
            {
                **POOL_VALUES,
                "projects": {"v": {"department": "research", "guarantee": 1, "pools": ["ws", "dgx"]}},
            }
        )
    # without KAI, pools are node affinity for kube-scheduler: no shards, no per-pool queues
    plain = again({**POOL_VALUES, "sharing": {"backend": "whole"}})
    assert not [
        d
        for d in plain
        if d["kind"] == "SchedulingShard"
        or "-" in d["metadata"]["name"]
        and d["kind"] == "Queue"
        and not d["metadata"]["name"].startswith("department-")
    ]
