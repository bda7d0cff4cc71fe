"""In JupyterLab: show the status widget, promote a cell with %%train, watch it run, open the
executed output — in headless Chromium, a screenshot per step."""

from __future__ import annotations

import re
import time

import pytest

from tests.browser import browser_page, login, shot
from tests.hubtools import PASSWORD, Hub
from tests.test_browser_e2e import wait_kernel_idle

pytestmark = [pytest.mark.browser, pytest.mark.hub]
CONFIG = "c.TrainPool.tick_s = 0.5\nc.TrainPool.projects = {'default': {'guarantee': 1}}\n"


def run_cell(page, index: int, code: str) -> None:
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    cell.locator(".cm-content").click()
    page.keyboard.insert_text(code)
    page.keyboard.press("Shift+Enter")


def test_promote_a_cell_and_open_its_executed_notebook(make_hub) -> None:
    hub: Hub = make_hub(CONFIG).start()
    hub.spawn("nia", "0.25")
    with browser_page("promote") as page:
        login(page, hub.url, "nia", PASSWORD)
        page.goto(f"{hub.url}/user/nia/lab")
        page.locator('.jp-LauncherCard[data-category="Notebook"]').first.click(timeout=60_000)
        page.locator(".jp-Notebook .jp-Cell .cm-content").first.wait_for(timeout=60_000)
        wait_kernel_idle(hub, "nia")

        run_cell(page, 0, "%load_ext gpupool\n%gpupool")
        status = page.locator(".jp-OutputArea-output").filter(has_text="gpupool workspace").first
        status.wait_for(timeout=60_000)
        page.get_by_text("0.25 GPU = 4,096 MiB").first.wait_for(timeout=30_000)
        shot(page, "promote-1-status-widget")

        run_cell(
            page,
            1,
            "%%train --project default --gpus 0.25 --name squares -p n=10\n"
            "import time; time.sleep(4)\n"
            "for i in range(60): print('line', i)\n"
            "print('promoted', sum(i * i for i in range(n)))\n"
            "print('\\x1b[31mERROR: the last line, in red\\x1b[0m')",
        )
        submitted = page.get_by_text(re.compile(r"submitted job [0-9a-f]{12} to default"))
        submitted.wait_for(timeout=60_000)
        job_id = re.search(r"job ([0-9a-f]{12})", submitted.inner_text()).group(1)
        shot(page, "promote-2-submitted")

        seen = []
        monitor = page.locator(".jp-OutputArea-output").filter(has_text="Cancel job").last
        deadline = time.monotonic() + 90
        while "succeeded" not in seen:  # nobody presses anything: the monitor follows the job
            assert time.monotonic() < deadline, seen
            page.wait_for_timeout(300)
            table = monitor.locator("table").inner_text()
            state = next(s for s in ("queued", "running", "succeeded", "failed") if s in table)
            if not seen or seen[-1] != state:
                seen.append(state)
                shot(page, f"promote-2-{state}")
        assert seen[-1] == "succeeded" and "running" in seen and "failed" not in seen
        assert seen.index("running") < seen.index("succeeded")
        log = monitor.locator(".gpupool-log")
        assert "promoted 285" in log.inner_text()  # the log tail
        # the box shows its last lines (a failure's error is in view, not below the fold), in colour
        page.wait_for_function(
            "(b => b.scrollTop + b.clientHeight >= b.scrollHeight - 2 && b.scrollHeight >"
            " b.clientHeight + 50)(document.querySelector('.gpupool-log'))",
            timeout=10_000,
        )
        red = log.locator("span", has_text="ERROR: the last line, in red")
        assert red.count() == 1 and "color" in red.get_attribute("style")
        assert "[31m" not in log.inner_text() and "\x1b" not in log.inner_text()
        shot(page, "promote-3-succeeded")

        page.goto(f"{hub.url}/user/nia/lab/tree/gpupool-jobs/squares-{job_id}/output.ipynb")
        page.locator(".jp-OutputArea-output").filter(has_text="promoted 285").first.wait_for(timeout=60_000)
        shot(page, "promote-4-executed-output")

    # the events tell the whole story, and another user sees none of it
    kinds = [
        e["kind"] for e in hub.api("GET", "/services/gpupool/api/events")["events"] if e["name"] == job_id
    ]
    story = kinds[::-1]
    assert story[0] == "job" and story.index("allocate") < story.index("start") < story.index("release")
    status, _ = hub.api_error("GET", f"/services/gpupool/api/jobs/{job_id}", token=hub.user_token("oli"))
    assert status == 404
