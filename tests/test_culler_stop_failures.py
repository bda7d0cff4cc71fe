"""A stop the hub is slow to answer, or that cannot reach the hub, must not end a pass that
stops a whole class: seen at 5,000 workspaces, one DELETE that the hub answered after more than
the client's 30 s raised out of the pass, and no stop after it, no report, no event was made.
The hub's side is a stand-in here (the calls the culler makes, answered from a table); the
real hub meets the culler in tests/test_culler_class_size.py."""

from __future__ import annotations

import time
import urllib.error

from gpupool.idle_culler.config import IdleCuller
from gpupool.idle_culler.sampler import Target
from gpupool.idle_culler.service import Client, Culler
from tests.test_culler_app import target

USERS = ["slow", "down", "fine"]
STARTED = "2026-11-23T08:00:00Z"


class Hub(Client):
    def __init__(self) -> None:
        super().__init__("token")
        self.deleted: list[str] = []
        self.report: dict | None = None

    def call(self, method, url, body=None, accept="application/json"):
        if url.endswith("api/culler/targets"):
            return {"workspaces": [target(u, []) for u in USERS]}
        if url.endswith("api/culler/report"):
            self.report = body
            return {"ok": True}
        if method == "DELETE":
            user = url.split("/users/")[1].split("/")[0]
            self.deleted.append(user)
            if user == "slow":
                raise TimeoutError("timed out")  # the hub has it, and answers late
            if user == "down":
                raise urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
            return None
        raise AssertionError(f"unexpected {method} {url}")

    def paginated(self, url, concurrency=1):
        return [
            {"name": u, "servers": {"": {"ready": True, "started": STARTED, "last_activity": STARTED}}}
            for u in USERS
        ]


class Idle:
    def sample(self, targets: list[Target]) -> dict:
        return {}  # no GPU data: Jupyter activity decides, days after the last


def test_one_stop_that_fails_never_ends_the_pass_for_the_rest_of_the_class() -> None:
    hub = Hub()
    culler = Culler(
        IdleCuller(sampler="file", concurrency=1),
        hub,
        "http://hub/hub/api",
        "http://hub/services/gpupool/",
        Idle(),
        clock=lambda: time.time() + 30 * 86400,
    )
    result = culler.run_pass()
    assert hub.deleted == USERS  # every stop was asked for, in order, one at a time
    culled = {e["owner"] for e in result["events"] if e["kind"] == "cull"}
    assert culled == {"slow", "fine"}  # the hub has those; "down" never reached it
    assert hub.report is not None and {e["owner"] for e in hub.report["events"]} == {"slow", "fine"}
    hub.deleted.clear()
    culler.run_pass()
    assert "down" in hub.deleted
