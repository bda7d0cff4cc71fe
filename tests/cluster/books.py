"""The real-node crash matrix's tools: the z2jh hub pod deleted as an admin or a node drain
deletes it (SIGTERM, the Deployment makes a new one on the same database), and the books a user
reads through the hub's API afterwards (gpupool's /api/me, /api/pool and /api/projects)."""

from __future__ import annotations

import time

import httpx

from tests.cluster.install import HUB_NS
from tests.cluster.resources import Resources, until
from tests.cluster.webuser import WebUser

GPU_MILLI = 1000


def hub_pod(admin: Resources) -> dict:
    pods = admin.http.get(f"/api/v1/namespaces/{HUB_NS}/pods", params={"labelSelector": "component=hub"})
    live = [p for p in pods.json()["items"] if not p["metadata"].get("deletionTimestamp")]
    assert len(live) == 1, [p["metadata"]["name"] for p in live]
    return live[0]


def user_pods(admin: Resources, user: str) -> list[dict]:
    return admin.http.get(
        f"/api/v1/namespaces/{HUB_NS}/pods",
        params={"labelSelector": f"component=singleuser-server,hub.jupyter.org/username={user}"},
    ).json()["items"]


def delete_hub_pod(admin: Resources) -> str:
    """Deletes the running hub pod now (the default grace: SIGTERM, as a drain does); its uid."""
    old = hub_pod(admin)
    admin.http.delete(f"/api/v1/namespaces/{HUB_NS}/pods/{old['metadata']['name']}")
    return old["metadata"]["uid"]


def wait_new_hub(admin: Resources, old_uid: str, user: WebUser, started: float) -> float:
    """Waits for the old hub pod to be gone and the new one to answer gpupool's API through the
    proxy; the seconds since `started` (the delete)."""

    def old_gone_new_ready() -> bool:
        pods = admin.http.get(
            f"/api/v1/namespaces/{HUB_NS}/pods", params={"labelSelector": "component=hub"}
        ).json()["items"]
        if any(p["metadata"]["uid"] == old_uid for p in pods):
            return False
        return any(
            c["type"] == "Ready" and c["status"] == "True"
            for p in pods
            for c in p.get("status", {}).get("conditions") or []
        )

    until(old_gone_new_ready, 180, "the old hub pod gone and a new one ready")
    until(lambda: me(user), 120, "the new hub answering gpupool's API")
    return time.monotonic() - started


def me(user: WebUser) -> dict:
    try:
        r = user.api("GET", "/services/gpupool/api/me")
    except httpx.HTTPError:  # the proxy waits for the restarting hub
        return {}
    return r.json() if r.status_code == 200 else {}


def books(user: WebUser) -> dict:
    """What the user's view says they hold, and whether the pool's own ledger agrees: each GPU's
    free milli plus its shares is the whole GPU (a share in the store but not in the placement
    state, or the reverse, breaks it), and the user's shares on the GPUs are their holdings."""
    mine = me(user)
    assert mine, "gpupool's /api/me did not answer"
    gpus = user.api("GET", "/services/gpupool/api/pool").json()["gpus"]
    for g in gpus:
        assert g["free_milli"] + sum(s["milli"] for s in g["shares"]) == GPU_MILLI, g
    shares = sorted(s["milli"] for g in gpus for s in g["shares"] if s["owner"] == user.name)
    holdings = sorted(h["milli"] for h in mine["holdings"])
    assert shares == holdings, (shares, mine["holdings"], gpus)
    return {
        "holdings": holdings,
        "fits": {o["milli"]: o["fits"] for o in mine["offered"]},
        "quota": mine["build_quota_milli"],
    }


def project_used(user: WebUser, project: str) -> int:
    projects = user.api("GET", "/services/gpupool/api/projects").json()["projects"]
    return next(p["used_milli"] for p in projects if p["name"] == project)


def build_milli_s(user: WebUser, since: float) -> int:
    """The user's workspaces' allocated milli-GPU-seconds since `since` (the usage report)."""
    r = user.api("GET", "/services/gpupool/api/usage", params={"from": str(int(since)), "by": "kind"})
    assert r.status_code == 200, r.text[:500]
    return next((row["allocated_milli_s"] for row in r.json()["rows"] if row["key"] == "build"), 0)
