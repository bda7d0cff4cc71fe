"""The usage finalizer's name, and the chart's uninstall step that takes it off train pods.

The hub puts `gpupool.io/usage` on every train pod (c.TrainPool.usage_finalizer) and takes it
off once its relist has recorded the pod's end (gpupool.kube.pod_spans). Once the hub is
uninstalled nothing would take it off: a train pod deleted afterwards (its Job's TTL, an admin's
`kubectl delete`, a preemption) would stay Terminating for ever, holding its checkpoint claim.
So `helm uninstall` of gpupool's chart runs this first (a `pre-delete` hook Job, in the node
agent's small image: standard library only), as the hook's own service account:

    python -m gpupool.kube.usage_finalizer      # GPUPOOL_NAMESPACES="jupyterhub" or "*"

It lists the train pods (label gpupool.io/job-id) a page at a time and removes that one
finalizer from each pod that carries it, by a JSON patch that first tests it is still where it
was listed (another controller's finalizers are never touched; a pod changed meanwhile is read
again). A pod gone meanwhile is fine. It prints a line per pod and exits 1 if any list or patch
failed, so that `helm uninstall` stops and says so (`--no-hooks` skips it).

`finalizer_patch` is pure; `main` does the I/O with the pod's service account.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from typing import Any

FINALIZER = "gpupool.io/usage"  # held on a train pod until its end is recorded
JOB_LABEL = "gpupool.io/job-id"
PAGE = 250
MAX_PAGES = 400
ATTEMPTS = 3  # a pod whose finalizers moved between the list and the patch is read again
SA = "/var/run/secrets/kubernetes.io/serviceaccount"


def finalizer_patch(pod: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The JSON patch that removes the usage finalizer from `pod` (None: it carries none). It
    tests the finalizer is still at the index it was read at, so a stale view removes nothing."""
    finalizers = (pod.get("metadata") or {}).get("finalizers") or []
    if not isinstance(finalizers, list) or FINALIZER not in finalizers:
        return None
    path = f"/metadata/finalizers/{finalizers.index(FINALIZER)}"
    return [{"op": "test", "path": path, "value": FINALIZER}, {"op": "remove", "path": path}]


def namespaces(text: str) -> list[str]:
    """GPUPOOL_NAMESPACES: "*" for all (train Jobs in users' namespaces), else names by commas."""
    text = text.strip()
    if text == "*":
        return [""]
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError('GPUPOOL_NAMESPACES names no namespace (a list, or "*" for all)')
    return names


Call = Callable[[str, str, Any], Any]  # (method, path, JSON patch or None) -> the parsed answer


class APIError(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"{status}: {text[:300]}")
        self.status = status


def in_cluster() -> Call:
    """Requests to the API server as this pod's service account."""
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    base = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    ctx = ssl.create_default_context(cafile=f"{SA}/ca.crt")
    with open(f"{SA}/token") as f:
        token = f.read().strip()

    def call(method: str, path: str, body: object = None) -> object:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(base + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {token}")
        req.add_header("Accept", "application/json")
        if body is not None:
            req.add_header("Content-Type", "application/json-patch+json")
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
                return json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as err:
            raise APIError(err.code, err.read().decode(errors="replace")) from None

    return call


def train_pods(call: Call, namespace: str) -> Iterator[dict[str, Any]]:
    """The train pods of `namespace` ("": all), a page at a time."""
    base = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
    cont = ""
    for _ in range(MAX_PAGES):
        query = {"labelSelector": JOB_LABEL, "limit": str(PAGE)} | ({"continue": cont} if cont else {})
        body = call("GET", f"{base}?{urllib.parse.urlencode(query)}", None)
        yield from (p for p in body.get("items") or [] if isinstance(p, dict))
        cont = (body.get("metadata") or {}).get("continue") or ""
        if not cont:
            return
    raise RuntimeError(f"more than {MAX_PAGES * PAGE} train pods in {namespace or 'all namespaces'}")


def release(call: Call, pod: Mapping[str, Any]) -> str:
    """Takes the finalizer off one pod: "released", "gone" or "none" (it carries none now)."""
    meta = pod.get("metadata") or {}
    path = f"/api/v1/namespaces/{meta.get('namespace')}/pods/{meta.get('name')}"
    for _ in range(ATTEMPTS):
        patch = finalizer_patch(pod)
        if patch is None:
            return "none"
        try:
            call("PATCH", path, patch)
            return "released"
        except APIError as err:
            if err.status == 404:
                return "gone"
            if err.status not in (409, 422):  # 422: the test failed, its finalizers moved
                raise
        try:
            pod = call("GET", path, None)
        except APIError as err:
            if err.status == 404:
                return "gone"
            raise
        time.sleep(0.2)
    raise RuntimeError(f"{path}: its finalizers kept changing")


def run(call: Call, where: list[str], say: Callable[[str], None] = print) -> int:
    """Every train pod of `where` let go of the usage finalizer; 0, or 1 if any step failed."""
    failed = 0
    released = 0
    for ns in where:
        try:
            for pod in train_pods(call, ns):
                if finalizer_patch(pod) is None:
                    continue
                meta = pod.get("metadata") or {}
                name = f"{meta.get('namespace')}/{meta.get('name')}"
                try:
                    outcome = release(call, pod)
                except (APIError, RuntimeError, OSError) as err:
                    say(f"FAIL: {name}: {err}")
                    failed += 1
                    continue
                released += outcome == "released"
                say(f"{outcome}: {name}")
        except (APIError, RuntimeError, OSError) as err:
            say(f"FAIL: listing the train pods of {ns or 'all namespaces'}: {err}")
            failed += 1
    say(f"{FINALIZER}: taken off {released} train pod(s), {failed} failure(s)")
    return 1 if failed else 0


def main() -> int:
    try:
        where = namespaces(os.environ.get("GPUPOOL_NAMESPACES", ""))
    except ValueError as err:
        print(f"FAIL: {err}")
        return 1
    return run(in_cluster(), where)


if __name__ == "__main__":
    sys.exit(main())
