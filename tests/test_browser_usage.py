"""The usage page (/hub/gpupool/usage) and a GPU-hour budget warning in JupyterLab, in headless
Chromium against a real hub. The GPU-hours come from real spawns and stops whose start times are
moved back in the state database (time travel), GPU use from the culler's own passes over a
file standing in for NVML."""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.idle_culler.config import IdleCuller
from gpupool.idle_culler.sampler import FileSampler
from gpupool.idle_culler.service import Client, Culler
from tests.browser import ARTIFACTS, browser_page, login, shot
from tests.conftest import require_chp
from tests.hubtools import ADMIN_PASSWORD, PASSWORD, Hub
from tests.test_culler_hub import CONFIG, TOKEN

pytestmark = [pytest.mark.browser, pytest.mark.hub]
USAGE_CONFIG = (
    CONFIG
    + """
c.Usage.budgets = {"students": {"gpu_hours": 2, "window_days": 1, "min_share": 0.1}}
c.Usage.prices = {"default": 1.5}
c.Usage.currency = "EUR"
c.TrainPool.projects = {"vision": {"guarantee": 2}, "nlp": {"guarantee": 1}}
c.TrainPool.tick_s = 0.5
"""
)


def travel(hub: Hub, owner: str, hours: float) -> None:
    """`owner`'s GPU shares were taken `hours` earlier than they were."""
    with sqlite3.connect(hub.state / "gpupool.sqlite", timeout=30) as db:
        db.execute(
            "UPDATE gpupool_allocations SET created = datetime(created, ?) WHERE owner = ?",
            (f"-{int(hours * 3600)} seconds", owner),
        )


def travel_ended(hub: Hub, owner: str, hours: float) -> None:
    """`owner`'s ended sessions (their release events and GPU use samples) lie `hours` further back."""
    s = int(hours * 3600)
    with sqlite3.connect(hub.state / "gpupool.sqlite", timeout=30) as db:
        db.execute(
            "UPDATE gpupool_events SET time = datetime(time, ?),"
            " data = json_set(data, '$.since', json_extract(data, '$.since') - ?)"
            " WHERE owner = ? AND kind = 'release'",
            (f"-{s} seconds", s, owner),
        )
        db.execute(
            "UPDATE gpupool_usage_hours SET since = since - ?, hour = hour - ? WHERE owner = ?",
            (s, s // 3600, owner),
        )


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    require_chp()
    h = Hub(
        state=tmp_path_factory.mktemp("usage-hub"), extra_config=USAGE_CONFIG, env={"GPUPOOL_CULLER": "0"}
    )
    h.start()
    yield h
    h.stop()


def culler(hub: Hub, samples: Path, now: list[float]) -> Culler:
    return Culler(
        IdleCuller(sampler="file", window_s=30, dry_run=True),
        Client(TOKEN),
        f"{hub.url}/hub/api",
        f"http://127.0.0.1:{hub.api_port}/services/gpupool/",
        FileSampler(str(samples)),
        clock=lambda: now[0],
    )


def test_the_usage_page_shows_where_the_gpu_hours_went(hub: Hub, tmp_path: Path) -> None:
    for user, group in (("ann", "students"), ("bob", "students"), ("dan", "students"), ("cy", "staff")):
        hub.api("POST", f"/hub/api/users/{user}")
        hub.api("POST", f"/hub/api/groups/{group}") if not _group(hub, group) else None
        hub.api("POST", f"/hub/api/groups/{group}/users", {"users": [user]})
    samples = tmp_path / "samples.json"
    samples.write_text(
        json.dumps(
            {
                "ann/": {"util_pct": 4, "memory_mib": 1500},
                "bob/": {"util_pct": 0, "memory_mib": 200},
                "cy/": {"util_pct": 85, "memory_mib": 12000},
                "dan/": {"util_pct": 30, "memory_mib": 5000},
            }
        )
    )
    now = [time.time()]
    c = culler(hub, samples, now)

    def passes(n: int = 2, step: float = 31) -> None:
        for _ in range(n):
            c.run_pass()
            now[0] += step

    # ann's three sessions on a whole GPU each peaked at 1,500 MiB of 16,384: a quarter would do
    for _ in range(3):
        hub.spawn("ann", "1")
        passes()
        hub.stop_server("ann")
    hub.spawn("dan", "0.5")
    travel(hub, "dan", 3)
    passes()
    hub.stop_server("dan")
    travel_ended(hub, "dan", 4)  # dan held half a GPU from 7 h to 4 h ago
    for user, gpus, hours in (("ann", "1", 3), ("bob", "0.25", 5), ("cy", "1", 8)):
        hub.spawn(user, gpus)
        travel(hub, user, hours)
    now[0] = time.time() - 2 * 3600  # the culler's samples of the last two hours, one every 3 min
    passes(40, 180)
    job = hub.api(
        "POST",
        "/services/gpupool/api/jobs",
        {"project": "vision", "gpus": 1, "command": "true"},
        token=hub.user_token("cy"),
    )
    hub.wait_job(job["id"], {"succeeded"}, hub.user_token("cy"))

    with browser_page("usage-page") as page:
        # the spawn form tells ann first: her budget is used up, and a smaller size would do
        login(page, hub.url, "ann", PASSWORD)
        page.goto(f"{hub.url}/hub/spawn/ann/second")
        notes = page.locator(".gpupool-note")
        notes.first.wait_for(timeout=30_000)
        text = " ".join(notes.all_inner_texts())
        assert "GPU-hour budget:" in text and "the budget is used up" in text
        assert "A smaller size would do: your last 3 sessions on 1 GPU used at most 1,500 MiB" in text
        assert "0.25 GPU would do" in text
        shot(page, "usage-0-spawn-form")
    with browser_page("usage-page") as page:
        login(page, hub.url, "admin", ADMIN_PASSWORD)
        page.goto(f"{hub.url}/hub/gpupool")
        page.locator(".gpupool-usage-link a").click()
        page.wait_for_selector("table.gpupool-usage")
        assert page.evaluate("window.jhdata.base_url") == "/hub/"  # the hub's own page
        keys = page.locator("table.gpupool-usage tbody tr").evaluate_all(
            "rows => rows.map(r => r.dataset.key)"
        )
        assert set(keys) == {"ann", "bob", "cy", "dan"}
        assert keys[0] == "ann"  # sorted by waste: a whole GPU for hours at 4 %
        wastes = [
            float(x)
            for x in page.locator("table.gpupool-usage td.gpupool-waste").evaluate_all(
                "cells => cells.map(c => c.dataset.value)"
            )
        ]
        assert wastes == sorted(wastes, reverse=True)
        shot(page, "usage-1-page")
        page.screenshot(
            path=str(ARTIFACTS / "usage-page-full.png"), full_page=True
        )  # docs/images/usage-page.png
        # sorted by another column with a click, largest first
        page.locator("table.gpupool-usage th", has_text="GPU-h allocated").click()
        first = page.locator("table.gpupool-usage tbody tr").first
        assert first.get_attribute("data-key") == "cy"  # a whole GPU for 8 h
        # GPU-h as every screen shows them (format_gpu_hours: "8", "8.01", never "8.00"); her
        # server still runs, so the real minutes since the travel count too (36 s is 8.01)
        assert re.match(r"cy\s+8(\.0[1-9])?\s", first.inner_text())
        bands = page.locator("svg.gpupool-usage-plot polygon.band").evaluate_all(
            "p => p.map(x => x.dataset.key)"
        )
        assert set(bands) == {"ann", "bob", "cy", "dan"}
        assert "cost" in page.inner_text("table.gpupool-usage thead") and "EUR" in page.inner_text(
            ".gpupool-usage-span"
        )
        over = page.inner_text("table.gpupool-over-requesters")
        assert over.split("\n")[1].startswith(
            "bob\t200 / 4,096 MiB (5 %)"
        )  # the lowest peak against the share first
        assert "ann\t1,500 / 16,384 MiB (9 %)" in over
        assert "1 GPU\t0.25 GPU" in page.inner_text("table.gpupool-rightsizing")
        assert "vision" in page.inner_text("table.gpupool-waits")
        budgets = page.locator("table.gpupool-budgets tr[data-user='ann']")
        assert "over" in budgets.inner_text()
        page.locator("table.gpupool-over-requesters").scroll_into_view_if_needed()
        shot(page, "usage-2-over-requesters-and-budgets")

        # by group, over the last 7 days
        page.select_option("#gp-by", "group")
        page.select_option("#gp-period", "7d")
        page.get_by_role("button", name="Show").click()
        page.wait_for_url("**by=group**")
        keys = page.locator("table.gpupool-usage tbody tr").evaluate_all(
            "rows => rows.map(r => r.dataset.key)"
        )
        assert set(keys) == {"students", "staff"}
        # a bad period is said, not a 500
        page.goto(f"{hub.url}/hub/gpupool/usage?from=2026-02-01&to=2026-01-01")
        assert "from must be before to" in page.inner_text(".gpupool-usage-error")

        # the admin tops ann up from the page: her budget has room again
        page.goto(f"{hub.url}/hub/gpupool/usage")
        form = page.locator("table.gpupool-budgets tr[data-user='ann'] form")
        form.locator("input").fill("10")
        form.get_by_role("button", name="Top up").click()
        form.locator(".gpupool-grant-result", has_text="saved").wait_for(timeout=10_000)
        page.wait_for_load_state()
        assert hub.api("GET", "/services/gpupool/api/budget?user=ann")["status"] in ("ok", "near")
        csv = page.evaluate("() => fetch('/hub/gpupool/usage.csv?period=24h&by=user').then(r => r.text())")
        assert csv.splitlines()[0].startswith("user,allocated_gpu_hours")
    with browser_page("usage-not-for-users") as page:
        login(page, hub.url, "bob", PASSWORD)
        assert page.goto(f"{hub.url}/hub/gpupool/usage").status == 403


def _group(hub: Hub, name: str) -> bool:
    import urllib.error

    try:
        hub.api("GET", f"/hub/api/groups/{name}")
        return True
    except urllib.error.HTTPError:
        return False


def test_a_budget_warning_in_jupyterlab(hub: Hub) -> None:
    hub.api("POST", "/hub/api/users/nea")
    if not _group(hub, "students"):
        hub.api("POST", "/hub/api/groups/students")
    hub.api("POST", "/hub/api/groups/students/users", {"users": ["nea"]})
    hub.spawn("nea", "0.25")
    travel(hub, "nea", 7)  # 0.25 GPU x 7 h = 1.75 of 2 GPU-h: near the limit
    with browser_page("lab-budget") as page:
        login(page, hub.url, "nea", PASSWORD)
        page.goto(f"{hub.url}/user/nea/lab")
        toast = page.locator(".Toastify__toast").filter(has_text="GPU-hour budget nearly used")
        toast.wait_for(timeout=90_000)
        assert "1.75 of 2 GPU-h (87 %). Over it, new work is refused." in toast.inner_text()
        page.wait_for_function(
            "document.querySelector('#jp-main-statusbar .gpupool-StatusItem')"
            "?.textContent.includes('budget 87 %')",
            timeout=30_000,
        )
        shot(page, "lab-5-budget-near")
        travel(hub, "nea", 2)  # 2.25 GPU-h: used up; the running server keeps running
        page.reload()
        over = page.locator(".Toastify__toast").filter(has_text="GPU-hour budget used up")
        over.wait_for(timeout=90_000)
        assert re.search(
            r"2\.25 of 2 GPU-h\. New work is refused until \w\w\w \d\d:\d\d; running work keeps running",
            over.inner_text(),
        ), over.inner_text()
        page.wait_for_function(
            "document.querySelector('#jp-main-statusbar .gpupool-StatusItem')"
            "?.textContent.includes('budget used up')",
            timeout=30_000,
        )
        # the tooltip has the whole story: the rule, the minimum share that still starts
        title = page.locator("#jp-main-statusbar .gpupool-StatusItem").get_attribute("title")
        assert "except workspaces of at most 0.1 GPU" in title
        shot(page, "lab-6-budget-used-up")
    assert hub.api("GET", "/hub/api/users/nea")["servers"][""]["ready"]
