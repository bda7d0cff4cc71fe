"""A small Kubernetes API server for tests, on 127.0.0.1, speaking the real REST and watch
protocol to kubernetes_asyncio and kubespawner: JSON objects with uid and resourceVersion,
list with label/field selectors, `?watch=true` streams of `{"type", "object"}` lines from a
resourceVersion, 404/409/422 Status errors, deletion with propagationPolicy and an owner
garbage collector. Created core objects are validated strictly (kubernetes-validate), as a
real API server would refuse a malformed manifest.

It has no scheduler, kubelet or Job controller: `Cluster` plays those in tests (start a
Job's pod, mark it Running, evict it, finish it). It runs its own event loop in a thread, so
every test's loop can talk to it; call its methods from any thread.

Kept only for what the real control plane of tests/cluster cannot serve: `pods/log` (the API
server proxies it to the pod's kubelet; kwok's nodes run no container and serve one file as
every pod's log, tests/cluster/plane.py POD_LOGS).
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import json
import re
import threading
import uuid
from collections.abc import Callable
from typing import Any

import kubernetes_validate
import tornado.iostream
import tornado.web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

K8S_VERSION = kubernetes_validate.latest_version()
PATH = re.compile(
    r"^/(?P<prefix>api/v1|apis/[^/]+/[^/]+)(?:/namespaces/(?P<ns>[^/]+))?/(?P<res>[^/]+)"
    r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>status|log))?$"
)
KINDS = {
    "pods": "Pod",
    "jobs": "Job",
    "persistentvolumeclaims": "PersistentVolumeClaim",
    "events": "Event",
    "namespaces": "Namespace",
    "services": "Service",
    "secrets": "Secret",
    "configmaps": "ConfigMap",
}
VALIDATED = {"pods", "jobs", "persistentvolumeclaims", "services", "namespaces", "configmaps"}
# the API server deletes a Job's pods only when asked to: batch/v1 still orphans by default
ORPHAN_BY_DEFAULT = {"jobs"}

Key = tuple[str, str, str, str]  # prefix, resource, namespace, name


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status(code: int, reason: str, message: str) -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def selector_matches(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, (t.strip() for t in (selector or "").split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k) != v:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def field_matches(selector: str, obj: dict) -> bool:
    for term in filter(None, (t.strip() for t in (selector or "").split(","))):
        k, v = term.replace("==", "=").split("=", 1)
        value: Any = obj
        for part in k.split("."):
            value = (value or {}).get(part)
        if str(value) != v:
            return False
    return True


class Store:
    """Objects and the event history; touched only on the server's loop."""

    def __init__(self) -> None:
        self.objects: dict[Key, dict] = {}
        self.history: list[tuple[int, str, Key, dict]] = []
        self.rv = 100
        self.changed = asyncio.Event()
        self.requests: list[tuple[str, str]] = []  # (method, path) for assertions
        self.logs: dict[tuple[str, str], str] = {}  # (namespace, pod) -> what its container printed
        self.lost: set[tuple[str, str]] = set()  # pods whose node is lost: their log streams never end

    def _emit(self, kind: str, key: Key, obj: dict) -> None:
        self.history.append((self.rv, kind, key, copy.deepcopy(obj)))
        self.changed.set()
        self.changed = asyncio.Event()

    def create(self, key: Key, obj: dict) -> dict:
        self.rv += 1
        meta = obj.setdefault("metadata", {})
        meta.update(uid=str(uuid.uuid4()), resourceVersion=str(self.rv), creationTimestamp=now_iso())
        if key[2]:
            meta["namespace"] = key[2]
        self.objects[key] = obj
        self._emit("ADDED", key, obj)
        return obj

    def update(self, key: Key, obj: dict) -> dict:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[key] = obj
        self._emit("MODIFIED", key, obj)
        return obj

    def delete(self, key: Key, propagation: str | None = None) -> dict:
        obj = self.objects.pop(key)
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        obj["metadata"].setdefault("deletionTimestamp", now_iso())
        self._emit("DELETED", key, obj)
        policy = propagation or ("Orphan" if key[1] in ORPHAN_BY_DEFAULT else "Background")
        if policy != "Orphan":  # the garbage collector: dependents go too
            uid = obj["metadata"]["uid"]
            for k, o in list(self.objects.items()):
                if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or []):
                    self.delete(k)
        return obj


class Handler(tornado.web.RequestHandler):
    store: Store

    def initialize(self, store: Store) -> None:
        self.store = store

    def fail(self, code: int, reason: str, message: str) -> None:
        self.set_status(code)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(status(code, reason, message)))

    def reply(self, obj: dict, code: int = 200) -> None:
        self.set_status(code)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(obj))

    def parts(self) -> tuple[str, str, str, str | None, str | None] | None:
        m = PATH.match(self.request.path)
        if not m:
            self.fail(
                404, "NotFound", f"the server could not find the requested resource {self.request.path}"
            )
            return None
        return m["prefix"], m["res"], m["ns"] or "", m["name"], m["sub"]

    def prepare(self) -> None:
        self.store.requests.append((self.request.method, self.request.path))

    async def get(self, *_: str) -> None:
        p = self.parts()
        if p is None:
            return
        prefix, res, ns, name, sub = p
        if name:
            obj = self.store.objects.get((prefix, res, ns, name))
            if obj is None:
                return self.fail(404, "NotFound", f'{res} "{name}" not found')
            if sub == "log":
                if self.get_argument("follow", "false").lower() in ("true", "1"):
                    return await self.follow_log(obj, ns, name)
                return self.pod_log(obj, ns, name)
            return self.reply(obj)
        if self.get_argument("watch", "false").lower() in ("true", "1"):
            return await self.watch(prefix, res, ns)
        items = [o for k, o in sorted(self.store.objects.items()) if self.selected(k, o, prefix, res, ns)]
        kind = KINDS.get(res, res.title())
        self.reply(
            {
                "kind": f"{kind}List",
                "apiVersion": prefix.removeprefix("apis/").removeprefix("api/"),
                "metadata": {"resourceVersion": str(self.store.rv)},
                "items": items,
            }
        )

    def pod_log(self, pod: dict, ns: str, name: str) -> None:
        if (pod.get("status") or {}).get("phase", "Pending") == "Pending":
            return self.fail(400, "BadRequest", f'container "train" in pod "{name}" is waiting to start')
        lines = self.store.logs.get((ns, name), "").splitlines(keepends=True)
        tail = self.get_argument("tailLines", None)
        if tail is not None:
            lines = lines[-int(tail) :] if int(tail) > 0 else []
        self.set_header("Content-Type", "text/plain")
        self.finish("".join(lines))

    async def follow_log(self, pod: dict, ns: str, name: str) -> None:
        """`?follow=true`, as the kubelet streams it: what the container printed, then more as it
        prints, until the container ends or the pod is gone."""
        if (pod.get("status") or {}).get("phase", "Pending") == "Pending":
            return self.fail(400, "BadRequest", f'container "train" in pod "{name}" is waiting to start')
        self.set_header("Content-Type", "text/plain")
        sent = 0
        while True:
            obj = self.store.objects.get(("api/v1", "pods", ns, name))
            ended = obj is None or (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed")
            ended = ended and (ns, name) not in self.store.lost
            text = self.store.logs.get((ns, name), "").encode()
            try:
                if len(text) > sent:
                    self.write(text[sent:])
                    sent = len(text)
                    await self.flush()
            except tornado.iostream.StreamClosedError:
                return
            if ended:
                return self.finish()
            if self.request.connection.stream.closed():  # type: ignore[union-attr]  # the client went
                return
            await asyncio.sleep(0.02)  # polls the store: the tests' kubelet writes it from their thread

    def selected(self, key: Key, obj: dict, prefix: str, res: str, ns: str) -> bool:
        return (
            key[0] == prefix
            and key[1] == res
            and (not ns or key[2] == ns)
            and selector_matches(self.get_argument("labelSelector", ""), obj["metadata"].get("labels") or {})
            and field_matches(self.get_argument("fieldSelector", ""), obj)
        )

    async def watch(self, prefix: str, res: str, ns: str) -> None:
        since = int(self.get_argument("resourceVersion", "0") or 0)
        timeout = float(self.get_argument("timeoutSeconds", "30"))
        deadline = asyncio.get_running_loop().time() + timeout
        self.set_header("Content-Type", "application/json")
        if since == 0:  # no starting point: the current state as ADDED, then changes
            since = self.store.rv
            for key, obj in sorted(self.store.objects.items()):
                if self.selected(key, obj, prefix, res, ns):
                    self.write(json.dumps({"type": "ADDED", "object": obj}) + "\n")
            await self.flush()
        while not self.request.connection.stream.closed():
            for rv, kind, key, obj in self.store.history:
                if rv > since and self.selected(key, obj, prefix, res, ns):
                    self.write(json.dumps({"type": kind, "object": obj}) + "\n")
                since = max(since, rv)
            await self.flush()
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            try:
                await asyncio.wait_for(self.store.changed.wait(), min(left, 1.0))
            except TimeoutError:
                pass
        self.finish()

    def post(self, *_: str) -> None:
        p = self.parts()
        if p is None:
            return
        prefix, res, ns, name, _sub = p
        try:
            obj = json.loads(self.request.body)
        except ValueError as err:
            return self.fail(400, "BadRequest", f"body is not JSON: {err}")
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if res in VALIDATED:
            try:
                kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
            except kubernetes_validate.ValidationError as err:
                return self.fail(
                    422, "Invalid", f"{KINDS[res]} is invalid: {err.message} at {list(err.path)}"
                )
        key = (prefix, res, ns, meta.get("name", ""))
        if key in self.store.objects:
            return self.fail(409, "AlreadyExists", f'{res} "{key[3]}" already exists')
        if res == "pods":
            obj.setdefault("status", {"phase": "Pending"})
        self.reply(self.store.create(key, obj), 201)

    def delete(self, *_: str) -> None:
        p = self.parts()
        if p is None:
            return
        prefix, res, ns, name, _sub = p
        key = (prefix, res, ns, name or "")
        if key not in self.store.objects:
            return self.fail(404, "NotFound", f'{res} "{name}" not found')
        body = json.loads(self.request.body or b"{}") if self.request.body else {}
        propagation = body.get("propagationPolicy") or self.get_argument("propagationPolicy", None)
        self.reply(self.store.delete(key, propagation))


class FakeAPIServer:
    """Start with `start()`; `url` is its address. Methods are safe from any thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.store: Store | None = None
        self.url = ""
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="fake-apiserver")

    def start(self) -> FakeAPIServer:
        self._thread.start()
        self.call(self._start)
        return self

    def _start(self) -> None:
        self.store = Store()
        app = tornado.web.Application([(r"/.*", Handler, {"store": self.store})])
        sockets = bind_sockets(0, "127.0.0.1")
        self.server = HTTPServer(app)
        self.server.add_sockets(sockets)
        self.url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"

    def stop(self) -> None:
        self.call(self.server.stop)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        async def run() -> Any:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def reset(self) -> None:
        def clear() -> None:
            self.store.objects.clear()
            self.store.history.clear()
            self.store.requests.clear()
            self.store.logs.clear()
            self.store.lost.clear()

        self.call(clear)

    # --- reading and changing objects (tests play kubelet and controllers) -----
    def get(self, prefix: str, res: str, ns: str, name: str) -> dict | None:
        return self.call(lambda: copy.deepcopy(self.store.objects.get((prefix, res, ns, name))))

    def list(self, prefix: str, res: str, ns: str = "", labels: str = "") -> list[dict]:
        return self.call(
            lambda: [
                copy.deepcopy(o)
                for k, o in sorted(self.store.objects.items())
                if k[:2] == (prefix, res)
                and (not ns or k[2] == ns)
                and selector_matches(labels, o["metadata"].get("labels") or {})
            ]
        )

    def create(self, prefix: str, res: str, ns: str, obj: dict) -> dict:
        return self.call(
            lambda: copy.deepcopy(
                self.store.create((prefix, res, ns, obj["metadata"]["name"]), copy.deepcopy(obj))
            )
        )

    def patch(self, prefix: str, res: str, ns: str, name: str, change: Callable[[dict], None]) -> dict:
        def run() -> dict:
            obj = copy.deepcopy(self.store.objects[(prefix, res, ns, name)])
            change(obj)
            return copy.deepcopy(self.store.update((prefix, res, ns, name), obj))

        return self.call(run)

    def remove(self, prefix: str, res: str, ns: str, name: str, propagation: str | None = None) -> None:
        self.call(lambda: self.store.delete((prefix, res, ns, name), propagation))

    def write_log(self, ns: str, pod: str, text: str) -> None:
        """What the pod's container printed (served at .../pods/<name>/log)."""

        def append() -> None:
            self.store.logs[(ns, pod)] = self.store.logs.get((ns, pod), "") + text

        self.call(append)

    def lose_node_of(self, ns: str, pod: str) -> None:
        """The pod's node is lost: a log stream open to it stays open, and says nothing more."""
        self.call(lambda: self.store.lost.add((ns, pod)))

    def requests(self) -> list[tuple[str, str]]:
        return self.call(lambda: list(self.store.requests))


class Cluster:
    """Plays the parts of a cluster the fake has not: the Job controller and the kubelet."""

    def __init__(self, api: FakeAPIServer) -> None:
        self.api = api

    def job(self, ns: str, name: str) -> dict | None:
        return self.api.get("apis/batch/v1", "jobs", ns, name)

    def pods(self, ns: str, labels: str = "") -> list[dict]:
        return self.api.list("api/v1", "pods", ns, labels)

    def start_job_pod(self, ns: str, job_name: str) -> dict:
        """The Job controller creates a pod from the template; it is Pending until run."""
        job = self.job(ns, job_name)
        tmpl = copy.deepcopy(job["spec"]["template"])
        uid = job["metadata"]["uid"]
        labels = {
            **tmpl["metadata"].get("labels", {}),
            "batch.kubernetes.io/job-name": job_name,
            "batch.kubernetes.io/controller-uid": uid,
        }
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{job_name}-{uuid.uuid4().hex[:5]}",
                "namespace": ns,
                "labels": labels,
                "annotations": tmpl["metadata"].get("annotations", {}),
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": job_name,
                        "uid": uid,
                        "controller": True,
                    }
                ],
            },
            "spec": tmpl["spec"],
            "status": {"phase": "Pending"},
        }
        self.api.patch(
            "apis/batch/v1",
            "jobs",
            ns,
            job_name,
            lambda j: j.setdefault("status", {}).update(active=1, startTime=now_iso()),
        )
        return self.api.create("api/v1", "pods", ns, pod)

    def run_pod(self, ns: str, name: str, ip: str = "10.0.0.7") -> dict:
        """The kubelet started the containers."""

        def running(p: dict) -> None:
            p["status"] = {
                "phase": "Running",
                "podIP": ip,
                "startTime": now_iso(),
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [
                    {
                        "name": c["name"],
                        "ready": True,
                        "restartCount": 0,
                        "image": c["image"],
                        "imageID": "",
                        "started": True,
                        "state": {"running": {"startedAt": now_iso()}},
                    }
                    for c in p["spec"]["containers"]
                ],
            }

        return self.api.patch("api/v1", "pods", ns, name, running)

    def evict_pod(self, ns: str, name: str, reason: str = "PreemptionByScheduler") -> None:
        """A scheduler preempts the pod: DisruptionTarget condition, then the pod is gone."""

        def disrupted(p: dict) -> None:
            p["status"]["phase"] = "Failed"
            p["status"].setdefault("conditions", []).append(
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": reason,
                    "message": "evicted to reclaim the queue's quota",
                }
            )

        self.api.patch("api/v1", "pods", ns, name, disrupted)
        self.api.remove("api/v1", "pods", ns, name)

    def finish_job(self, ns: str, job_name: str, succeeded: bool, reason: str = "") -> None:
        """The pod ends and the Job controller writes the final condition."""
        for pod in self.pods(ns, f"batch.kubernetes.io/job-name={job_name}"):
            phase = "Succeeded" if succeeded else "Failed"
            self.api.patch(
                "api/v1",
                "pods",
                ns,
                pod["metadata"]["name"],
                lambda p, phase=phase: p["status"].update(phase=phase),
            )
        cond = "Complete" if succeeded else "Failed"
        reason = reason or ("Completed" if succeeded else "BackoffLimitExceeded")

        def done(j: dict) -> None:
            st = j.setdefault("status", {})
            st.update(active=0, completionTime=now_iso()) if succeeded else st.update(active=0, failed=1)
            if succeeded:
                st["succeeded"] = 1
            st["conditions"] = [
                {"type": cond, "status": "True", "reason": reason, "message": f"job {cond.lower()}"}
            ]

        self.api.patch("apis/batch/v1", "jobs", ns, job_name, done)
