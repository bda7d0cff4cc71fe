"""The whole flow as a new user lives it, in headless Chromium, a screenshot per step:
log in → spawn 0.25 GPU on the form → the status bar shows the share → %%train → the monitor
reaches succeeded by itself → a cull warning appears in JupyterLab → Extend."""

from __future__ import annotations

import json
import time

import pytest

from tests.browser import browser_page, login, shot
from tests.hubtools import PASSWORD, Hub
from tests.test_browser_e2e import wait_kernel_idle
from tests.test_browser_lab import culler_for
from tests.test_browser_promote import run_cell
from tests.test_culler_hub import CONFIG

pytestmark = [pytest.mark.browser, pytest.mark.hub]


def test_walkthrough_login_spawn_status_train_warning_extend(make_hub, tmp_path) -> None:
    hub: Hub = make_hub(CONFIG + "c.TrainPool.tick_s = 0.5\n", env={"GPUPOOL_CULLER": "0"}).start()
    samples = tmp_path / "samples.json"
    samples.write_text(json.dumps({"maya/": {"util_pct": 0}}))
    now = [time.time()]
    culler = culler_for(hub, samples, now)
    with browser_page("walkthrough") as page:
        login(page, hub.url, "maya", PASSWORD)
        page.goto(f"{hub.url}/hub/spawn")
        page.locator(".gpupool-form").wait_for()
        page.check('input[name="gpus"][value="0.25"]')
        shot(page, "walk-1-spawn-form")
        page.click('#spawn_form button[type="submit"]')
        page.wait_for_url("**/user/maya/lab**", timeout=120_000)

        item = page.locator("#jp-main-statusbar .gpupool-StatusItem")
        page.wait_for_function(
            "(document.querySelector('.gpupool-StatusItem') || {}).textContent?.startsWith('GPU 0.25')",
            timeout=90_000,
        )
        shot(page, "walk-2-status-bar")

        page.locator('.jp-LauncherCard[data-category="Notebook"]').first.click(timeout=60_000)
        page.locator(".jp-Notebook .jp-Cell .cm-content").first.wait_for(timeout=60_000)
        wait_kernel_idle(hub, "maya")
        run_cell(page, 0, "%load_ext gpupool")
        run_cell(
            page,
            1,
            "%%train --project default --gpus 1 --name walk -p n=12\n"
            "print('sum of squares', sum(i * i for i in range(n)))",
        )
        monitor = page.locator(".jp-OutputArea-output").filter(has_text="Cancel job").last
        monitor.wait_for(timeout=60_000)
        shot(page, "walk-3-submitted")
        # nobody presses anything: the monitor follows the job until it ends
        monitor.locator("table").filter(has_text="succeeded").wait_for(timeout=120_000)
        page.wait_for_function(
            "[...document.querySelectorAll('.jp-OutputArea-output .gpupool-log')]"
            ".some(t => t.textContent.includes('sum of squares 506'))",
            timeout=30_000,
        )
        assert "Executed notebook" in monitor.inner_text()
        shot(page, "walk-4-succeeded")

        assert culler.run_pass()["events"] == []
        now[0] += 22 * 60  # the GPU sat idle since: the culler warns, and JupyterLab says so
        assert [e["owner"] for e in culler.run_pass()["events"]] == ["maya"]
        toast = page.locator(".Toastify__toast").filter(has_text="will stop in 8 min")
        toast.wait_for(timeout=60_000)  # the status item polls every 20 s: no reload
        assert item.get_attribute("data-action") == "warn"
        page.wait_for_timeout(600)  # let the toast finish sliding in for the screenshot
        shot(page, "walk-5-cull-warning")
        toast.get_by_role("button", name="Extend").click()
        page.locator(".Toastify__toast").filter(has_text="Extended").wait_for(timeout=30_000)
        shot(page, "walk-6-extended")
    found = hub.api("GET", "/services/gpupool/api/culler/status")["workspaces"][0]
    assert found["owner"] == "maya" and found["extended"] and found["action"] == "keep"
