"""The chart's objects applied to a real kube-apiserver (server-side apply, admission, RBAC):
what the server keeps is what a cluster would run with."""

from __future__ import annotations

from gpupool.kube import TrainJobSpec
from gpupool.kube.objects import JobOptions, train_job

from tests.cluster.conftest import HUB_NS
from tests.cluster.plane import ControlPlane
from tests.cluster.resources import Resources


def test_every_object_the_chart_renders_is_admitted_and_kept(chart: list[dict], admin: Resources) -> None:
    for doc in chart:
        meta = doc["metadata"]
        kept = admin.get(admin.path(doc["apiVersion"], doc["kind"], meta["name"], meta.get("namespace", "")))
        assert kept is not None, f"{doc['kind']}/{meta['name']} is not on the server"


def test_department_and_project_of_one_name_are_two_queues(chart: list[dict], admin: Resources) -> None:
    """The defaults have a department and a project both called 'default'."""
    queues = {q["metadata"]["name"]: q["spec"] for q in admin.get("/apis/scheduling.run.ai/v2/queues")["items"]}
    assert queues["default"]["parentQueue"] == "department-default"
    assert "parentQueue" not in queues["department-default"]
    assert queues["default"]["resources"]["gpu"]["quota"] == 4
    assert all(name != spec.get("parentQueue") for name, spec in queues.items())


def test_a_high_priority_job_gets_the_charts_class_and_the_server_resolves_it(
        chart: list[dict], admin: Resources) -> None:
    """Server-side dry runs as the hub's account: the Priority admission plugin fills in
    spec.priority from the class (and refuses a class that does not exist)."""
    opts = JobOptions(namespace=HUB_NS)
    got = {}
    for priority in (0, 3):
        job = train_job(TrainJobSpec(id=f"prio{priority}", owner="ann", project="default", num_gpu=1,
                                     gpu_milli=1000, command=["true"], image="x", priority=priority), opts)
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"prio{priority}", "namespace": HUB_NS},
               "spec": job["spec"]["template"]["spec"] | {"volumes": []}}
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


def test_a_user_reads_their_own_namespace_and_cannot_touch_anothers(plane: ControlPlane, chart: list[dict]) -> None:
    with as_user(plane, "ann") as ann:
        assert ann.get("/api/v1/namespaces/gpupool-ann/pods").status_code == 200
        assert ann.get("/api/v1/namespaces/gpupool-bob/pods").status_code == 403
        assert ann.delete("/api/v1/namespaces/gpupool-bob/pods/jupyter-bob").status_code == 403
        assert ann.post("/api/v1/namespaces/gpupool-ann/pods", json={
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mine"},
            "spec": {"containers": [{"name": "c", "image": "x"}]}}).status_code == 403  # read only
        assert ann.get(f"/apis/batch/v1/namespaces/{HUB_NS}/jobs").status_code == 403


def test_the_hub_account_has_what_the_chart_grants_and_no_more(plane: ControlPlane, chart: list[dict]) -> None:
    with plane.client(plane.token(HUB_NS, "hub")) as hub:
        assert hub.get(f"/apis/batch/v1/namespaces/{HUB_NS}/jobs").status_code == 200
        assert hub.get("/api/v1/pods").status_code == 200  # watches workspace pods in user namespaces
        assert hub.get("/api/v1/namespaces/gpupool-ann/secrets").status_code == 403
        assert hub.get("/api/v1/nodes").status_code == 403
        assert hub.delete("/apis/scheduling.run.ai/v2/queues/default").status_code == 403
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "jupyter-ann"},
               "spec": {"containers": [{"name": "c", "image": "x"}]}}
        assert hub.post("/api/v1/namespaces/gpupool-ann/pods", params={"dryRun": "All"}, json=pod).status_code == 201


# --- NetworkPolicy: a notebook's request to the gpupool API -------------------------------
def _matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def allows(policy: dict, direction: str, other_ns: str, ns_labels: dict, pod_labels: dict, port: int | str) -> bool:
    """NetworkPolicy semantics for one peer pod ('egress': to it, 'ingress': from it), as a CNI
    enforces them (none runs here: the policy is checked as the API server admitted it)."""
    for rule in policy["spec"].get(direction, []):
        if not any(p.get("port") in (None, port) for p in rule.get("ports") or [{}]):
            continue
        for peer in rule.get("to" if direction == "egress" else "from") or [{}]:
            if "ipBlock" in peer:
                continue
            ns_ok = _matches(peer["namespaceSelector"], ns_labels) if "namespaceSelector" in peer else (
                other_ns == policy["metadata"]["namespace"])
            if ns_ok and _matches(peer.get("podSelector") or {}, pod_labels):
                return True
    return False


def egress_allows(policy: dict, pod_ns: str, ns_labels: dict, pod_labels: dict, port: int) -> bool:
    return allows(policy, "egress", pod_ns, ns_labels, pod_labels, port)


def test_a_notebook_may_reach_the_gpupool_api_on_the_hub(admin: Resources, chart: list[dict]) -> None:
    import yaml

    from tests.k8s.conftest import REPO

    overlay = yaml.safe_load((REPO / "helm" / "z2jh-values.yaml").read_text())
    admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "jupyterhub"}})
    # the label the namespace selector relies on is set by the API server itself
    ns_labels = admin.get("/api/v1/namespaces/jupyterhub")["metadata"]["labels"]
    # z2jh's singleuser policy: egress to the hub's 8081, then the overlay's rules appended
    hub_8081 = {"to": [{"podSelector": {"matchLabels": {"component": "hub"}}}], "ports": [{"port": 8081}]}
    policy = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
              "metadata": {"name": "singleuser", "namespace": "gpupool-ann"},
              "spec": {"podSelector": {"matchLabels": {"component": "singleuser-server"}},
                       "policyTypes": ["Ingress", "Egress"],
                       "egress": [hub_8081, *overlay["singleuser"]["networkPolicy"]["egress"]]}}
    admitted = admin.apply(policy)  # the API server validates and defaults it (protocol TCP)
    hub = {"app": "jupyterhub", "component": "hub", "release": "jhub"}
    assert egress_allows(admitted, "jupyterhub", ns_labels, hub, 8095)
    assert not egress_allows(admitted, "jupyterhub", ns_labels, {"component": "proxy"}, 8095)
    z2jh_only = {**admitted, "spec": {**admitted["spec"], "egress": [hub_8081]}}
    assert not egress_allows(z2jh_only, "jupyterhub", ns_labels, hub, 8095)  # the defect, without the overlay


def test_only_the_hub_may_ask_the_node_agent(admin: Resources, chart: list[dict]) -> None:
    policy = admin.get("/apis/networking.k8s.io/v1/namespaces/gpupool/networkpolicies/gpupool-node-agent")
    hub_ns = admin.get(f"/api/v1/namespaces/{HUB_NS}")["metadata"]["labels"]
    user_ns = admin.get("/api/v1/namespaces/gpupool-ann")["metadata"]["labels"]
    assert allows(policy, "ingress", HUB_NS, hub_ns, {"component": "hub", "app": "jupyterhub"}, "http")
    assert not allows(policy, "ingress", HUB_NS, hub_ns, {"component": "singleuser-server"}, "http")
    assert not allows(policy, "ingress", "gpupool-ann", user_ns, {"component": "hub"}, "http")


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
