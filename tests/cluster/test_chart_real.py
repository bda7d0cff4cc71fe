"""The chart's objects applied to a real kube-apiserver (server-side apply, admission, RBAC):
what the server keeps is what a cluster would run with."""

from __future__ import annotations

import asyncio

from gpupool.kube import TrainJobSpec
from gpupool.kube.objects import JobOptions, train_job
from gpupool.kube.pod_fit import RESTRICTED_CONTAINER, RESTRICTED_POD
from tests.cluster.conftest import CHART_VALUES, HUB_NS
from tests.cluster.netpol import Pod, allowed
from tests.cluster.plane import ControlPlane
from tests.cluster.resources import Resources


def missing(rendered: object, kept: object, path: str = "") -> list[str]:
    """What of `rendered` the server did not keep as given (it may add defaults, nothing else)."""
    if isinstance(rendered, dict):
        if not isinstance(kept, dict):
            return [f"{path}: kept as {kept!r}"]
        return [m for k, v in rendered.items() for m in missing(v, kept.get(k), f"{path}.{k}")]
    if isinstance(rendered, list):
        if not isinstance(kept, list) or len(kept) != len(rendered):
            return [f"{path}: kept as {kept!r}"]
        return [
            m
            for i, (a, b) in enumerate(zip(rendered, kept, strict=True))
            for m in missing(a, b, f"{path}[{i}]")
        ]
    return (
        [] if rendered == kept or str(rendered) == str(kept) else [f"{path}: {rendered!r} kept as {kept!r}"]
    )


def test_every_field_the_chart_renders_is_admitted_and_kept_as_written(
    chart: list[dict], admin: Resources
) -> None:
    """The `helm test` hook's objects, which no other fixture applies, created for real as `helm
    test` creates them (its service account and RBAC, then its pod, admitted by the server's
    admission with that account); every other rendered object sent again with strict field
    validation as a dry run; and for each, what the server keeps compared field by field with
    what the chart wrote (it may add defaults, nothing else)."""
    from tests.k8s.test_chart import render

    docs = render(CHART_VALUES, hooks=True)
    # `helm test`'s hook objects are created; the uninstall hook's are sent as dry runs with the rest
    hooks = [d for d in docs if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]
    assert {d["kind"] for d in hooks} >= {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Pod"}
    admin.apply_all(d for d in hooks if d["kind"] != "Pod")  # helm creates the pod last (hook weight 1)
    for doc in docs:
        meta = doc["metadata"]
        url = admin.path(doc["apiVersion"], doc["kind"], meta["name"], meta.get("namespace", "gpupool"))
        params = {"fieldManager": "gpupool-test", "force": "true", "fieldValidation": "Strict"}
        if doc not in hooks:
            params["dryRun"] = "All"
        r = admin.http.patch(
            url, params=params, json=doc, headers={"Content-Type": "application/apply-patch+yaml"}
        )
        assert r.status_code in (200, 201), f"{doc['kind']}/{meta['name']}: {r.status_code} {r.text[:400]}"
        kept = r.json()
        for key in ("spec", "data", "rules", "subjects", "roleRef", "value", "webhooks"):
            if key in doc:
                assert not missing(doc[key], kept.get(key)), (
                    doc["kind"],
                    meta["name"],
                    missing(doc[key], kept.get(key)),
                )
        assert not missing(meta.get("labels") or {}, kept["metadata"].get("labels") or {})
        assert not missing(meta.get("annotations") or {}, kept["metadata"].get("annotations") or {})
    pod = next(d for d in hooks if d["kind"] == "Pod")
    admin.http.delete(
        f"/api/v1/namespaces/gpupool/pods/{pod['metadata']['name']}", params={"gracePeriodSeconds": "0"}
    )
    # and what the session applied is there, with the keep policy on every queue
    queues = admin.get("/apis/scheduling.run.ai/v2/queues")["items"]
    assert {q["metadata"]["name"] for q in queues} >= {"default", "department-default"}
    assert all(
        q["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        for q in queues
        if q["metadata"].get("labels", {}).get("app.kubernetes.io/name") == "gpupool"
    )


def test_department_and_project_of_one_name_are_two_queues(chart: list[dict], admin: Resources) -> None:
    """A release that names no project gets a department and a project both called 'default'."""
    queues = {
        q["metadata"]["name"]: q["spec"] for q in admin.get("/apis/scheduling.run.ai/v2/queues")["items"]
    }
    assert queues["default"]["parentQueue"] == "department-default"
    assert "parentQueue" not in queues["department-default"]
    assert queues["default"]["resources"]["gpu"]["quota"] == 4
    assert all(name != spec.get("parentQueue") for name, spec in queues.items())


def test_a_high_priority_job_gets_the_charts_class_and_the_server_resolves_it(
    chart: list[dict], admin: Resources
) -> None:
    """Server-side dry runs as the hub's account: the Priority admission plugin fills in
    spec.priority from the class (and refuses a class that does not exist)."""
    opts = JobOptions(namespace=HUB_NS)
    got = {}
    for priority in (0, 3):
        job = train_job(
            TrainJobSpec(
                id=f"prio{priority}",
                owner="ann",
                project="default",
                num_gpu=1,
                gpu_milli=1000,
                command=["true"],
                image="x",
                priority=priority,
            ),
            opts,
        )
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"prio{priority}", "namespace": HUB_NS},
            "spec": job["spec"]["template"]["spec"] | {"volumes": []},
        }
        pod["spec"]["containers"][0]["volumeMounts"] = []
        r = admin.http.post(f"/api/v1/namespaces/{HUB_NS}/pods", params={"dryRun": "All"}, json=pod)
        assert r.status_code == 201, r.text
        got[priority] = r.json()["spec"]["priority"]
    assert got == {0: 50, 3: 75}


# --- RBAC: who may do what ----------------------------------------------------------------
def as_user(plane: ControlPlane, user: str, group: str = "system:authenticated"):
    """The admin client impersonating `user` (authorization is then the user's own)."""
    c = plane.client()
    c.headers.update({"Impersonate-User": user, "Impersonate-Group": group})
    return c


def test_a_user_reads_their_own_namespace_and_cannot_touch_anothers(
    plane: ControlPlane, chart: list[dict]
) -> None:
    with as_user(plane, "ann") as ann:
        assert ann.get("/api/v1/namespaces/gpupool-ann/pods").status_code == 200
        assert ann.get("/api/v1/namespaces/gpupool-bob/pods").status_code == 403
        assert ann.delete("/api/v1/namespaces/gpupool-bob/pods/jupyter-bob").status_code == 403
        assert (
            ann.post(
                "/api/v1/namespaces/gpupool-ann/pods",
                json={
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "mine"},
                    "spec": {"containers": [{"name": "c", "image": "x"}]},
                },
            ).status_code
            == 403
        )  # read only
        assert ann.get(f"/apis/batch/v1/namespaces/{HUB_NS}/jobs").status_code == 403


def test_the_hub_account_has_what_the_chart_grants_and_no_more(
    plane: ControlPlane, chart: list[dict]
) -> None:
    with plane.client(plane.token(HUB_NS, "hub")) as hub:
        assert hub.get(f"/apis/batch/v1/namespaces/{HUB_NS}/jobs").status_code == 200
        assert hub.get("/api/v1/pods").status_code == 200  # watches workspace pods in user namespaces
        assert hub.get("/api/v1/namespaces/gpupool-ann/secrets").status_code == 403
        # the GPU inventory (c.GPUPool.gpu_inventory): it reads nodes, never changes one
        assert hub.get("/api/v1/nodes").status_code == 200
        assert (
            hub.patch(
                "/api/v1/nodes/gpu-node-0",
                json={"metadata": {"labels": {"x": "y"}}},
                headers={"Content-Type": "application/merge-patch+json"},
            ).status_code
            == 403
        )
        assert hub.delete("/apis/scheduling.run.ai/v2/queues/default").status_code == 403
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "jupyter-ann"},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        }
        # the user namespaces enforce `restricted` (userNamespaces.podSecurity): a pod without
        # the restricted securityContext is refused there, one with it is admitted
        r = hub.post("/api/v1/namespaces/gpupool-ann/pods", params={"dryRun": "All"}, json=pod)
        assert r.status_code == 403 and "restricted" in r.text, r.text
        pod["spec"] = {
            "securityContext": RESTRICTED_POD,
            "containers": [{"name": "c", "image": "x", "securityContext": RESTRICTED_CONTAINER}],
        }
        assert (
            hub.post("/api/v1/namespaces/gpupool-ann/pods", params={"dryRun": "All"}, json=pod).status_code
            == 201
        )


async def test_the_hub_starts_a_restricted_workspace_in_any_users_new_namespace_and_nowhere_else(
    plane: ControlPlane, chart: list[dict], make_spawner, admin: Resources
) -> None:
    """User namespaces for whoever logs in, spawned by GPUKubeSpawner as the hub's account with
    the chart's config, RBAC and admission policy: a user in no list, whose name is no DNS
    label, gets the namespace kubespawner names and creates (with the chart's Pod Security and
    gpupool.io/user labels), gpupool's NetworkPolicy there, and a running restricted workspace;
    a privileged pod is refused there by Pod Security, and the hub can write in no other
    namespace nor make one that is not a restricted user namespace. Before, only the listed
    users' namespaces had the hub's RBAC, and the hub could create any namespace."""
    import json

    cm = next(d for d in chart if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpupool-config")
    ours = json.loads(cm["data"]["hub-config.json"])

    def user_namespaces(c) -> None:
        for key, value in ours["KubeSpawner"].items():
            setattr(c.KubeSpawner, key, value)
        c.GPUKubeSpawner.user_namespace_network_policy = ours["GPUKubeSpawner"][
            "user_namespace_network_policy"
        ]

    ws = make_spawner("Ada.Lovelace@Uni", more=user_namespaces)
    ns = ws.namespace  # kubespawner's own expansion of user_namespace_template
    assert ns.startswith("gpupool-ada-lovelace-uni") and ns not in ("gpupool-ann", "gpupool-bob")
    try:
        await asyncio.wait_for(ws.start(), 90)
        made = admin.get(f"/api/v1/namespaces/{ns}")["metadata"]["labels"]
        assert made["pod-security.kubernetes.io/enforce"] == "restricted"
        assert made["gpupool.io/user"] == ns.removeprefix("gpupool-")
        policy = admin.get(f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/gpupool-singleuser")
        assert policy["spec"]["podSelector"] == {"matchLabels": {"component": "singleuser-server"}}
        pod = admin.get(f"/api/v1/namespaces/{ns}/pods/{ws.pod_name}")
        assert pod["status"]["phase"] == "Running"
        labels = made
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}}
        privileged = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "root"},
            "spec": {"containers": [{"name": "c", "image": "x", "securityContext": {"privileged": True}}]},
        }
        restricted = {**pod, "metadata": {"name": "jupyter-other"}, "status": {}}
        with plane.client(plane.token(HUB_NS, "hub")) as hub:
            r = hub.post(f"/api/v1/namespaces/{ns}/pods", params={"dryRun": "All"}, json=privileged)
            assert r.status_code == 403 and "restricted" in r.text, r.text
            # RBAC alone would let it write anywhere: the admission policy fences it
            r = hub.post("/api/v1/namespaces/default/pods", params={"dryRun": "All"}, json=restricted)
            assert r.status_code == 403 and "gpupool.io/user" in r.text, r.text
            r = hub.post(
                "/apis/networking.k8s.io/v1/namespaces/kube-system/networkpolicies",
                json={"metadata": {"name": "x"}, "spec": {"podSelector": {}}},
            )
            assert r.status_code == 403, r.text
            # not a user namespace: another prefix, no Pod Security label, a weaker level
            for name, bad in [
                ("other-ada", labels),
                ("gpupool-eve", {"gpupool.io/user": "eve"}),
                ("gpupool-eve", {**labels, "pod-security.kubernetes.io/enforce": "privileged"}),
            ]:
                r = hub.post(
                    "/api/v1/namespaces", json={**namespace, "metadata": {"name": name, "labels": bad}}
                )
                assert r.status_code == 403, (name, bad, r.text)
    finally:
        await ws.stop()
        admin.http.delete(f"/api/v1/namespaces/{ns}")


# --- NetworkPolicy: who may reach whom ------------------------------------------------
def test_notebooks_reach_the_hub_and_api_from_any_namespace_and_nothing_private(admin: Resources) -> None:
    """The real z2jh chart (../shared/charts) rendered with helm/z2jh-values.yaml and gpupool's
    chart with a user namespace, every NetworkPolicy applied to the API server (admitted,
    defaulted), then evaluated both ways (the source's egress AND the destination's ingress)
    for pods labelled as z2jh's templates and kubespawner label them."""
    from tests.cluster.install import clear_leftovers, z2jh_rendered
    from tests.k8s.test_chart import render

    hub_ns, user_ns = "jupyterhub", "gpupool-nina"
    z2jh = z2jh_rendered(name="jhub", namespace=hub_ns)
    ours = render({"hub": {"namespace": hub_ns}, "userNamespaces": {"enabled": True, "users": ["nina"]}})
    admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": hub_ns}})
    admin.apply_all(d for d in ours if d["kind"] == "Namespace")
    applied = [
        {**d, "metadata": {**d["metadata"], "namespace": d["metadata"].get("namespace", hub_ns)}}
        for d in z2jh + [d for d in ours if d["metadata"].get("namespace") == user_ns]
        if d["kind"] == "NetworkPolicy"
    ]
    try:
        _evaluate(admin, [admin.apply(d) for d in applied], z2jh, hub_ns, user_ns)
    finally:  # the real-node tests helm-install z2jh into this namespace later in the session
        clear_leftovers(admin, applied)


def _evaluate(admin: Resources, policies: list[dict], z2jh: list[dict], hub_ns: str, user_ns: str) -> None:
    # the node agent's, as the session's chart made it
    policies += admin.get("/apis/networking.k8s.io/v1/namespaces/gpupool/networkpolicies")["items"]
    ns_labels = {
        ns: admin.get(f"/api/v1/namespaces/{ns}")["metadata"]["labels"] for ns in (hub_ns, user_ns, "gpupool")
    }
    templates = {d["metadata"]["name"]: d["spec"]["template"] for d in z2jh if d["kind"] == "Deployment"}

    def deployed(name: str) -> Pod:
        t = templates[name]
        return Pod(
            hub_ns,
            t["metadata"]["labels"],
            {
                p["name"]: p["containerPort"]
                for c in t["spec"]["containers"]
                for p in c.get("ports") or []
                if "name" in p
            },
        )

    hub, proxy = deployed("hub"), deployed("proxy")
    # kubespawner's labels with z2jh's singleuser.extraLabels, in the hub's and a user's namespace
    labels = {
        "app": "jupyterhub",
        "component": "singleuser-server",
        "release": "jhub",
        "hub.jupyter.org/network-access-hub": "true",
    }
    here, there = Pod(hub_ns, labels, {"notebook-port": 8888}), Pod(user_ns, labels, {"notebook-port": 8888})
    agent = Pod("gpupool", {"app.kubernetes.io/name": "gpupool-node-agent"}, {"http": 9402})
    check = lambda a, b, port: allowed(policies, ns_labels, a, b, port)  # noqa: E731
    for notebook in (here, there):
        assert check(notebook, hub, 8095), notebook.ns  # the widgets call gpupool's API
        assert check(notebook, hub, 8081), notebook.ns  # jupyterhub-singleuser talks to the hub
        assert check(proxy, notebook, 8888) and check(hub, notebook, 8888), notebook.ns  # users reach it
        assert not check(notebook, "169.254.169.254", 80), notebook.ns  # the cloud metadata server
        assert not check(notebook, "10.1.2.3", 443), notebook.ns  # private networks
        assert check(notebook, "151.101.0.223", 443), notebook.ns  # the internet (pip install)
        assert not check(notebook, agent, 9402), notebook.ns  # the node agent answers the hub only
    assert not check(proxy, hub, 8095)  # the API port is the notebooks'
    other = Pod(user_ns, {"app": "debug"})  # a pod in the user namespace that is not a notebook
    assert not check(other, there, 8888) and not check(here, there, 8888)  # notebooks do not reach each other
    # the defect, checked: without gpupool's rules a notebook in a user namespace reaches neither
    # port, and nothing keeps it from the metadata server
    z2jh_only = [
        {**p, "spec": {**p["spec"], "ingress": p["spec"]["ingress"][:1]}}  # z2jh's own rule only
        if p["metadata"]["name"] == "hub"
        else p
        for p in policies
        if p["metadata"]["namespace"] != user_ns
    ]
    assert not allowed(z2jh_only, ns_labels, there, hub, 8095) and not allowed(
        z2jh_only, ns_labels, there, hub, 8081
    )
    assert allowed(z2jh_only, ns_labels, there, "169.254.169.254", 80)


def test_only_the_hub_may_ask_the_node_agent(admin: Resources, chart: list[dict]) -> None:
    policies = admin.get("/apis/networking.k8s.io/v1/namespaces/gpupool/networkpolicies")["items"]
    ns_labels = {
        ns: admin.get(f"/api/v1/namespaces/{ns}")["metadata"]["labels"]
        for ns in (HUB_NS, "gpupool-ann", "gpupool")
    }
    agent = Pod("gpupool", {"app.kubernetes.io/name": "gpupool-node-agent"}, {"http": 9402})
    assert allowed(policies, ns_labels, Pod(HUB_NS, {"component": "hub", "app": "jupyterhub"}), agent, 9402)
    assert not allowed(policies, ns_labels, Pod(HUB_NS, {"component": "singleuser-server"}), agent, 9402)
    assert not allowed(policies, ns_labels, Pod("gpupool-ann", {"component": "hub"}), agent, 9402)


def test_the_kueue_adapters_queues_pass_kueues_own_validation(admin: Resources, chart: list[dict]) -> None:
    """Kueue's CRDs (v1beta2, Kueue >= v0.15.0) on the real server run their CEL rules, which an
    offline schema check does not (test_kueue_real.py runs Kueue's controller on them)."""
    import yaml

    from gpupool.kube.kueue import kueue_objects
    from gpupool.pool.training import Project
    from tests.k8s.conftest import SCHEMAS

    crds = [yaml.safe_load(f.read_text()) for f in sorted((SCHEMAS / "crds").glob("kueue.x-k8s.io_*.yaml"))]
    admin.apply_all(crds)
    projects = {"vision": Project("vision", 2000, 1.0, 4000, 0), "nlp": Project("nlp", 1500, 1.0, -1, 0)}
    docs = kueue_objects(projects, HUB_NS, cohort="research")
    admin.apply_all(docs)
    cq = admin.get("/apis/kueue.x-k8s.io/v1beta2/clusterqueues/vision")
    quota = cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]
    assert (cq["spec"]["cohortName"], quota["nominalQuota"], quota["borrowingLimit"]) == ("research", 2, 2)
    # and Kueue's rules do refuse what they should: a borrowing limit without a cohort
    vision = next(d for d in docs if d["kind"] == "ClusterQueue" and d["metadata"]["name"] == "vision")
    bad = {**vision, "metadata": {"name": "loner"}, "spec": {**vision["spec"]}}
    del bad["spec"]["cohortName"]
    r = admin.http.post("/apis/kueue.x-k8s.io/v1beta2/clusterqueues", json=bad)
    assert r.status_code == 422 and "borrowingLimit" in r.text, r.text
