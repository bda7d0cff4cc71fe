"""Build workspaces on node pools: a group's profile names the pools its workspaces may use
(in order of preference), the placement keeps them there, and the spawn form shows them and
refuses a pool that is not the user's."""

from __future__ import annotations

import html
import http.cookiejar
import re
import urllib.parse
import urllib.request

import pytest
from traitlets import TraitError

from gpupool.pool import BuildLimits, ClusterState, InvalidRequest, Request, get_policy, virtual_inventory
from gpupool.pool.pools import NodePool, PoolNotAllowed, allowed_pools, choose_in_pools
from gpupool.spawner.form import parse_choice, parse_form, render_form
from tests.hubtools import PASSWORD, Hub

POOLS = {"ws": NodePool("ws", gpus=frozenset({0, 1})), "dgx": NodePool("dgx", gpus=frozenset({2, 3}))}


def test_placement_tries_the_pools_in_their_order_and_never_leaves_them() -> None:
    state = ClusterState(virtual_inventory(4))
    policy, rng = get_policy("best-fit"), __import__("random").Random(0)
    spots = []
    for _ in range(4):
        p = choose_in_pools(policy, state, Request.for_gpus(1000), rng, [POOLS["ws"], POOLS["dgx"]])
        state.apply(p)
        spots.append(p.gpus[0])
    assert sorted(spots[:2]) == [0, 1] and sorted(spots[2:]) == [2, 3]  # the workstations first
    state = ClusterState(virtual_inventory(4))
    state.apply(state.placement_on(0, Request.for_gpus(2000), [0, 1]))
    assert (
        choose_in_pools(policy, state, Request.for_gpus(250), rng, [POOLS["ws"]]) is None
    )  # full: not elsewhere


def test_who_may_use_which_pool() -> None:
    assert allowed_pools(("ws", "dgx"), ("ws", "dgx"), None) == ("ws", "dgx")
    assert allowed_pools(("ws", "dgx"), ("ws", "dgx"), "dgx") == ("dgx",)
    assert allowed_pools((), ("ws", "dgx"), "dgx") == ("dgx",)  # no pools named: any of them
    assert allowed_pools((), ("ws", "dgx"), None) == ()  # ... or every GPU
    with pytest.raises(PoolNotAllowed, match="node pool 'dgx' is not one you may use: choose one of ws"):
        allowed_pools(("ws",), ("ws", "dgx"), "dgx")
    assert PoolNotAllowed.status == 403
    a = BuildLimits(1000, (1000,), 1000, 1, pools=("ws",))
    assert a.merged(BuildLimits(1000, (1000,), 1000, 1, pools=("dgx", "ws"))).pools == ("ws", "dgx")
    assert a.merged(BuildLimits(1000, (1000,), 1000, 1)).pools == ()  # another group may use every GPU


def test_the_form_shows_the_pools_and_parses_one_with_bounds() -> None:
    one = render_form([(1000, True)], [], 1000, True, pools=["ws"])
    assert "GPUs from node pool <b>ws</b>" in one and 'name="pool"' not in one
    two = render_form([(1000, True)], [], 1000, True, pools=["ws", "d<x>"])
    assert 'value="" checked> any of yours, in this order: ws, d&lt;x&gt;' in two
    assert '<input type="radio" name="pool" value="d&lt;x&gt;"> d&lt;x&gt; only' in two
    assert "gpupool-pools" not in render_form([(1000, True)], [], 1000, True)
    assert parse_form({"gpus": ["1"], "pool": ["dgx"]}) == {"gpus": "1", "pool": "dgx"}
    assert parse_form({"gpus": ["1"], "pool": [""]}) == {"gpus": "1"}
    for bad in ({"gpus": ["1"], "pool": ["a", "b"]}, {"gpus": ["1"], "pool": ["x" * 64]}):
        with pytest.raises(InvalidRequest):
            parse_choice(parse_form(bad))
    with pytest.raises(InvalidRequest, match="must be the name of a node pool"):
        parse_choice({"gpus": 1, "pool": ["dgx"]})


def test_the_config_checks_the_pools_of_build_profiles() -> None:
    from traitlets.config import Config

    from gpupool.settings.config import GPUPool
    from gpupool.wiring.root import node_pools

    c = Config()
    c.GPUPool.build_pools = ["ws"]
    c.GPUPool.group_overrides = {"research": {"pools": ["dgx", "ws"]}}
    c.TrainPool.node_pools = {"ws": {"gpus": [0, 1]}, "dgx": {"gpus": [2, 3]}}
    quotas = GPUPool(config=c).quota_policy()
    assert quotas.limits_for([]).pools == ("ws",) and quotas.limits_for(["research"]).pools == ("dgx", "ws")
    assert set(node_pools(c, quotas)) == {"ws", "dgx"}
    c.GPUPool.group_overrides = {"research": {"pools": ["cloud"]}}
    with pytest.raises(TraitError, match=r"group_overrides\['research'\]: pools \['cloud'\] are not in"):
        node_pools(c, GPUPool(config=c).quota_policy())
    for bad in (["ws", "ws"], "ws", [1], [f"p{i}" for i in range(17)]):
        c.GPUPool.group_overrides = {"research": {"pools": bad}}
        with pytest.raises(TraitError, match="pools must be a list of at most 16 node pool names"):
            GPUPool(config=c).quota_policy()


HUB_CONFIG = """
c.GPUPool.use_nvml = False
c.GPUPool.virtual_gpus = 4
c.GPUPool.default_build_quota = 2
c.GPUPool.allowed_fractions = [0.5, 1]
c.GPUPool.build_pools = ["ws"]
c.GPUPool.group_overrides = {"research": {"pools": ["dgx", "ws"]}}
c.TrainPool.node_pools = {"ws": {"gpus": [0, 1]}, "dgx": {"gpus": [2, 3]}}
"""


class Browser:
    """A logged-in user over plain HTTP (cookies and JupyterHub's _xsrf token)."""

    def __init__(self, hub: Hub, user: str) -> None:
        self.hub = hub
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )
        page = self.get("/hub/login")
        self.post("/hub/login", {"username": user, "password": PASSWORD, "_xsrf": xsrf(page)})

    def get(self, path: str) -> str:
        with self.opener.open(self.hub.url + path, timeout=30) as r:
            return r.read().decode()

    def post(self, path: str, fields: dict) -> str:
        data = urllib.parse.urlencode(fields).encode()
        with self.opener.open(self.hub.url + path, data=data, timeout=60) as r:
            return r.read().decode()


def xsrf(page: str) -> str:
    return re.search(r'name="_xsrf" value="([^"]+)"', page).group(1)


def form_action(page: str) -> str:
    """The spawn form's target: JupyterHub puts its _xsrf token in the URL."""
    return html.unescape(re.search(r'action="([^"]+)"', page).group(1))


@pytest.mark.hub
def test_a_real_hub_keeps_workspaces_on_their_groups_pools(tmp_path) -> None:
    from tests.conftest import require_chp

    require_chp()
    hub = Hub(state=tmp_path, extra_config=HUB_CONFIG, env={"GPUPOOL_CULLER": "0"}).start()
    try:
        for user in ("ann", "bea", "cat", "rex"):
            hub.api("POST", f"/hub/api/users/{user}")
        hub.api("POST", "/hub/api/groups/research", {"users": ["rex"]})
        # ann's profile: the workstations only; a pool that is not hers is refused, nothing held
        status, message = hub.api_error("POST", "/hub/api/users/ann/server", {"gpus": 1, "pool": "dgx"})
        assert status == 403 and "node pool 'dgx' is not one you may use: choose one of ws" in message
        status, message = hub.api_error("POST", "/hub/api/users/ann/server", {"gpus": 1, "pool": ["dgx"]})
        assert status == 400 and "must be the name of a node pool" in message
        assert hub.allocations() == []
        hub.spawn("ann", 1)
        hub.spawn("bea", 1)
        assert sorted(s["gpu"] for s in hub.allocations()) == [0, 1]
        # the workstations are full: a third workspace does not spill onto the idle DGX
        status, message = hub.api_error("POST", "/hub/api/users/cat/server", {"gpus": 0.5})
        assert status == 409 and "your node pools: ws" in message, message
        hub.stop_server("bea")
        free_ws = ({0, 1} - {s["gpu"] for s in hub.allocations()}).pop()
        # rex (research) prefers the DGX, and may choose a pool on the form
        browser = Browser(hub, "rex")
        form = browser.get("/hub/spawn/rex")
        assert "any of yours, in this order: dgx, ws" in form and 'value="ws"> ws only' in form
        browser.post(form_action(form), {"gpus": "1", "pool": "ws"})
        hub.wait_ready("rex")
        assert [s["gpu"] for s in hub.allocations() if s["owner"] == "rex"] == [free_ws]
        hub.spawn("rex", 1, server="b")
        assert sorted(s["gpu"] for s in hub.allocations() if s["owner"] == "rex") in (
            [free_ws, 2],
            [free_ws, 3],
        )
        ann_form = Browser(hub, "ann").get("/hub/spawn/ann/four")
        assert "GPUs from node pool <b>ws</b>" in ann_form and 'name="pool"' not in ann_form
    finally:
        hub.cleanup()
