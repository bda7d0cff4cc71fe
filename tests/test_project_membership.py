"""Who may submit to which training project: listed users and groups, admins always, everyone
where a project names nobody; the others get 403 with the projects they may use."""

from __future__ import annotations

import pytest

from tests.hubtools import Hub

pytestmark = pytest.mark.hub
J = "/services/gpupool/api/jobs"
CONFIG = """
c.TrainPool.tick_s = 0.5
c.TrainPool.projects = {"open": {"guarantee": 1}, "vision": {"guarantee": 1, "users": ["ada"], "groups": ["lab"]}}
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> Hub:
    from tests.conftest import require_chp

    require_chp()
    h = Hub(
        state=tmp_path_factory.mktemp("members"), extra_config=CONFIG, env={"GPUPOOL_CULLER": "0"}
    ).start()
    h.api("POST", "/hub/api/users/bea")
    h.api("POST", "/hub/api/groups/lab")
    h.api("POST", "/hub/api/groups/lab/users", {"users": ["bea"]})
    h.api("POST", "/hub/api/users/boss", {"admin": True})
    yield h
    h.cleanup()


def submit(hub: Hub, user: str, project: str) -> dict:
    return hub.api(
        "POST", J, {"project": project, "gpus": 1, "command": ["true"]}, token=hub.user_token(user)
    )


@pytest.mark.parametrize("user, why", [("ada", "listed user"), ("bea", "in group lab"), ("boss", "admin")])
def test_members_and_admins_may_submit_to_a_project_with_a_list(hub: Hub, user: str, why: str) -> None:
    assert submit(hub, user, "vision")["project"] == "vision", why


def test_others_get_403_with_the_projects_they_may_use(hub: Hub) -> None:
    token = hub.user_token("eve")
    status, message = hub.api_error(
        "POST", J, {"project": "vision", "gpus": 1, "command": ["true"]}, token=token
    )
    assert status == 403 and "your projects: ['open']" in message
    assert hub.api("GET", J, token=token)["jobs"] == []
    assert submit(hub, "eve", "open")["project"] == "open"  # a project without lists is open to all
    listed = {
        p["name"]: p["may_submit"]
        for p in hub.api("GET", "/services/gpupool/api/projects", token=token)["projects"]
    }
    assert listed == {"open": True, "vision": False}
