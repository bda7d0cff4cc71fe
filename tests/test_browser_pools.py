"""The spawn form's node pools in a real headless Chromium: a user of several pools picks one
and the workspace lands there; a tampered pool is refused on the form with the pools allowed."""

from __future__ import annotations

import pytest

from tests.browser import browser_page, login, shot
from tests.hubtools import PASSWORD, Hub
from tests.test_build_pools import HUB_CONFIG

pytestmark = [pytest.mark.browser, pytest.mark.hub]


def test_the_form_offers_the_users_pools_and_refuses_another(make_hub) -> None:
    hub: Hub = make_hub(HUB_CONFIG, env={"GPUPOOL_CULLER": "0"}).start()
    hub.api("POST", "/hub/api/users/rex")
    hub.api("POST", "/hub/api/groups/research", {"users": ["rex"]})
    with browser_page("pools-form") as page:
        login(page, hub.url, "rex", PASSWORD)
        page.goto(f"{hub.url}/hub/spawn/rex/tampered")
        pools = page.locator(".gpupool-pools")
        pools.wait_for()
        assert "any of yours, in this order: dgx, ws" in pools.inner_text()
        # tamper: a pool that is not the user's, sent anyway
        page.locator('input[name="pool"][value="ws"]').evaluate(
            "el => { el.value = 'cloud'; el.checked = true; }"
        )
        page.click('#spawn_form button[type="submit"]')
        error = page.locator(".spawn-error-msg")
        error.wait_for(timeout=30_000)
        assert "node pool 'cloud' is not one you may use: choose one of dgx, ws" in error.inner_text()
        assert hub.allocations() == []
        page.goto(f"{hub.url}/hub/spawn/rex")
        page.check('input[name="gpus"][value="1"]')
        page.check('input[name="pool"][value="ws"]')
        shot(page, "pools-form")
        page.click('#spawn_form button[type="submit"]')
        page.wait_for_url("**/user/rex/**", timeout=120_000)
    assert [s["gpu"] for s in hub.allocations() if s["owner"] == "rex"] in ([0], [1])  # the workstations
