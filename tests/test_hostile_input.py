"""Hostile input against a real hub: every malformed body is a 4xx with a short JSON message,
never a 500, never a stall and never a megabyte stored; numbers are bounded before any
arithmetic; config tables with a zero size or a negative count are refused."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from traitlets import TraitError
from traitlets.config import Config

from tests.hubtools import ADMIN_TOKEN, Hub

pytestmark = pytest.mark.hub
J = "/services/gpupool/api/jobs"
CONFIG = """
c.TrainPool.tick_s = 0.5
c.TrainPool.projects = {"vision": {"guarantee": 1}}
"""
HUGE = "1e999999m"


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> Hub:
    from tests.conftest import require_chp

    require_chp()
    h = Hub(
        state=tmp_path_factory.mktemp("hostile"), extra_config=CONFIG, env={"GPUPOOL_CULLER": "0"}
    ).start()
    yield h
    h.cleanup()


def raw(hub: Hub, method: str, path: str, data: bytes, token: str = ADMIN_TOKEN) -> tuple[int, dict | str]:
    req = urllib.request.Request(
        hub.url + path, data=data, method=method, headers={"Authorization": f"token {token}"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        status, text = err.code, err.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


BAD_JOBS = [
    ({"project": ["vision"], "gpus": 1, "command": "true"}, "unknown project"),
    ({"project": {"a": 1}, "gpus": 1, "command": "true"}, "unknown project"),
    ({"project": "vision", "gpus": HUGE, "command": "true"}, "more GPUs than any pool has"),
    ({"project": "vision", "gpus": "9" * 5000, "command": "true"}, "over 32 characters"),
    ({"project": "vision", "gpus": [1], "command": "true"}, "not a GPU amount"),
    ({"project": "vision", "gpus": 1, "command": {"argv": ["true"]}}, "command must be a list"),
    ({"project": "vision", "gpus": 1, "command": ["true", 1]}, "command must be a list"),
    ({"project": "vision", "gpus": 1, "command": "echo 'unbalanced"}, "No closing quotation"),
    ({"project": "vision", "gpus": 1, "notebook": "print(1)"}, "notebook must be a notebook document"),
    ({"project": "vision", "gpus": 1, "notebook": {"cells": "nope"}}, "not a valid notebook"),
    ({"project": "vision", "gpus": 1, "code": {"a": 1}}, "code must be Python source"),
    (
        {"project": "vision", "gpus": 1, "code": "print(n)", "parameters": [1, 2]},
        "parameters must be an object",
    ),
    (
        {"project": "vision", "gpus": 1, "command": "true", "priority": float("1e308")},
        "priority must be between",
    ),
    ({"project": "vision" * 100_000, "gpus": 1, "command": "true"}, "unknown project"),
]


@pytest.mark.parametrize("body, message", BAD_JOBS, ids=[m + str(i) for i, (_, m) in enumerate(BAD_JOBS)])
def test_malformed_job_submissions_are_400_with_a_short_message(hub: Hub, body: dict, message: str) -> None:
    token = hub.user_token("mallory")
    status, reply = raw(hub, "POST", J, json.dumps(body).encode(), token=token)
    assert status == 400, reply
    assert message in reply["message"] and len(reply["message"]) <= 2000
    assert hub.api("GET", J, token=token)["jobs"] == []


@pytest.mark.parametrize(
    "data, status",
    [
        (b"[" * 200_000 + b"]" * 200_000, 400),  # deeper than Python's parser goes
        (b'{"a":' * 100 + b"1" + b"}" * 100, 400),  # parses, but deeper than any real body
        (b"[1, 2]", 400),
        (b"{not json", 400),
        (b'{"project": "vision", "gpus": 1, "script": "' + b"x" * (5 * 1024 * 1024) + b'"}', 413),
    ],
)
def test_bodies_out_of_shape_or_size_are_refused(hub: Hub, data: bytes, status: int) -> None:
    got, reply = raw(hub, "POST", J, data, token=hub.user_token("mallory"))
    assert got == status, reply


def test_a_huge_gpu_count_on_the_spawn_api_is_refused_and_stored_short(hub: Hub) -> None:
    hub.api("POST", "/hub/api/users/trudy")
    status, reply = raw(hub, "POST", "/hub/api/users/trudy/server", json.dumps({"gpus": HUGE}).encode())
    assert status == 400 and "more GPUs than any pool has" in str(reply), reply
    status, reply = raw(
        hub, "POST", "/hub/api/users/trudy/server", json.dumps({"gpus": "x" * 1_000_000}).encode()
    )
    assert status == 400 and len(str(reply)) < 2000, str(reply)[:300]
    events = hub.api("GET", "/services/gpupool/api/events?limit=1000")["events"]
    assert all(len(e["message"]) <= 2000 for e in events)
    assert hub.allocations() == []


@pytest.mark.parametrize(
    "query",
    [
        "tail=abc",
        "tail=0",
        "tail=1e9",
        "tail=" + "9" * 5000,
        "before=-1",
        "before=1.5",
        "tail=5&before=" + "9" * 100,
    ],
)
def test_log_paging_arguments_are_bounded(hub: Hub, query: str) -> None:
    token = hub.user_token("peggy")
    job = hub.api("POST", J, {"project": "vision", "gpus": 1, "command": ["true"]}, token=token)
    status, reply = raw(hub, "GET", f"{J}/{job['id']}/logs?{query}", None, token=token)
    assert status == 400 and ("tail" in reply["message"] or "before" in reply["message"]), reply


@pytest.mark.parametrize(
    "change, message",
    [
        ({"allowed_fractions": [0]}, "more than 0"),
        ({"allowed_fractions": [0.25, -1]}, "negative"),
        ({"max_workspaces_per_user": -1}, "from 0 to 1000"),
        ({"allowed_fractions": "abc"}, ""),
        ({"group_overrides": {"g": {"fractions": [0]}}}, "more than 0"),
        ({"group_overrides": {"g": {"max_workspaces": -1}}}, "from 0 to 1000"),
        ({"group_overrides": {"g": {"fractions": "0.5"}}}, "must be a list"),
    ],
)
def test_quota_changes_that_make_no_sense_are_400(hub: Hub, change: dict, message: str) -> None:
    before = hub.api("GET", "/services/gpupool/api/quotas")
    status, reply = raw(hub, "PUT", "/services/gpupool/api/quotas", json.dumps(change).encode())
    assert status == 400 and message in reply["message"], reply
    assert hub.api("GET", "/services/gpupool/api/quotas") == before


@pytest.mark.parametrize(
    "setting, value",
    [
        ("allowed_fractions", [0]),
        ("max_workspaces_per_user", -1),
        ("allowed_fractions", [0.1, 0]),
        ("group_overrides", {"g": {"max_workspaces": -3}}),
    ],
)
def test_the_config_file_refuses_a_zero_size_or_a_negative_count(setting: str, value) -> None:
    from gpupool.wiring.setup import validate

    c = Config()
    setattr(c.GPUPool, setting, value)
    with pytest.raises(TraitError):
        validate(c)
