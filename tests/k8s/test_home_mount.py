"""A train job sees its owner's home (gpupool.kube.home_mount): the claim their workspace mounts,
named as kubespawner names it, in the job's namespace, read-only unless the admin says
otherwise, and placed where the volume's access mode lets it be mounted. The chart's value
is in tests/k8s/test_chart.py; the claim in a real user namespace's pod spec in
tests/cluster/test_train_user_namespaces_real.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import kubernetes_validate
import pytest
from kubespawner import KubeSpawner
from traitlets import TraitError
from traitlets.config import Config

from gpupool.kube import TrainJobSpec
from gpupool.kube.home_mount import HomeUnavailable, home_node, nodes_using
from gpupool.kube.objects import train_job
from gpupool.pool import InvalidRequest
from gpupool.train.code import JobCode
from gpupool.train.config import TrainPool
from gpupool.train.kube_service import KubeTrainingService
from gpupool.train.request import JobRequest
from tests.k8s.fake_apiserver import FakeAPIServer
from tests.k8s.test_job_namespace import NAMES
from tests.support.pools import make_pool, train_config

K8S = kubernetes_validate.latest_version()
# z2jh 4.4.0's singleuser.storage (type: dynamic), as its jupyterhub_config.py sets kubespawner
Z2JH_VOLUMES = {
    "volume-{user_server}": {
        "name": "volume-{user_server}",
        "persistentVolumeClaim": {"claimName": "{pvc_name}"},
    }
}
Z2JH_MOUNTS = {
    "volume-{user_server}": {"mountPath": "/home/jovyan", "name": "volume-{user_server}", "subPath": None}
}


def z2jh(c: Config, mount: str = "read-only") -> Config:
    c.KubeSpawner.volumes = Z2JH_VOLUMES
    c.KubeSpawner.volume_mounts = Z2JH_MOUNTS
    c.KubeSpawner.storage_pvc_ensure = True
    c.TrainPool.home_mount = mount
    return c


def kubespawners_volumes(user: str, scheme: str, namespace: str, pvc_template: str) -> list[dict]:
    """The volumes kubespawner itself puts in `user`'s workspace pod (its own expansion, run on a
    stand-in spawner: a real one needs a Kubernetes client)."""
    ws = SimpleNamespace(
        name="", user=SimpleNamespace(name=user, id=7), slug_scheme=scheme, namespace=namespace
    )
    ws._namespace_default = lambda: "jhub"
    ws._expand_user_properties = lambda t, slug_scheme=None: KubeSpawner._expand_user_properties(
        ws, t, slug_scheme
    )
    ws._expand_all = lambda src: KubeSpawner._expand_all(ws, src)
    ws.pvc_name = ws._expand_user_properties(pvc_template)
    return KubeSpawner._expand_all(ws, KubeSpawner._sorted_dict_values(ws, Z2JH_VOLUMES))


def spec(owner: str) -> TrainJobSpec:
    return TrainJobSpec(
        id="j1",
        owner=owner,
        project="vision",
        num_gpu=1,
        gpu_milli=1000,
        command=["python", "train.py"],
        image="registry.example.org/train:1",
    )


@pytest.mark.parametrize("scheme", ["safe", "escape"])
@pytest.mark.parametrize("user_namespaces", [False, True])
@pytest.mark.parametrize("pvc_template", ["claim-{user_server}", "claim-{username}{servername}"])
def test_a_jobs_home_is_the_claim_kubespawner_names_for_its_owners_workspace(
    scheme: str, user_namespaces: bool, pvc_template: str
) -> None:
    c = z2jh(Config())
    c.TrainPool.kube_job_options = {"namespace": "jhub"}
    c.KubeSpawner.slug_scheme = scheme
    c.KubeSpawner.pvc_name_template = pvc_template
    if user_namespaces:
        c.KubeSpawner.enable_user_namespaces = True
        c.KubeSpawner.user_namespace_template = "gpupool-{username}"
    opts = TrainPool(config=c).job_options()
    for user in NAMES:
        if scheme == "escape" and user_namespaces and len(user) > 40:
            continue  # kubespawner's own namespace would be no DNS label (test_job_namespace)
        job = train_job(spec(user), opts)
        if user == NAMES[0]:  # once: a valid Job (the schema check is slow)
            kubernetes_validate.validate(job, K8S, strict=True)
        pod = job["spec"]["template"]["spec"]
        ns = job["metadata"]["namespace"]
        assert (ns == "jhub") is not user_namespaces
        theirs = kubespawners_volumes(user, scheme, ns, pvc_template)[0]["persistentVolumeClaim"]["claimName"]
        home = next(v for v in pod["volumes"] if v["name"] == "home")
        assert home["persistentVolumeClaim"] == {"claimName": theirs, "readOnly": True}, user
        mounted = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "home")
        assert mounted == {"name": "home", "mountPath": "/home/jovyan", "readOnly": True}


def test_the_home_is_mounted_only_when_asked_and_written_only_when_allowed() -> None:
    c = Config()
    c.KubeSpawner.volumes, c.KubeSpawner.volume_mounts = Z2JH_VOLUMES, Z2JH_MOUNTS
    pod = train_job(spec("ann"), TrainPool(config=c).job_options())["spec"]["template"]["spec"]
    assert "home" not in {v["name"] for v in pod["volumes"]}  # off by default
    # z2jh's static storage: one shared claim, each user's folder a subPath
    c = z2jh(Config(), "read-write")
    c.KubeSpawner.volumes = [{"name": "home", "persistentVolumeClaim": {"claimName": "nfs-homes"}}]
    c.KubeSpawner.volume_mounts = [{"name": "home", "mountPath": "/home/{username}", "subPath": "{username}"}]
    c.TrainPool.home_mount_path = "/home/{username}"
    pod = train_job(spec("Ada.Lovelace@Uni"), TrainPool(config=c).job_options())["spec"]["template"]["spec"]
    assert {"name": "home", "persistentVolumeClaim": {"claimName": "nfs-homes", "readOnly": False}} in pod[
        "volumes"
    ]
    slug = KubeSpawner._expand_user_properties(
        SimpleNamespace(
            name="",
            user=SimpleNamespace(name="Ada.Lovelace@Uni", id=7),
            slug_scheme="safe",
            _namespace_default=lambda: "jhub",
        ),
        "{username}",
    )
    assert {"name": "home", "mountPath": f"/home/{slug}", "subPath": slug, "readOnly": False} in pod[
        "containers"
    ][0]["volumeMounts"]


def test_a_home_the_hub_cannot_find_or_name_stops_it_at_start(tmp_path: Path) -> None:
    c = z2jh(Config())
    c.TrainPool.home_mount_path = "/home/{username}"  # not where z2jh mounts it
    with pytest.raises(TraitError, match="mount nothing at '/home/{username}'.*/home/jovyan"):
        TrainPool(config=c).job_options()
    c = z2jh(Config())
    c.KubeSpawner.volumes = {"volume-{user_server}": {"name": "volume-{user_server}", "emptyDir": {}}}
    with pytest.raises(TraitError, match="not a PersistentVolumeClaim"):
        TrainPool(config=c).job_options()
    c = z2jh(train_config(tmp_path, runner="kubernetes", image="registry.example.org/train:1"))
    c.KubeSpawner.pvc_name_template = "claim-{userid}"  # the hub's database id: not known for a job
    with pytest.raises(ValueError, match="pvc_name_template 'claim-{userid}' uses userid"):
        KubeTrainingService(make_pool(tmp_path, 4), TrainPool(config=c), None)


def test_where_a_job_may_mount_the_home_is_its_access_modes_to_say() -> None:
    pods = [
        {
            "spec": {
                "nodeName": "gpu-3",
                "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "claim-ann"}}],
            },
            "status": {"phase": "Running"},
        },
        {
            "spec": {
                "nodeName": "gpu-1",
                "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "claim-bob"}}],
            },
            "status": {"phase": "Running"},
        },
        {
            "spec": {
                "nodeName": "gpu-2",
                "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "claim-ann"}}],
            },
            "status": {"phase": "Succeeded"},
        },  # an ended pod holds no volume
    ]
    nodes = nodes_using(pods, "claim-ann")
    assert nodes == ["gpu-3"]
    assert home_node("claim-ann", "jhub", ["ReadWriteMany"], False, []) == ""
    assert home_node("claim-ann", "jhub", ["ReadOnlyMany"], True, []) == ""
    assert home_node("claim-ann", "jhub", ["ReadWriteOnce"], True, nodes) == "gpu-3"
    with pytest.raises(HomeUnavailable, match="ReadWriteOnce.*Start your server"):
        home_node("claim-ann", "jhub", ["ReadWriteOnce"], True, [])
    with pytest.raises(HomeUnavailable, match="several nodes"):
        home_node("claim-ann", "jhub", ["ReadWriteOnce"], True, ["gpu-1", "gpu-3"])
    with pytest.raises(HomeUnavailable, match="ReadWriteOncePod"):
        home_node("claim-ann", "jhub", ["ReadWriteOncePod"], True, nodes)
    with pytest.raises(HomeUnavailable, match="ReadOnlyMany"):  # read-write on a read-only volume
        home_node("claim-ann", "jhub", ["ReadOnlyMany"], False, [])


async def test_a_job_goes_to_the_node_of_the_workspace_that_holds_its_home_or_is_refused(
    tmp_path: Path, apiserver: FakeAPIServer, api_client
) -> None:
    from gpupool.gpu.sharing import KAISharing
    from gpupool.kube.objects import name_of

    c = z2jh(
        train_config(
            tmp_path,
            projects={"vision": {"guarantee": 1}},
            runner="kubernetes",
            image="registry.example.org/train:1",
            kube_job_options={"namespace": "jhub"},
        )
    )
    svc = KubeTrainingService(make_pool(tmp_path, 4), TrainPool(config=c), api_client, KAISharing())
    svc.controller.watch_timeout_s = 2

    def request(name: str) -> JobRequest:
        return JobRequest(
            owner="ann",
            project="vision",
            name=name,
            num_gpu=1,
            gpu_milli=1000,
            code=JobCode.command(["python", "train.py"]),
        )

    def claim(modes: list[str]) -> dict:
        return {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "claim-ann"},
            "spec": {"accessModes": modes, "resources": {"requests": {"storage": "1Gi"}}},
        }

    await svc.start()
    try:
        with pytest.raises(InvalidRequest, match="jhub/claim-ann.*does not exist yet"):
            await svc.submit(request("before-any-server"))
        apiserver.create("api/v1", "persistentvolumeclaims", "jhub", claim(["ReadWriteOnce"]))
        with pytest.raises(InvalidRequest, match="ReadWriteOnce.*Start your server"):
            await svc.submit(request("server-stopped"))
        assert apiserver.list("apis/batch/v1", "jobs", "jhub") == []  # refused, not left pending
        apiserver.create(
            "api/v1",
            "pods",
            "jhub",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "jupyter-ann", "labels": {"component": "singleuser-server"}},
                "spec": {
                    "nodeName": "gpu-3",
                    "containers": [{"name": "notebook", "image": "jupyter/base"}],
                    "volumes": [{"name": "volume-ann", "persistentVolumeClaim": {"claimName": "claim-ann"}}],
                },
                "status": {"phase": "Running"},
            },
        )
        row = await svc.submit(request("beside-the-notebook"))
        job = apiserver.get("apis/batch/v1", "jobs", "jhub", name_of(row.id))
        affinity = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
        terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms == [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["gpu-3"]}]}
        ]
        # shared storage: anywhere
        apiserver.remove("api/v1", "persistentvolumeclaims", "jhub", "claim-ann")
        apiserver.create("api/v1", "persistentvolumeclaims", "jhub", claim(["ReadWriteMany"]))
        row = await svc.submit(request("anywhere"))
        job = apiserver.get("apis/batch/v1", "jobs", "jhub", name_of(row.id))
        assert "affinity" not in job["spec"]["template"]["spec"]
        assert {"name": "home", "persistentVolumeClaim": {"claimName": "claim-ann", "readOnly": True}} in job[
            "spec"
        ]["template"]["spec"]["volumes"]
    finally:
        await svc.stop()


def test_the_charts_home_value_reaches_the_hub_and_finds_z2jhs_storage() -> None:
    import json

    from tests.k8s.test_chart import render

    def hub_config(values: dict) -> Config:
        docs = render({"hub": {"namespace": "jhub"}, **values})
        cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpupool-config")
        c = Config(json.loads(cm["data"]["hub-config.json"]))
        c.KubeSpawner.volumes, c.KubeSpawner.volume_mounts = Z2JH_VOLUMES, Z2JH_MOUNTS  # z2jh's own
        return c

    assert TrainPool(config=hub_config({})).job_options().home_claim == ""  # off unless asked
    opts = TrainPool(config=hub_config({"jobs": {"home": {"mount": "read-write"}}})).job_options()
    assert (opts.home_claim, opts.home_mount_path, opts.home_read_only) == (
        "{pvc_name}",
        "/home/jovyan",
        False,
    )
