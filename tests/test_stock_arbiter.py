"""gpupool's decision as jupyterhub-idle-culler's cull_arbiter_hook (gpupool.idle_culler.stock_arbiter),
driven by idle-culler's own loop (`cull_idle`, its real HTTP requests) against a small hub API:
a computing GPU keeps a Jupyter-silent server that the stock culler stops, an idle one goes."""

from __future__ import annotations

import datetime as dt
import json
import logging

import pytest
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port
from tornado.web import Application, RequestHandler

from gpupool.idle_culler.policy import Limits
from gpupool.idle_culler.sampler import GPUUse
from gpupool.idle_culler.stock_arbiter import GPUArbiter

jic = pytest.importorskip("jupyterhub_idle_culler")  # the `culler` extra (the test extras include it)


def _stamp(ago_s: float) -> str:
    # from the moment the user is made, not from the module's import: in the full suite the module is
    # collected half an hour before it runs, and every server looked that much quieter
    return (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=ago_s)).isoformat().replace("+00:00", "Z")


def _user(name: str, quiet_s: float, pod: str | None) -> dict:
    state = {"pod_name": pod, "namespace": "jhub", "kubespawner_version": "7.1.0"} if pod else {}
    server = {
        "name": "",
        "ready": True,
        "pending": None,
        "url": f"/user/{name}/",
        "started": _stamp(4 * 3600),
        "last_activity": _stamp(quiet_s),
        "state": state,
    }
    return {"name": name, "admin": False, "servers": {"": server}, "last_activity": server["last_activity"]}


class Hub:
    """GET /hub/api/ and /users, DELETE /users/<name>/server: what cull_idle asks."""

    def __init__(self, users: list[dict]) -> None:
        self.users, self.stopped = users, []
        hub = self

        class Root(RequestHandler):
            def get(self) -> None:
                self.write({"version": "5.5.0"})

        class Users(RequestHandler):
            def get(self) -> None:
                self.set_header("Content-Type", "application/json")
                self.write(json.dumps([u for u in hub.users if u["name"] not in hub.stopped]))

        class Server(RequestHandler):
            def delete(self, name: str) -> None:
                hub.stopped.append(name)
                self.set_status(204)

        self.app = Application(
            [(r"/hub/api/", Root), (r"/hub/api/users", Users), (r"/hub/api/users/([^/]+)/server", Server)]
        )


@pytest.fixture
async def hub_api():
    sock, port = bind_unused_port()
    hubs: list[Hub] = []

    def start(users: list[dict]) -> tuple[Hub, str]:
        hub = Hub(users)
        server = HTTPServer(hub.app)
        server.add_sockets([sock])
        hubs.append(hub)
        return hub, f"http://127.0.0.1:{port}/hub/api"

    yield start
    sock.close()


async def _pass(url: str, arbiter) -> None:
    await jic.cull_idle(
        url=url,
        api_token="t",
        inactive_limit=3600,  # z2jh's cull.timeout
        logger=logging.getLogger("test"),
        concurrency=0,
        cull_arbiter=arbiter,
    )


async def test_the_hook_keeps_a_computing_gpu_and_culls_an_idle_one_through_idle_cullers_loop(hub_api):
    # all four have been Jupyter-silent past the stock culler's hour, except dave
    users = [
        _user("alice", 2 * 3600, "jupyter-alice"),  # a training cell running, nobody typing
        _user("bob", 2 * 3600, "jupyter-bob"),  # GPU idle
        _user("carol", 2 * 3600, None),  # no pod state: Jupyter alone decides (the longer limit)
        _user("dave", 300, "jupyter-dave"),  # GPU idle, but typed 5 min ago
    ]
    hub, url = hub_api(users)
    util = {"uid-alice": 95.0, "uid-bob": 0.0, "uid-dave": 0.0}
    clock = [0.0]

    async def pod_uid(namespace: str, name: str) -> str | None:
        assert namespace == "jhub"
        return "uid-" + name.removeprefix("jupyter-")

    def sample(targets):
        return {t.key: GPUUse(util[t.pod_uid], 1000) for t in targets if t.pod_uid in util}

    arbiter = GPUArbiter(limits=Limits(), sample=sample, pod_uid=pod_uid, clock=lambda: clock[0])
    # the first pass: no GPU idle time measured yet, so only carol (silent 2 h > 15 + 10 min) goes
    await _pass(url, arbiter)
    assert hub.stopped == ["carol"]
    # idle-culler passes every minute (cull.every: 60) for 20 minutes of the arbiter's clock
    for _ in range(20):
        clock[0] += 60
        await _pass(url, arbiter)
    # bob's GPU idled > 15 min and Jupyter is silent: culled. alice computes: kept, though the
    # stock culler (default_cull_arbiter) would stop her running cell. dave typed: kept.
    assert sorted(hub.stopped) == ["bob", "carol"]
    stock = jic.default_cull_arbiter(inactive=dt.timedelta(hours=2), inactive_limit=3600, server={})
    assert stock is True

    # alice's cell ends; her GPU idles 15 min more and she goes too
    util["uid-alice"] = 0.0
    for _ in range(16):
        clock[0] += 60
        await _pass(url, arbiter)
    assert sorted(hub.stopped) == ["alice", "bob", "carol"]


async def test_without_gpu_data_the_hook_never_culls_for_gpu_idleness(hub_api):
    hub, url = hub_api([_user("erin", 1200, "jupyter-erin")])  # silent 20 min: < 25 min without GPU data

    async def pod_uid(namespace: str, name: str) -> str | None:
        return "uid-erin"

    def broken(targets):
        raise OSError("node agent unreachable")

    clock = [0.0]
    arbiter = GPUArbiter(sample=broken, pod_uid=pod_uid, clock=lambda: clock[0])
    for _ in range(30):
        clock[0] += 60
        await _pass(url, arbiter)
    assert hub.stopped == []


def test_idle_cullers_config_accepts_the_hook():
    culler = jic.IdleCuller(cull_arbiter_hook=GPUArbiter(agents=["http://node-agent.gpupool:9402/pods"]))
    assert isinstance(culler.cull_arbiter_hook, GPUArbiter)


def test_the_stock_module_is_idle_cullers_own_command():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "gpupool.idle_culler.stock", "--help-all"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--cull-every" in out.stdout and "cull_arbiter_hook" in out.stdout


async def test_a_server_started_again_is_judged_by_its_new_pods_gpu(hub_api):
    # kubespawner names frank's pod jupyter-frank at every start: his second server's pod has the
    # same name and a new uid, and its running cell must not be judged by the first pod's GPU
    hub, url = hub_api([_user("frank", 2 * 3600, "jupyter-frank")])
    pods = {"jupyter-frank": "uid-first"}
    util = {"uid-first": 0.0}
    clock = [0.0]

    async def pod_uid(namespace: str, name: str) -> str | None:
        return pods.get(name)

    def sample(targets):  # the node agents report the pods that run now, and nothing else
        return {t.key: GPUUse(util[t.pod_uid], 1000) for t in targets if t.pod_uid in util}

    arbiter = GPUArbiter(sample=sample, pod_uid=pod_uid, clock=lambda: clock[0])
    for _ in range(20):  # his first server's GPU idles 20 min, Jupyter silent: culled
        clock[0] += 60
        await _pass(url, arbiter)
    assert hub.stopped == ["frank"]
    # he comes back and starts a training cell on a new server: same pod name, new pod
    hub.users, hub.stopped = [_user("frank", 0, "jupyter-frank")], []
    hub.users[0]["servers"][""]["started"] = _stamp(0)
    pods["jupyter-frank"], util = "uid-second", {"uid-second": 100.0}
    for _ in range(61):  # he goes home; the cell computes an hour while Jupyter is silent
        clock[0] += 60
        hub.users[0]["servers"][""]["last_activity"] = _stamp(600 + clock[0])
        await _pass(url, arbiter)
    assert hub.stopped == []
    # the first pod, gone an hour, is no longer read nor remembered
    assert arbiter.read_for == {"uid-second"} and list(arbiter.trackers) == ["/uid-second"]


def test_the_culler_environment_sets_the_hooks_limits_and_refuses_nonsense(monkeypatch):
    # what the z2jh snippet's culler["environment"] may say: the agents, their token, the limits
    monkeypatch.setenv("GPUPOOL_NODE_AGENTS", "http://gpupool-node-agent.gpupool:9402/pods")
    monkeypatch.setenv("GPUPOOL_CULL_LIMITS", '{"idle_limit_s": 1800, "jupyter_idle_s": 0, "window_s": 5}')
    arbiter = GPUArbiter.from_env()
    assert (arbiter.limits.idle_limit_s, arbiter.limits.jupyter_idle_s, arbiter.limits.window_s) == (
        1800,
        0,
        5,
    )
    assert arbiter.limits.gpu_idle_hard_s == Limits().gpu_idle_hard_s  # the rest: gpupool's defaults
    monkeypatch.delenv("GPUPOOL_CULL_LIMITS")
    assert GPUArbiter.from_env().limits == Limits()
    for bad, why in [
        ("[900]", "a JSON object"),
        ("{", "not JSON"),
        ('{"warn_before_s": 60}', "'warn_before_s' is not one of"),
        ('{"idle_limit_s": -1}', "idle_limit_s must be seconds from 0"),
        ('{"idle_limit_s": "900"}', "idle_limit_s must be"),
        ('{"idle_limit_s": true}', "idle_limit_s must be"),
        ('{"idle_limit_s": 1e400}', "idle_limit_s must be"),  # JSON's infinity
        ('{"max_age_s": 1e12}', "max_age_s must be seconds from 0 up to a year"),
        ('{"window_s": 0}', "window_s must be seconds above 0"),
        ("{" + " " * 5000 + "}", "longer than 4096"),
    ]:
        monkeypatch.setenv("GPUPOOL_CULL_LIMITS", bad)
        with pytest.raises(ValueError, match=why.replace("(", r"\(")):
            GPUArbiter.from_env()


def test_the_hook_finds_the_api_server_without_the_hubs_kubernetes_variables():
    # JupyterHub gives a managed service only its `environment` and Spawner.env_keep: the culler
    # process never sees the KUBERNETES_SERVICE_HOST/PORT the kubelet gave the hub's container
    from gpupool.idle_culler.stock_arbiter import api_environ

    found = api_environ({"PATH": "/usr/bin"})
    assert (found["KUBERNETES_SERVICE_HOST"], found["KUBERNETES_SERVICE_PORT"]) == (
        "kubernetes.default.svc",
        "443",
    )
    given = api_environ({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"})
    assert given["KUBERNETES_SERVICE_HOST"] == "10.96.0.1"  # the pod's own, where it has them
