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


def test_a_groups_total_counts_its_members_now_not_at_their_spawn(make_hub) -> None:
    """A class's total counts whoever is in the class now: a student added to the group after
    starting a server counts for it, one removed no longer does (before, the groups recorded at
    each spawn were used, and the class could go over its total)."""
    hub: Hub = make_hub("c.GPUPool.group_totals = {'cs101': 0.5}\n", env={"GPUPOOL_CULLER": "0"}).start()
    hub.api("POST", "/hub/api/groups/cs101")
    hub.api("POST", "/hub/api/users/bo")
    hub.api("POST", "/hub/api/groups/cs101/users", {"users": ["bo"]})
    hub.spawn("amy", "0.5")  # not in the class yet
    hub.api("POST", "/hub/api/groups/cs101/users", {"users": ["amy"]})
    status, message = hub.api_error("POST", "/hub/api/users/bo/server", {"gpus": 0.25})
    assert (
        status == 403 and "group 'cs101' may hold 0.5 GPU in all and its members hold 0.5 GPU" in message
    ), message
    hub.api("DELETE", "/hub/api/groups/cs101/users", {"users": ["amy"]})
    hub.spawn("bo", "0.25")  # amy's share no longer counts for the class
