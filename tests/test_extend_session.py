"""A workspace's one extension belongs to its session (a start of its server), not to a database
row: SQLite hands a freed row id to the next share, and before the extension was keyed on the
session the next session of the same server was taken for the extended one ("already extended",
no Extend button in JupyterLab or on the hub's home page)."""

from __future__ import annotations

import pytest

from tests.hubtools import Hub

pytestmark = pytest.mark.hub
EXTEND = "/services/gpupool/api/culler/extend"
TARGETS = "/services/gpupool/api/culler/targets"


def extended(hub: Hub, owner: str) -> bool:
    [target] = [t for t in hub.api("GET", TARGETS)["workspaces"] if t["owner"] == owner]
    return target["extended"]


def test_each_session_may_be_extended_once_whatever_row_its_share_gets(make_hub) -> None:
    hub: Hub = make_hub(env={"GPUPOOL_CULLER": "0"}).start()
    hub.spawn("rhea", "0.25")
    token = hub.user_token("rhea")
    assert not extended(hub, "rhea")
    hub.api("POST", EXTEND, {"server": ""}, token=token)
    assert extended(hub, "rhea")
    assert hub.api_error("POST", EXTEND, {"server": ""}, token=token) == (
        409,
        "this session was already extended once; save your work",
    )

    hub.kill9()  # a hub restart is not a new session: the servers ran on
    hub.start()
    assert extended(hub, "rhea")

    hub.stop_server("rhea")
    hub.spawn("rhea", "0.25")  # a new session, on the freed row id
    assert not extended(hub, "rhea")
    hub.api("POST", EXTEND, {"server": ""}, token=token)
    assert extended(hub, "rhea")
