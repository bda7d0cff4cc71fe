"""The JupyterLab extension (widgets/labextension) in a real single-user server: the status bar
shows the GPU share and the time left, the culler's warning arrives as a JupyterLab notification
whose Extend button extends the session; Notebook 7 shows the same item in its top bar.
The culler runs for real, its clock travelled; GPU use comes from a file standing in for NVML."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from gpupool.idle_culler.config import IdleCuller
from gpupool.idle_culler.sampler import FileSampler
from gpupool.idle_culler.service import Client, Culler
from tests.browser import browser_page, login, shot
from tests.hubtools import PASSWORD, Hub, WebUser
from tests.support.wait import until
from tests.test_culler_hub import CONFIG, TOKEN, run_cell

pytestmark = [pytest.mark.browser, pytest.mark.hub]


def culler_for(hub: Hub, samples: Path, now: list[float]) -> Culler:
    cfg = IdleCuller(sampler="file", idle_limit_s=1800, jupyter_idle_s=600, warn_before_s=600, window_s=30)
    return Culler(
        cfg,
        Client(TOKEN),
        f"{hub.url}/hub/api",
        f"http://127.0.0.1:{hub.api_port}/services/gpupool/",
        FileSampler(str(samples)),
        clock=lambda: now[0],
    )


def test_status_bar_shows_the_share_and_the_cull_warning_extends_from_jupyterlab(make_hub, tmp_path) -> None:
    # hibernation on for everyone (c.IdleCuller.hibernate): "Hibernate now" is offered and accepted
    hub: Hub = make_hub(CONFIG + "c.IdleCuller.hibernate = True\n", env={"GPUPOOL_CULLER": "0"}).start()
    hub.spawn("lena", "0.25")
    samples = tmp_path / "samples.json"
    samples.write_text(json.dumps({"lena/": {"util_pct": 0}}))
    now = [time.time()]
    culler = culler_for(hub, samples, now)
    assert culler.run_pass()["events"] == []
    with browser_page("lab-status") as page:
        login(page, hub.url, "lena", PASSWORD)
        # every text the status item shows, from the page's first moment
        page.add_init_script("""window.__gpupoolTexts = [];
            setInterval(() => { const t = document.querySelector('.gpupool-StatusItem')?.textContent;
                                if (t && window.__gpupoolTexts.at(-1) !== t) { window.__gpupoolTexts.push(t); } }, 20);""")
        page.goto(f"{hub.url}/user/lena/lab")
        item = page.locator("#jp-main-statusbar .gpupool-StatusItem")
        item.wait_for(timeout=90_000)
        page.wait_for_function(
            "document.querySelector('.gpupool-StatusItem')?.textContent.includes('left')", timeout=30_000
        )
        # "GPU …" while it reads, never "GPU ?" (no answer); and once the share shows, it stays (the
        # status bar's own layout once blanked it to "GPU ?" until the next read, 20 s later)
        page.wait_for_timeout(3_000)
        texts = page.evaluate("window.__gpupoolTexts")
        shown = next(i for i, t in enumerate(texts) if t.startswith("GPU 0.25"))
        assert "GPU ?" not in texts and all(t.startswith("GPU 0.25") for t in texts[shown:]), texts
        text = item.inner_text()
        assert text.startswith("GPU 0.25 · ") and text.endswith(" left"), text
        # its words on the same line as its neighbours' (they sat higher): each status item's text
        # measured where it is drawn, its vertical middle
        middles = page.evaluate("""() => [...document.querySelectorAll('#jp-main-statusbar .jp-StatusBar-Item')]
            .map(item => {
                const walk = document.createTreeWalker(item, NodeFilter.SHOW_TEXT);
                let node = walk.nextNode();
                while (node && !node.textContent.trim()) { node = walk.nextNode(); }
                if (!node || !item.offsetParent) { return null; }
                const range = document.createRange();
                range.selectNodeContents(node);
                const box = range.getBoundingClientRect();
                return [item.classList.contains('gpupool-StatusItem'), box.top + box.height / 2];
            }).filter(Boolean)""")
        ours = [m for gpupool, m in middles if gpupool]
        others = [m for gpupool, m in middles if not gpupool]
        assert len(ours) == 1 and others, middles
        assert all(abs(ours[0] - m) <= 1 for m in others), middles
        title = item.get_attribute("title")
        assert (
            "0.25 GPU of virtual GPU" in title and "no GPU use data: virtual GPU" not in title
        )  # sampled: 0 %
        assert "GPU use 0 %" in title and "if its GPU stays idle" in title
        assert "Click to hibernate this server now" in title  # hibernation is on on this hub
        shot(page, "lab-1-status-bar")

        # the user's own lead time (Settings → gpupool): warned 45 min ahead of the 30 min left
        hub.api(
            "PUT",
            "/user/lena/lab/api/settings/gpupool-lab:plugin",
            {"raw": '{"warnMinutesBefore": 45, "pollSeconds": 5}'},
            token=hub.user_token("lena"),
        )
        page.reload()
        early = page.locator(".Toastify__toast").filter(has_text="if its GPU stays idle: save your work.")
        early.wait_for(timeout=60_000)
        assert "This server stops in 2" in early.inner_text()  # 29 or 28 min, on a busy machine

        now[0] += 22 * 60  # nobody touched the GPU or the notebook since: the culler warns
        assert [e["owner"] for e in culler.run_pass()["events"]] == ["lena"]
        page.reload()  # (the item polls by itself; a reload just saves the test the poll interval)
        toast = page.locator(".Toastify__toast").filter(has_text="will stop in 8 min")
        toast.wait_for(timeout=60_000)
        assert "because its GPU has been idle" in toast.inner_text()
        # the item turns to the warning too (a poll already in flight may land just after the toast, and
        # after a reload the notification can show before JupyterLab has attached its status bar)
        page.wait_for_function(
            "document.querySelector('#jp-main-statusbar .gpupool-StatusItem')?.dataset.action === 'warn'",
            timeout=30_000,
        )
        # the culler's next passes move the end time a few seconds: the same warning, one
        # notification, its words kept current (it was a new one at every poll: 12 in 3 minutes)
        warnings = page.locator(".Toastify__toast").filter(has_text="save your work")
        for _ in range(3):
            now[0] += 20
            culler.run_pass()
            page.wait_for_timeout(6_000)  # a poll (every 5 s here) reads each pass
        assert warnings.count() == 1, [t.inner_text() for t in warnings.all()]
        shot(page, "lab-2-cull-warning")
        warned = hub.api("GET", "/services/gpupool/api/culler/status")["workspaces"][0]
        warnings.first.get_by_role("button", name="Extend").click()
        page.locator(".Toastify__toast").filter(has_text="Extended").wait_for(timeout=30_000)
        warnings.first.wait_for(state="detached", timeout=30_000)  # it no longer applies: closed
        # the status item says the new time left at once (it reads again after Extend): the idle
        # end plus the 2 h extension, not the old end (the culler's clock runs ~22 min ahead of
        # the browser's: 2 h 2x-3x min), nor none until the culler's next pass
        page.wait_for_function(
            "/^GPU 0\\.25 · 2 h \\d+ min left$/.test(document.querySelector('.gpupool-StatusItem')?.textContent)",
            timeout=60_000,
        )
        assert "stops at" in page.locator("#jp-main-statusbar .gpupool-StatusItem").get_attribute("title")
        shot(page, "lab-3-extended")
        events = hub.api("GET", "/services/gpupool/api/events?kind=extend")["events"]
        assert [(e["kind"], e["owner"]) for e in events] == [("extend", "lena")]
        found = hub.api("GET", "/services/gpupool/api/culler/status")["workspaces"][0]
        assert found["extended"] and found["action"] == "keep"
        assert found["cull_at"] == warned["cull_at"] + 7200  # the culler's own extension (its default)
        # and the culler's next pass agrees (to its 30 s window: the GPU's idle time grows by windows)
        now[0] += 20
        [after] = culler.run_pass()["workspaces"]
        assert after["cull_at"] == pytest.approx(found["cull_at"], abs=30), after

        # "Hibernate now" from JupyterLab (a click on the item, confirmed): a kernel's variables
        # saved, the server stopped and the share freed, as the hub home page's button does
        notebook = {
            "path": "work.ipynb",
            "type": "notebook",
            "name": "work.ipynb",
            "kernel": {"name": "python3"},
        }
        hub.api("POST", "/user/lena/api/sessions", notebook, token=hub.user_token("lena"))
        item.click()
        page.locator(".jp-Dialog").get_by_role("button", name="Hibernate").click()
        said = page.locator(".Toastify__toast").filter(has_text="Hibernated 1 kernel")
        said.wait_for(timeout=120_000)
        assert "this server stops now" in said.inner_text(), said.inner_text()
        shot(page, "lab-3-hibernated-now")
    until(lambda: not hub.allocations(), "the share freed by JupyterLab's Hibernate now", timeout=60)
    [row] = hub.api("GET", "/services/gpupool/api/admin/hibernated")["hibernated"]
    assert (row["owner"], row["by"], row["kernels"]) == ("lena", "user", 1), row


def test_notebook_7_shows_the_share_in_its_top_bar(make_hub) -> None:
    # a hub whose admin set a longest session (there is none by default since #26), and idle
    # stops later than it: on a loaded machine the culler's GPU data went stale before the page
    # was read, and its fail-safe idle stop (30 min) came first in the status bar
    hub: Hub = make_hub("c.IdleCuller.max_age_s = 12 * 3600\nc.IdleCuller.idle_limit_s = 24 * 3600\n").start()
    hub.spawn("nico", "0.5")
    with browser_page("nb7-status") as page:
        login(page, hub.url, "nico", PASSWORD)
        page.goto(f"{hub.url}/user/nico/tree")
        item = page.locator("#gpupool-status")
        item.wait_for(timeout=90_000)
        page.wait_for_function(
            "document.querySelector('#gpupool-status')?.textContent.startsWith('GPU 0.5')", timeout=30_000
        )
        assert "no GPU use data: virtual GPU" in item.get_attribute("title")  # the culler has not sampled yet
        # ... yet the session's end is known from the spawn on (12 h here)
        assert re.search(
            r"stops at \d\d:\d\d \(in 1[12] h( \d+ min)?\) at the end of the longest session",
            item.get_attribute("title"),
        ), item.get_attribute("title")
        # hibernation is off on this hub (the default): no "Hibernate now" on the item, and a
        # click on it asks nothing
        assert "hibernate" not in item.get_attribute("title").lower()
        item.click()
        page.wait_for_timeout(1_000)  # a dialog would open at once: give it the chance to
        assert page.locator(".jp-Dialog").count() == 0
        shot(page, "lab-4-notebook7-top-bar")


def test_the_status_endpoint_answers_only_the_servers_user(make_hub) -> None:
    hub: Hub = make_hub().start()
    hub.spawn("omar", "0.25")
    mine = hub.api("GET", "/user/omar/gpupool/status", token=hub.user_token("omar"))
    assert mine["share"] == "0.25" and mine["virtual"] is True
    # hibernation is off on this hub (c.IdleCuller.hibernate's default): JupyterLab is told so
    # (it then offers no "Hibernate now"), and the server refuses it all the same, saving nothing
    # and stopping nothing; the hub refuses the record of one too
    assert mine["hibernate"] is False
    status, said = hub.api_error("POST", "/user/omar/gpupool/hibernate-now", token=hub.user_token("omar"))
    assert status == 403 and "Hibernation is off for your group" in said, (status, said)
    assert "Nothing was saved or stopped" in said, said
    # %gpupool hibernate in a notebook: the same answer, before it saves anything
    token = hub.user_token("omar")
    notebook = {"path": "w.ipynb", "type": "notebook", "name": "w.ipynb", "kernel": {"name": "python3"}}
    kernel = hub.api("POST", "/user/omar/api/sessions", notebook, token=token)["kernel"]["id"]
    said = run_cell(hub, "omar", kernel, "%load_ext gpupool\n%gpupool hibernate", token)
    assert "hibernation is off for your group" in said and "nothing was saved or stopped" in said, said
    assert [s["owner"] for s in hub.allocations()] == ["omar"]  # still running, its share held
    web = WebUser(hub.url, "omar")
    web.log_in(PASSWORD)
    status, _, home = web.get("/hub/home")
    # the home page shows the share with no "Hibernate now" link
    assert status == 200 and '"hibernate_url": "", "name": "", "share": "0.25 GPU"' in home, home[-3000:]
    hibernated = {"server": "", "hibernated": {"bytes": 1, "kernels": 1, "notebooks": []}}
    status, said = hub.api_error(
        "POST", "/services/gpupool/api/hibernated", hibernated, token=hub.user_token("omar")
    )
    assert status == 403 and "hibernation is off for your group" in said, (status, said)
    import urllib.error

    with pytest.raises(urllib.error.HTTPError) as err:
        hub.api("GET", "/user/omar/gpupool/status", token=hub.user_token("pia"))
    assert err.value.code in (403, 404)
