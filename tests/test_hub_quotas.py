"""Admins change quotas through the API: validated, no restart, kept across restarts."""

from __future__ import annotations

import pytest

from tests.hubtools import Hub

pytestmark = pytest.mark.hub
Q = "/services/gpupool/api/quotas"


def test_admin_changes_quotas_live_and_they_survive_a_restart(make_hub) -> None:
    hub: Hub = make_hub().start()
    hub.spawn("kim", "1")  # under the config's 1 GPU quota
    changed = hub.api("PUT", Q, {"default_build_quota": 0.25, "allowed_fractions": [0.1, 0.25]})
    assert changed["quotas"]["default_build_quota"] == 0.25
    assert changed["changed_through_api"] == ["allowed_fractions", "default_build_quota"]

    # new spawns follow the new quota at once; kim keeps the share she holds
    hub.api("POST", "/hub/api/users/lee")
    status, message = hub.api_error("POST", "/hub/api/users/lee/server", {"gpus": 0.5})
    assert status == 400 and "choose one of: 0.1 GPU, 0.25 GPU" in message
    hub.spawn("lee", "0.25")
    assert sorted((s["owner"], s["milli"]) for s in hub.allocations()) == [("kim", 1000), ("lee", 250)]

    hub.stop()
    hub.start()
    assert hub.api("GET", Q)["quotas"]["default_build_quota"] == 0.25
    hub.api("DELETE", Q)
    assert hub.api("GET", Q) == {"quotas": hub.api("GET", Q)["quotas"], "changed_through_api": []}
    assert hub.api("GET", Q)["quotas"]["default_build_quota"] == 1.0


@pytest.mark.parametrize(
    "body, message",
    [
        ({"default_build_quota": -1}, "must not be negative"),
        ({"allowed_fractions": [0.25, 1.5]}, "not a whole number"),
        ({"group_overrides": {"x": {"quotaa": 1}}}, "unknown keys ['quotaa']"),
        ({"max_gpus": 2}, "unknown quota options ['max_gpus']"),
        ({"default_build_quota": "lots"}, "default_build_quota"),
    ],
)
def test_bad_quota_changes_are_refused_and_change_nothing(hub: Hub, body: dict, message: str) -> None:
    before = hub.api("GET", Q)
    status, text = hub.api_error("PUT", Q, body)
    assert status == 400 and message in text
    assert hub.api("GET", Q) == before


def test_users_cannot_read_or_change_quotas(hub: Hub) -> None:
    token = hub.user_token("nosy")
    for method, body in (("GET", None), ("PUT", {"default_build_quota": 8}), ("DELETE", None)):
        status, text = hub.api_error(method, Q, body, token=token)
        assert status == 403 and "only admins" in text
    assert hub.api("GET", Q)["changed_through_api"] == []
