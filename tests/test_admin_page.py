"""The gpupool page: the plot is a pure function, and the page shows each caller their part."""

from __future__ import annotations

import pytest
from gpupool.api.page import svg_plot

from tests.browser import browser_page, login, shot
from tests.hubtools import ADMIN_PASSWORD, PASSWORD, Hub


def test_plot_draws_allocation_and_use_scaled_to_capacity() -> None:
    svg = svg_plot([(0, 1.0, 0.25), (60, 2.0, None), (120, 4.0, 1.0)], capacity=4)
    assert svg.count("<polyline") == 2 and "class='allocated'" in svg and "class='used'" in svg
    assert "last 120 s" in svg or "last 2 min" in svg
    # the allocation line ends at the top (4 of 4 GPUs), use at a quarter
    assert svg.split("class='allocated'")[1].split("points='")[1].split("'")[0].endswith("680.0,40.0")
    assert "no GPU utilization data" in svg_plot([(0, 1, None), (60, 1, None)], capacity=4)
    assert "Not enough samples" in svg_plot([(0, 1, None)], capacity=4)
    assert svg.count("class='time-tick'") == 5  # a time axis under the plot


@pytest.mark.hub
@pytest.mark.browser
def test_page_shows_admins_everyone_and_users_their_part(make_hub) -> None:
    hub: Hub = make_hub("c.TrainPool.projects = {'vision': {'guarantee': 2, 'department': 'research'}}\n"
                        "c.TrainPool.departments = {'research': {'guarantee': 3, 'limit': 4}}\n"
                        "c.GPUPool.group_totals = {'cs101': 2}\n"
                        "c.IdleCuller.interval_s = 1\n").start()  # the culler's passes feed the plot
    hub.spawn("uma", "0.5")
    hub.spawn("vic", "0.25")
    with browser_page("admin-page") as page:
        login(page, hub.url, "admin", ADMIN_PASSWORD)
        page.goto(f"{hub.url}/services/gpupool/")
        page.wait_for_selector("table.gpupool-gpus")
        text = page.inner_text("body")
        assert "uma (0.5 GPU, build)" in text and "vic (0.25 GPU, build)" in text
        assert "vision" in page.inner_text("table.gpupool-projects") and "research" in text
        assert page.inner_text("table.gpupool-departments").split("\n")[-1].split("\t")[:4] == [
            "research", "vision", "3 GPUs", "4 GPUs"]
        for _ in range(60):  # a few culler passes
            if page.locator("svg.gpupool-plot").count():
                break
            page.wait_for_timeout(500)
            page.reload()
        points = page.locator("svg.gpupool-plot polyline.allocated").get_attribute("points").split()
        assert len(points) >= 2
        assert float(points[-1].split(",")[1]) == pytest.approx(220 - 40 - 0.75 / 4 * 140, abs=0.2)  # 0.75 GPU
        assert page.locator("svg.gpupool-plot text.time-tick").count() == 5  # a time axis
        assert page.locator("nav.navbar a.nav-link", has_text="Home").count() == 1  # the hub's navigation
        assert page.inner_text("table.gpupool-groups").split("\n")[-1].split() == ["cs101", "0", "GPU", "of", "2", "GPUs"]  # a class's total
        shot(page, "admin-1-page")

        # a job that cannot start: the table says why, and Cancel works from the page
        token = hub.user_token("uma")
        job = hub.api("POST", "/services/gpupool/api/jobs", {"project": "vision", "gpus": 4, "command": "true"},
                      token=token)
        page.reload()
        row = page.locator("table.gpupool-jobs tr", has_text=job["id"])
        assert "waiting for GPUs: no node has 4 free GPUs; project vision uses 0 of its 2-GPU guarantee" in \
            row.inner_text()  # the workspaces hold parts of two GPUs
        shot(page, "admin-2-jobs")
        row.get_by_role("button", name="Cancel").click()
        # the page reads itself again (every 15 s): no reload
        page.locator("table.gpupool-jobs tr", has_text=job["id"]).filter(has_text="cancelled").wait_for(
            timeout=40_000)
        assert page.locator(".gpupool-action-error").count() == 0

        # quotas: a bad value is refused with the reason, a good one applies to the next spawn
        form = page.locator("form.gpupool-quota")
        form.locator("input").fill("-1")
        form.get_by_role("button", name="Save").click()
        page.locator(".gpupool-quota-result", has_text="must not be negative").wait_for(timeout=10_000)
        form.locator("input").fill("2")
        form.get_by_role("button", name="Save").click()
        page.locator(".gpupool-quota-result", has_text="saved").wait_for(timeout=10_000)
        assert hub.api("GET", "/services/gpupool/api/quotas")["quotas"]["default_build_quota"] == 2

        # linked from JupyterHub's own admin page
        page.goto(f"{hub.url}/hub/admin")
        page.locator(".gpupool-admin-link a").click()
        page.wait_for_selector("table.gpupool-gpus")
    with browser_page("user-page") as page:
        login(page, hub.url, "uma", PASSWORD)
        page.goto(f"{hub.url}/services/gpupool/")
        page.wait_for_selector("table.gpupool-gpus")
        text = page.inner_text("table.gpupool-gpus")
        assert "uma (0.5 GPU, build)" in text and "vic" not in text and "(another user)" in text
        shot(page, "admin-3-user-view")
