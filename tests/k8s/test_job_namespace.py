"""Which namespace a user's train Job goes to with user namespaces (gpupool.kube.job_namespace),
and what the chart gives the hub for it; the Jobs themselves on the real control plane are in
tests/cluster/test_train_user_namespaces_real.py."""

from __future__ import annotations

import base64
import json
from types import SimpleNamespace

import pytest
from kubespawner import KubeSpawner
from traitlets.config import Config

from gpupool.kube import TrainJobSpec
from gpupool.kube.job_namespace import owner_namespace, template_problem
from gpupool.kube.objects import JobOptions, checkpoint_claim, code_config_map, job_namespace, train_job
from gpupool.train.config import TrainPool
from tests.k8s.test_chart import render

NAMES = ["ann", "Ada.Lovelace@Uni", "ÉLODIE", "x" * 70, "-dash-", "bob@uni.edu"]


def kubespawners_namespace(user: str, template: str, scheme: str, hub_ns: str = "jhub") -> str:
    """What kubespawner itself expands for `user`'s default server (its template code, run on
    a stand-in spawner: a real one needs a Kubernetes client)."""
    ws = SimpleNamespace(
        name="",
        user=SimpleNamespace(name=user, id=7),
        slug_scheme=scheme,
        _namespace_default=lambda: hub_ns,
    )
    return KubeSpawner._expand_user_properties(ws, template)


@pytest.mark.parametrize("scheme", ["safe", "escape"])
@pytest.mark.parametrize("template", ["gpupool-{username}", "{hubnamespace}-{username}", "u-{user_server}"])
def test_a_job_goes_to_the_namespace_kubespawner_gives_its_owners_workspace(
    template: str, scheme: str
) -> None:
    for user in NAMES:
        want = kubespawners_namespace(user, template, scheme)
        if scheme == "escape" and len(want) > 63:
            with pytest.raises(ValueError, match="not a DNS label"):  # kubespawner's would fail too
                owner_namespace(user, "jhub", template, scheme)
            continue
        assert owner_namespace(user, "jhub", template, scheme) == want, user
    # a hub in "default" names them "user-...", as kubespawner does
    assert owner_namespace("ann", "default", "{hubnamespace}-{username}") == "user-ann"
    assert owner_namespace("ann", "jhub", "") == "jhub"  # user namespaces off: the hub's


def test_a_template_the_hub_cannot_expand_for_a_job_is_refused() -> None:
    assert template_problem("gpupool-{username}", "safe") == ""
    assert "userid" in template_problem("u-{userid}", "safe")  # the hub's database id
    assert "pod_name" in template_problem("{pod_name}", "safe")
    assert template_problem("x-{username}", "fancy")


def test_the_job_its_claim_and_its_code_are_made_in_the_owners_namespace() -> None:
    opts = JobOptions(namespace="jhub", user_namespace_template="gpupool-{username}")
    spec = TrainJobSpec(
        id="j1",
        owner="Ada.Lovelace@Uni",
        project="vision",
        num_gpu=1,
        gpu_milli=1000,
        command=["python", "job.py"],
        image="registry.example.org/train:1",
        files=("job.py",),
    )
    ns = kubespawners_namespace("Ada.Lovelace@Uni", "gpupool-{username}", "safe")
    assert job_namespace(spec, opts) == ns != "jhub"
    made = [
        train_job(spec, opts),
        checkpoint_claim(spec, opts),
        code_config_map(spec, opts, {"job.py": b"1"}),
    ]
    assert [m["metadata"]["namespace"] for m in made] == [ns] * 3
    plain = JobOptions(namespace="jhub")
    assert {m["metadata"]["namespace"] for m in (train_job(spec, plain), checkpoint_claim(spec, plain))} == {
        "jhub"
    }
    assert base64.b64decode(made[2]["binaryData"]["job.py"]) == b"1"


def test_the_training_pool_takes_user_namespaces_from_kubespawners_settings() -> None:
    c = Config()
    c.TrainPool.kube_job_options = {"namespace": "jhub"}
    assert TrainPool(config=c).job_options().user_namespace_template == ""
    c.KubeSpawner.enable_user_namespaces = True
    c.KubeSpawner.user_namespace_labels = {"gpupool.io/user": "{username}"}
    opts = TrainPool(config=c).job_options()
    # kubespawner's default template and scheme where the config names none
    assert (opts.user_namespace_template, opts.slug_scheme) == ("{hubnamespace}-{username}", "safe")
    assert opts.user_namespace_labels == {"gpupool.io/user": "{username}"}
    c.GPUKubeSpawner.user_namespace_template = "gpupool-{username}"
    assert TrainPool(config=c).job_options().user_namespace_template == "gpupool-{username}"


def user_namespace_verbs(docs: list[dict]) -> dict[tuple[str, str], set[str]]:
    """What the chart's ClusterRole for user namespaces lets the hub do, by (group, resource)."""
    role = next(
        d
        for d in docs
        if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "gpupool-hub-user-namespaces"
    )
    return {
        (g, r): set(rule["verbs"])
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }


def test_the_chart_lets_the_hub_make_and_follow_jobs_in_user_namespaces_only() -> None:
    docs = render({"hub": {"namespace": "jhub"}, "userNamespaces": {"enabled": True}})
    verbs = user_namespace_verbs(docs)
    assert verbs[("batch", "jobs")] == {"create", "get", "list", "watch", "delete", "patch"}
    assert verbs[("", "configmaps")] == {"create"} and verbs[("", "pods/log")] == {"get"}
    assert ("", "secrets") not in verbs
    vap = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicy")
    fenced = {r for rule in vap["spec"]["matchConstraints"]["resourceRules"] for r in rule["resources"]}
    assert {"jobs", "configmaps", "persistentvolumeclaims", "networkpolicies"} <= fenced
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpupool-config")
    jobs = json.loads(cm["data"]["hub-config.json"])["TrainPool"]["kube_job_options"]
    # the train pods' policy the hub makes in each user namespace is the chart's own
    ours = next(d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "gpupool-train")
    assert jobs["network_policy"] == ours["spec"]
    assert (
        "network_policy"
        not in json.loads(
            next(
                d
                for d in render({"hub": {"namespace": "jhub"}})
                if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpupool-config"
            )["data"]["hub-config.json"]
        )["TrainPool"]["kube_job_options"]
    )


async def test_a_job_elsewhere_carrying_a_users_job_id_does_not_speak_for_it() -> None:
    """At cluster scope the watch sees every namespace: a Job labelled with a job's id in another
    user's namespace (one the hub never made) must not end that job; in the owner's it does."""
    from kubernetes_asyncio import client

    from gpupool.kube.controller import KubeJobController
    from gpupool.kube.objects import JOB_ID

    opts = JobOptions(namespace="jhub", user_namespace_template="gpupool-{username}")
    told: list[tuple[str, str]] = []
    async with client.ApiClient() as api:
        ctl = KubeJobController(
            api,
            opts,
            on_change=lambda job_id, st: told.append((job_id, st.state)),
            namespace_of=lambda job_id: "gpupool-ann" if job_id == "j1" else None,
        )

        def job(ns: str, uid: str, condition: str) -> dict:
            return {
                "metadata": {
                    "name": "gpupool-train-j1",
                    "namespace": ns,
                    "uid": uid,
                    "resourceVersion": "1",
                    "labels": {JOB_ID: "j1"},
                },
                "status": {"conditions": [{"type": condition, "status": "True"}]},
            }

        copy = {"jobs": SimpleNamespace(resources={}), "pods": SimpleNamespace(resources={})}
        ctl.reflectors = copy  # type: ignore[assignment]  # the followers' copies, as listed
        copy["jobs"].resources = {"gpupool-bob/gpupool-train-j1": job("gpupool-bob", "u-bob", "Failed")}
        await ctl.reconcile()
        assert told == [] and ctl.status("j1") is None
        copy["jobs"].resources["gpupool-ann/gpupool-train-j1"] = job("gpupool-ann", "u-ann", "Complete")
        await ctl.reconcile()
        assert told == [("j1", "succeeded")]
        assert ctl.namespace("j1") == "gpupool-ann"  # where cancel and holds go


def test_with_kueue_the_chart_lets_the_hub_make_local_queues_in_user_namespaces_only() -> None:
    for kueue in (False, True):
        docs = render(
            {"hub": {"namespace": "jhub"}, "userNamespaces": {"enabled": True}, "kueue": {"enabled": kueue}}
        )
        verbs = user_namespace_verbs(docs)
        assert verbs.get(("kueue.x-k8s.io", "localqueues")) == ({"create"} if kueue else None)
        vap = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicy")
        fenced = {r for rule in vap["spec"]["matchConstraints"]["resourceRules"] for r in rule["resources"]}
        assert ("localqueues" in fenced) is kueue  # the hub's LocalQueues: user namespaces only


async def test_with_kueue_a_users_job_waits_in_a_local_queue_made_in_their_namespace(
    apiserver, api_client, tmp_path
) -> None:
    """Kueue's LocalQueues of the chart are in the hub's namespace; a Job in the owner's names
    a LocalQueue there, which the hub makes before it (pointing at the project's ClusterQueue).
    The hub starts with Kueue and user namespaces together (it refused to before)."""
    from gpupool.kube.controller import KubeJobController
    from gpupool.kube.objects import KUEUE_QUEUE, name_of
    from gpupool.train.kube_service import KubeTrainingService
    from tests.support.pools import make_pool, train_config

    c = train_config(
        tmp_path,
        projects={"vision": {"guarantee": 1}},
        runner="kubernetes",
        image="registry.example.org/train:1",
        kube_job_options={"namespace": "jhub", "kueue": True},
    )
    c.KubeSpawner.enable_user_namespaces = True
    c.KubeSpawner.user_namespace_template = "gpupool-{username}"
    KubeTrainingService(make_pool(tmp_path, 4), TrainPool(config=c), api_client)  # not refused

    opts = JobOptions(namespace="jhub", user_namespace_template="gpupool-{username}", kueue=True)
    ctl = KubeJobController(api_client, opts)
    kueue = "apis/kueue.x-k8s.io/v1beta2"
    for job_id in ("j1", "j2"):  # the second finds the queue made
        job = TrainJobSpec(
            id=job_id,
            owner="Ada.Lovelace@Uni",
            project="vision",
            num_gpu=1,
            gpu_milli=1000,
            command=["python", "job.py"],
            image="registry.example.org/train:1",
        )
        await ctl.submit(job)
    ns = job_namespace(job, opts)
    made = apiserver.list(kueue, "localqueues", ns)
    assert [(q["metadata"]["name"], q["spec"]) for q in made] == [("vision", {"clusterQueue": "vision"})]
    assert (
        apiserver.get("apis/batch/v1", "jobs", ns, name_of("j1"))["metadata"]["labels"][KUEUE_QUEUE]
        == "vision"
    )
    assert apiserver.list(kueue, "localqueues", "jhub") == []  # the chart's, not the hub's
