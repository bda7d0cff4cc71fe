"""Node pools, per-pool guarantees and elastic jobs as Kubernetes and KAI objects (pure
rendering, validated against Kubernetes' schemas and KAI's Queue CRD); admission by a real API
server is in tests/cluster/test_train_pools_real.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpupool.gpu.sharing import KAISharing
from gpupool.kube import TrainJobSpec
from gpupool.kube.objects import JobOptions, checkpoint_claim, train_job
from gpupool.kube.pool_objects import node_affinity, pool_queues, pool_term
from gpupool.pool import InvalidRequest
from gpupool.pool.pool_quotas import queue_pool
from gpupool.pool.pools import NodePool
from gpupool.pool.training import Project

from tests.k8s.test_chart import validate

OPTS = JobOptions(namespace="jobs", queue="{project}")
DGX = NodePool("dgx", models=frozenset({"NVIDIA H100 80GB HBM3"}))
WS = NodePool("ws")  # no models, no nodes: the nodes labelled gpupool.io/node-pool=ws
VISION = Project("vision", 6000, limit_milli=8000, pools=("dgx", "ws"),
                 pool_guarantees=(("dgx", 4000), ("ws", 2000)))


def spec(**kw) -> TrainJobSpec:
    return TrainJobSpec(id="a1b2c3", owner="ann", project="vision", num_gpu=kw.pop("num_gpu", 2), gpu_milli=1000,
                        command=["python", "train.py"], image="registry.example.org/train:1", **kw)


def test_pools_become_required_affinity_with_the_order_as_preference(schemas: Path) -> None:
    job = train_job(spec(pools=(DGX, WS)), OPTS, KAISharing())
    validate(job, schemas)
    aff = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    terms = aff["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                                            "values": ["NVIDIA-H100-80GB-HBM3"]}]},
                     {"matchExpressions": [{"key": "gpupool.io/node-pool", "operator": "In", "values": ["ws"]}]}]
    assert [(p["weight"], p["preference"]) for p in aff["preferredDuringSchedulingIgnoredDuringExecution"]] == \
        [(100, terms[0]), (50, terms[1])]
    one = train_job(spec(pools=(WS,)), OPTS, KAISharing())["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    assert "preferredDuringSchedulingIgnoredDuringExecution" not in one
    assert "affinity" not in train_job(spec(), OPTS, KAISharing())["spec"]["template"]["spec"]
    nodes = pool_term(NodePool("n", nodes=frozenset({"b", "a"})), "x")
    assert nodes == {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["a", "b"]}]}
    with pytest.raises(InvalidRequest, match="GPU indices, which mean nothing on a cluster"):
        node_affinity([NodePool("cards", gpus=frozenset({0}))], "x")


def test_a_guarantee_per_pool_is_a_queue_per_pool_in_that_pools_shard(schemas: Path) -> None:
    queues = pool_queues([VISION, Project("lab", 0)], labels={"app.kubernetes.io/managed-by": "gpupool"})
    for q in queues:
        validate(q, schemas)
    by_name = {q["metadata"]["name"]: q for q in queues}
    assert sorted(by_name) == ["pool-dgx", "pool-ws", "vision-dgx", "vision-ws"]
    leaf = by_name["vision-dgx"]
    assert leaf["metadata"]["labels"]["kai.scheduler/node-pool"] == "dgx"
    assert leaf["spec"]["parentQueue"] == "pool-dgx" and leaf["spec"]["resources"]["gpu"]["quota"] == 4
    assert leaf["spec"]["resources"]["gpu"]["limit"] == 8
    assert by_name["pool-ws"]["spec"]["resources"]["gpu"]["quota"] == 2
    job = train_job(spec(pools=(WS,), queue_pool="ws"), OPTS, KAISharing())
    validate(job, schemas)
    assert job["metadata"]["labels"]["kai.scheduler/node-pool"] == "ws"  # the pod grouper copies it
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["kai.scheduler/queue"] == "vision-ws" and pod_labels["kai.scheduler/node-pool"] == "ws"


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
    assert "parallelism" not in fixed["spec"] and "kai.scheduler/batch-min-member" not in fixed["metadata"]["annotations"]
    with pytest.raises(InvalidRequest, match="whole GPUs"):
        spec(num_gpu=2, min_gpus=3)


POOL_VALUES = {
    "departments": {"research": {"quota": 8}},
    "projects": {"vision": {"department": "research", "guarantee": {"dgx": 4, "ws": 2}, "limit": 8,
                            "overQuotaWeight": 2},
                 "lab": {"department": "research", "guarantee": 1, "pools": ["ws", "dgx"]}},
    "nodePools": {"dgx": {"models": ["NVIDIA H100 80GB HBM3"]}, "ws": {}},
}


def test_the_chart_renders_the_same_per_pool_queues_and_the_hub_reads_the_pools(schemas: Path,
                                                                                 tmp_path: Path) -> None:
    """One source of truth: the chart's queues for a guarantee per pool are what
    gpupool.kube.pool_objects renders from the project table the hub reads from the chart."""
    from gpupool.kube.chart_config import apply_chart_config
    from gpupool.train.config import TrainPool
    from traitlets.config import Config

    from tests.k8s.test_chart import render

    docs = render(POOL_VALUES)
    for d in docs:
        validate(d, schemas)
    queues = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Queue"}
    assert queues["vision"]["spec"]["resources"]["gpu"]["quota"] == 6  # the project's own: the sum
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    (tmp_path / "gpupool.json").write_text(cm["data"]["gpupool.json"])
    c = Config()
    apply_chart_config(c, tmp_path / "gpupool.json")
    train = TrainPool(config=c)
    projects = train.project_table()
    assert projects["vision"].pool_guarantees == (("dgx", 4000), ("ws", 2000)) and projects["lab"].pools == ("ws", "dgx")
    assert train.pool_table()["ws"] == NodePool("ws")
    for q in pool_queues(list(projects.values())):
        chart = queues[q["metadata"]["name"]]
        assert chart["metadata"]["labels"]["kai.scheduler/node-pool"] == q["metadata"]["labels"]["kai.scheduler/node-pool"]
        assert chart["spec"] == q["spec"], q["metadata"]["name"]
    assert {n for n in queues if n.startswith(("pool-", "vision-"))} == {"pool-dgx", "pool-ws", "vision-dgx", "vision-ws"}
    from tests.k8s.test_chart import render as again

    with pytest.raises(Exception, match="node pool cloud, which is not in .Values.nodePools"):
        again({**POOL_VALUES, "projects": {"v": {"department": "research", "guarantee": {"cloud": 1}}}})


@pytest.mark.hub
def test_a_hub_in_kubernetes_mode_takes_pools_and_elastic_jobs(make_hub, kubeconfig: Path, cluster) -> None:
    """Through the REST API: pools and min_gpus are no longer refused on Kubernetes; the Jobs
    carry the mapping, and a job whose pools have no queue for its project is refused (400)."""
    from gpupool.kube.objects import name_of

    ns = "jobs"
    hub = make_hub(f"""
        c.TrainPool.runner = "kubernetes"
        c.TrainPool.image = "registry.example.org/train:1"
        c.TrainPool.node_pools = {{"dgx": {{"models": ["NVIDIA H100 80GB HBM3"]}}, "ws": {{}}, "cloud": {{}}}}
        c.TrainPool.projects = {{"vision": {{"guarantee": {{"dgx": 4, "ws": 2}}, "pools": ["dgx", "ws", "cloud"]}},
                                 "lab": {{"guarantee": 1}}}}
        c.TrainPool.kube_job_options = {{"namespace": "{ns}"}}
    """, env={"KUBECONFIG": str(kubeconfig), "GPUPOOL_CULLER": "0"}).start()
    J = "/services/gpupool/api/jobs"
    token = hub.user_token("ann")
    elastic = hub.api("POST", J, {"project": "lab", "gpus": 4, "min_gpus": 2, "pools": ["ws", "dgx"],
                                  "command": "python train.py"}, token=token)
    job = cluster.job(ns, name_of(elastic["id"]))
    assert job["spec"]["parallelism"] == 4 and job["metadata"]["annotations"]["kai.scheduler/batch-min-member"] == "2"
    terms = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    assert [t["matchExpressions"][0]["values"] for t in
            terms["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]] == [
        ["ws"], ["NVIDIA-H100-80GB-HBM3"]]
    per_pool = hub.api("POST", J, {"project": "vision", "gpus": 2, "pools": ["ws", "dgx"], "command": "true"},
                       token=token)
    labels = cluster.job(ns, name_of(per_pool["id"]))["spec"]["template"]["metadata"]["labels"]
    assert labels["kai.scheduler/queue"] == "vision-ws" and labels["kai.scheduler/node-pool"] == "ws"
    code, message = hub.api_error("POST", J, {"project": "vision", "gpus": 1, "pools": ["cloud"], "command": "true"},
                                  token=token)
    assert code == 400 and "has a guarantee only in ['dgx', 'ws']" in message
