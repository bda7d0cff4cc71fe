"""User namespaces on the real node (issue #35): the names kubespawner gives them, the pods in
them, the probe a user's kernel runs against the API server, and the NetworkPolicy view of the
pods that test_node_real.py's user-namespace test reads. The install is the module's own,
upgraded with `userNamespaces.enabled` and back (no second install: CI time)."""

from __future__ import annotations

from kubespawner.slugs import is_valid_label, safe_slug

from tests.cluster.netpol import Pod
from tests.cluster.resources import Resources

PREFIX = "gpupool-"  # the chart's userNamespaces.prefix


def namespace_of(user: str) -> str:
    """The namespace kubespawner's own 'safe' slug gives `user` (the chart's template
    `gpupool-{username}`): computed with kubespawner's function, not gpupool's."""
    return PREFIX + safe_slug(user)


def singleuser_pod(admin: Resources, namespace: str) -> dict | None:
    pods = admin.http.get(
        f"/api/v1/namespaces/{namespace}/pods", params={"labelSelector": "component=singleuser-server"}
    ).json()["items"]
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    assert len(live) <= 1, [p["metadata"]["name"] for p in live]
    return live[0] if live else None


def workspaces_anywhere(admin: Resources, user: str) -> list[str]:
    """Every namespace holding a workspace pod of `user` (labelled as kubespawner labels it:
    the name itself where it is a valid label value, as 'li.wei' is)."""
    label = safe_slug(user, is_valid=is_valid_label)
    pods = admin.http.get(
        "/api/v1/pods",
        params={"labelSelector": f"component=singleuser-server,hub.jupyter.org/username={label}"},
    ).json()["items"]
    return sorted(p["metadata"]["namespace"] for p in pods)


def netpol_pod(pod: dict) -> Pod:
    """A pod as netpol.allowed reads it: its namespace, labels and named container ports."""
    ports = {
        p["name"]: p["containerPort"]
        for c in pod["spec"]["containers"]
        for p in c.get("ports") or []
        if p.get("name")
    }
    return Pod(pod["metadata"]["namespace"], pod["metadata"].get("labels") or {}, ports)


def policies(admin: Resources, *namespaces: str) -> list[dict]:
    return [
        p
        for ns in namespaces
        for p in admin.http.get(f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies").json()["items"]
    ]


def privileged_refused(admin: Resources, namespace: str, image: str) -> str:
    """The API server's answer to a privileged pod in `namespace` (a dry run: nothing is made);
    the Pod Security level the namespace enforces refuses it even to the admin."""
    r = admin.http.post(
        f"/api/v1/namespaces/{namespace}/pods",
        params={"dryRun": "All"},
        json={
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "privileged"},
            "spec": {"containers": [{"name": "c", "image": image, "securityContext": {"privileged": True}}]},
        },
    )
    return f"{r.status_code} {r.json().get('message', '')}"


# What the user's own code can do with the API server from their workspace's kernel: no
# service-account token is mounted (kubespawner mounts none without a service account), and
# the API server refuses an anonymous read and create in another user's namespace.
API_PROBE = """
import json, os, ssl, urllib.error, urllib.request
out = {{"token": os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount/token")}}
ctx = ssl._create_unverified_context()  # the refusal is what is probed, not the certificate
def call(method, path, body=None):
    req = urllib.request.Request("https://kubernetes.default.svc.cluster.local" + path, method=method,
                                 data=json.dumps(body).encode() if body else None,
                                 headers={{"Content-Type": "application/json"}})
    try:
        return urllib.request.urlopen(req, context=ctx, timeout=10).status
    except urllib.error.HTTPError as err:
        return err.code
out["read"] = call("GET", "/api/v1/namespaces/{other}/pods")
out["create"] = call("POST", "/api/v1/namespaces/{other}/configmaps",
                     {{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {{"name": "from-{me}"}}}})
print(json.dumps(out))
"""

# a short %%train cell: checkpoints to its claim (in the owner's namespace) and ends
TRAIN_HERE = """%%train --project nlp --gpus 1 --name in-my-namespace
from gpupool.widgets.checkpoint import Checkpoint
ck = Checkpoint()
state = ck.load({"step": 0})
state["step"] += 1
ck.save(state)
print("trained step", state["step"], "in my namespace", flush=True)
"""
