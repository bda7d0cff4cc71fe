"""The GPU pool admin page: the plot is a pure function; the page is JupyterHub's own page.html
around gpupool's tables, for hub admins only, and its actions (Cancel, quotas) work from it."""

from __future__ import annotations

import pytest

from gpupool.api.page import svg_plot
from tests.browser import browser_page, login, shot
from tests.hubtools import ADMIN_PASSWORD, PASSWORD, Hub

Q = "/services/gpupool/api/quotas"
QUOTA_CONFIG = "c.GPUPool.group_overrides = {'class-a': {'quota': 0.25}}\n"


@pytest.fixture(scope="module")
def quota_hub(tmp_path_factory: pytest.TempPathFactory):
    """One hub for the tests of the page's quota actions: each reads the quotas it starts from
    and asserts what it changed, so either may run first, alone or after the other."""
    from tests.conftest import require_chp

    require_chp()
    h = Hub(state=tmp_path_factory.mktemp("quotas"), extra_config=QUOTA_CONFIG, env={"GPUPOOL_CULLER": "0"})
    h.start()
    yield h
    h.cleanup()


def test_plot_draws_allocation_and_use_scaled_to_capacity() -> None:
    svg = svg_plot([(0, 1.0, 0.25), (60, 2.0, None), (120, 4.0, 1.0)], capacity=4)
    assert svg.count("<polyline") == 2 and "class='allocated'" in svg and "class='used'" in svg
    assert "last 120 s" in svg or "last 2 min" in svg
    # the allocation line ends at the top (4 of 4 GPUs), use at a quarter
    assert svg.split("class='allocated'")[1].split("points='")[1].split("'")[0].endswith("680.0,40.0")
    assert "no GPU utilization data" in svg_plot([(0, 1, None), (60, 1, None)], capacity=4)
    assert "Not enough samples" in svg_plot([(0, 1, None)], capacity=4)
    assert svg.count("class='time-tick'") == 5  # a time axis under the plot


def group_row(page, group: str):
    return page.locator("table.gpupool-groups tr", has=page.locator(f"form[data-group='{group}']"))


@pytest.mark.hub
@pytest.mark.browser
def test_admin_page_in_the_hubs_look_with_jobs_and_quotas(make_hub) -> None:
    hub: Hub = make_hub(
        "c.TrainPool.projects = {'vision': {'guarantee': 2, 'department': 'research'}}\n"
        "c.TrainPool.departments = {'research': {'guarantee': 3, 'limit': 4}}\n"
        "c.GPUPool.group_overrides = {'class-a': {'quota': 0.25}}\n"
        "c.GPUPool.group_totals = {'class-a': 2}\n"
        "c.IdleCuller.interval_s = 1\n"
    ).start()  # the culler's passes feed the plot
    hub.api("POST", "/hub/api/users/cara")
    hub.api("POST", "/hub/api/groups/class-a")
    hub.api("POST", "/hub/api/groups/class-a/users", {"users": ["cara"]})
    hub.spawn("uma", "0.5")
    hub.spawn("vic", "0.25")
    with browser_page("admin-page") as page:
        login(page, hub.url, "admin", ADMIN_PASSWORD)
        page.goto(f"{hub.url}/hub/gpupool")
        page.wait_for_selector("table.gpupool-gpus")
        # JupyterHub's own page.html: its navigation, user menu, theme toggle and page data
        assert page.evaluate("window.jhdata.base_url") == "/hub/"
        assert page.inner_text("#login_widget").startswith("admin")
        assert page.locator("#dark-theme-toggle").count() == 1
        nav = page.locator("#thenavbar")
        for link in ("Home", "Token", "Admin"):
            assert nav.get_by_role("link", name=link, exact=True).count() == 1
        assert nav.locator("a.nav-link.active").inner_text() == "GPU pool"
        text = page.inner_text("#gpupool-main")
        assert "uma (0.5 GPU, build)" in text and "vic (0.25 GPU, build)" in text
        assert "vision" in page.inner_text("table.gpupool-projects") and "research" in text
        assert page.inner_text("table.gpupool-departments").split("\n")[-1].split("\t")[:4] == [
            "research",
            "vision",
            "3 GPUs",
            "4 GPUs",
        ]
        for _ in range(60):  # a few culler passes
            if page.locator("svg.gpupool-plot").count():
                break
            page.wait_for_timeout(500)
            page.reload()
        points = page.locator("svg.gpupool-plot polyline.allocated").get_attribute("points").split()
        assert len(points) >= 2
        assert float(points[-1].split(",")[1]) == pytest.approx(
            220 - 40 - 0.75 / 4 * 140, abs=0.2
        )  # 0.75 GPU
        assert page.locator("svg.gpupool-plot text.time-tick").count() == 5  # a time axis

        # a job that cannot start: the table says why, and Cancel works from the page
        job = hub.api(
            "POST",
            "/services/gpupool/api/jobs",
            {"project": "vision", "gpus": 4, "command": "true"},
            token=hub.user_token("uma"),
        )
        page.reload()
        row = page.locator("table.gpupool-jobs tr", has_text=job["id"])
        assert (
            "waiting for GPUs: no node has 4 free GPUs; project vision uses 0 of its 2-GPU guarantee"
            in row.inner_text()
        )  # the workspaces hold parts of two GPUs
        shot(page, "admin-2-jobs")
        asked: list[str] = []  # Cancel asks first: an admin's slip must not end someone's job
        page.once("dialog", lambda d: (asked.append(d.message), d.accept()))
        row.get_by_role("button", name="Cancel").click()
        # the page reads itself again: no reload
        page.locator("table.gpupool-jobs tr", has_text=job["id"]).filter(has_text="cancelled").wait_for(
            timeout=40_000
        )
        assert page.locator(".gpupool-action-error").count() == 0
        assert asked and asked[0].startswith(f"Cancel job {job['id']}"), asked
        assert hub.api("GET", f"/services/gpupool/api/jobs/{job['id']}")["state"] == "cancelled"

        # the default quota: a bad value is refused with the reason, a good one is stored
        form = page.locator("form.gpupool-quota[data-kind='default']")
        form.locator("input").fill("-1")
        form.get_by_role("button", name="Save").click()
        form.locator(".gpupool-quota-result", has_text="cannot be negative").wait_for(timeout=10_000)
        assert hub.api("GET", Q)["quotas"]["default_build_quota"] == 1.0
        form.locator("input").fill("2")
        form.get_by_role("button", name="Save").click()
        form.locator(".gpupool-quota-result", has_text="saved").wait_for(timeout=10_000)
        assert hub.api("GET", Q)["quotas"]["default_build_quota"] == 2

        # the hub's XSRF check guards the page's actions: a post from elsewhere changes nothing
        status = page.evaluate("""() => fetch('/hub/gpupool/quotas', {method: 'POST',
            body: JSON.stringify({default_build_quota: 8})}).then(r => r.status)""")
        assert status == 403 and hub.api("GET", Q)["quotas"]["default_build_quota"] == 2

        # a class's quota: cara (class-a, 0.25 GPU each) cannot take 0.5 GPU ...
        status, message = hub.api_error("POST", "/hub/api/users/cara/server", {"gpus": 0.5})
        assert status == 403 and "your build quota is 0.25 GPU" in message
        row = group_row(page, "class-a")
        assert row.locator(".gpupool-group-quota").inner_text() == "0.25 GPU"
        assert (
            row.locator(".gpupool-group-use").inner_text().strip() == "0 GPU of 2 GPUs"
        )  # the class's total
        # ... a bad value is refused in the page and stores nothing ...
        quota = row.locator("form[data-kind='quota']")
        quota.locator("input").fill("-1")
        quota.get_by_role("button", name="Save").click()
        quota.locator(".gpupool-quota-result.text-danger", has_text="cannot be negative").wait_for(
            timeout=10_000
        )
        assert hub.api("GET", Q)["quotas"]["group_overrides"] == {"class-a": {"quota": 0.25}}
        quota.locator("input").fill("0.3x")
        quota.get_by_role("button", name="Save").click()
        quota.locator(
            ".gpupool-quota-result",
            has_text="must be an amount of GPUs such as 0.25, 1 or 2; '0.3x' is not one",
        ).wait_for(timeout=10_000)
        # ... the admin gives the class 0.5 GPU each, and cara's next spawn gets it
        quota.locator("input").fill("0.5")
        quota.get_by_role("button", name="Save").click()
        quota.locator(".gpupool-quota-result", has_text="saved").wait_for(timeout=10_000)
        assert hub.api("GET", Q)["quotas"]["group_overrides"] == {"class-a": {"quota": 0.5}}
        hub.spawn("cara", "0.5")
        group_row(page, "class-a").locator(".gpupool-group-use", has_text="0.5 GPU of 2 GPUs").wait_for(
            timeout=20_000
        )  # the page refreshed itself
        assert group_row(page, "class-a").locator(".gpupool-group-quota").inner_text() == "0.5 GPU"
        assert "admin set group class-a's build quota to 0.5 GPU" in page.inner_text("table.gpupool-events")
        # the class's total is set on the page too, and a new row takes a quota and a total
        total = group_row(page, "class-a").locator("form[data-kind='total']")
        total.locator("input").fill("3")
        total.get_by_role("button", name="Save").click()
        total.locator(".gpupool-quota-result", has_text="saved").wait_for(timeout=10_000)
        group_row(page, "class-a").locator(".gpupool-group-use", has_text="0.5 GPU of 3 GPUs").wait_for(
            timeout=20_000
        )
        new = page.locator("form.gpupool-quota[data-kind='new']")
        new.locator("input[name='group']").fill("cs 101!")
        new.locator("input[name='quota']").fill("0.25")
        new.get_by_role("button", name="Add").click()
        new.locator(".gpupool-quota-result.text-danger", has_text="no spaces").wait_for(timeout=10_000)
        new.locator("input[name='group']").fill("cs101")
        new.locator("input[name='total']").fill("2")
        new.get_by_role("button", name="Add").click()
        new.locator(".gpupool-quota-result", has_text="saved").wait_for(timeout=10_000)
        group_row(page, "cs101").locator(".gpupool-group-use", has_text="0 GPU of 2 GPUs").wait_for(
            timeout=20_000
        )
        assert hub.api("GET", Q)["quotas"]["group_totals"] == {"class-a": 3, "cs101": 2}
        page.locator("table.gpupool-groups").scroll_into_view_if_needed()
        shot(page, "admin-3-quotas")
        page.evaluate("window.scrollTo(0, 0)")
        shot(page, "admin-1-page")

        # linked from JupyterHub's admin page; the service's address leads here too
        page.goto(f"{hub.url}/hub/admin")
        page.locator(".gpupool-admin-link a").click()
        page.wait_for_selector("table.gpupool-gpus")
        page.goto(f"{hub.url}/services/gpupool/")
        page.wait_for_selector("table.gpupool-gpus")
        assert page.url == f"{hub.url}/hub/gpupool"
    with browser_page("user-page") as page:
        login(page, hub.url, "uma", PASSWORD)
        response = page.goto(f"{hub.url}/hub/gpupool")
        assert response.status == 403
        assert page.locator("table.gpupool-gpus").count() == 0
        assert "for hub admins" in page.inner_text("body")
        shot(page, "admin-4-not-for-users")
        # nor can a user change a quota from a page of their own, even with the hub's XSRF token
        status = page.evaluate("""() => fetch('/hub/gpupool/quotas', {method: 'POST',
            headers: {'X-XSRFToken': window.jhdata.xsrf_token}, body: JSON.stringify({default_build_quota: 8})})
            .then(r => r.status)""")
        assert status == 403 and hub.api("GET", Q)["quotas"]["default_build_quota"] == 2
        page.goto(f"{hub.url}/services/gpupool/")  # the Services menu's link: a user's shares are at home
        page.wait_for_url("**/hub/home")


def test_admin_actions_answer_hostile_bodies_with_a_4xx_and_change_nothing(quota_hub: Hub) -> None:
    """The page's actions parse their body as the gpupool API does: bounded in size and depth
    (a nesting bomb once made Python's parser raise RecursionError: a 500). Sent as the page
    sends them: the admin's login cookie and the hub's XSRF token."""
    import http.cookiejar
    import json
    import re
    import urllib.error
    import urllib.parse
    import urllib.request

    hub = quota_hub
    before = hub.api("GET", Q)["quotas"]
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    with opener.open(f"{hub.url}/hub/login", timeout=30) as r:
        token = re.search(r'name="_xsrf" value="([^"]+)"', r.read().decode()).group(1)
    form = urllib.parse.urlencode({"username": "admin", "password": ADMIN_PASSWORD, "_xsrf": token}).encode()
    opener.open(f"{hub.url}/hub/login", data=form, timeout=30).close()
    xsrf = next(c.value for c in jar if c.name == "_xsrf")

    def post(raw: bytes) -> tuple[int, str]:
        req = urllib.request.Request(
            f"{hub.url}/hub/gpupool/quotas", data=raw, method="POST", headers={"X-XSRFToken": xsrf}
        )
        try:
            with opener.open(req, timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read()).get("message", "")

    assert post(b'{"default_build_quota": 2}')[0] == 200  # the session reaches the action: a change is saved
    assert post(b"[" * 1500 + b"]" * 1500) == (400, "body is nested deeper than 32 levels")
    assert post(b'{"group": "class-a", "quota": ' + b"[" * 40 + b"]" * 40 + b"}")[0] == 400
    assert post(b"{not json")[0] == 400 and post(b"[1, 2]")[0] == 400
    assert post(b'{"default_build_quota": "' + b"9" * 5000 + b'"}')[0] == 413
    assert hub.api("GET", Q)["quotas"] == {**before, "default_build_quota": 2}


def admin_poster(hub: Hub):
    """POST to the page's actions as the page does: the admin's login cookie and the hub's XSRF
    token; returns (status, JSON answer)."""
    import http.cookiejar
    import json
    import re
    import urllib.error
    import urllib.parse
    import urllib.request

    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    with opener.open(f"{hub.url}/hub/login", timeout=30) as r:
        token = re.search(r'name="_xsrf" value="([^"]+)"', r.read().decode()).group(1)
    form = urllib.parse.urlencode({"username": "admin", "password": ADMIN_PASSWORD, "_xsrf": token}).encode()
    opener.open(f"{hub.url}/hub/login", data=form, timeout=30).close()
    xsrf = next(c.value for c in jar if c.name == "_xsrf")

    def post(body: dict) -> tuple[int, dict]:
        req = urllib.request.Request(
            f"{hub.url}/hub/gpupool/quotas",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"X-XSRFToken": xsrf},
        )
        try:
            with opener.open(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    return post


@pytest.mark.hub
def test_the_pages_quota_actions_check_names_and_amounts_set_totals_and_remove_rows(quota_hub: Hub) -> None:
    """Group names and amounts are checked and refused in plain words (before: 'cs 101!' was kept
    as a group, '0.3x' got a traitlets message, a default of 0 was saved without a word); a
    class's total is set and a group's row removed from the page."""
    hub = quota_hub
    post = admin_poster(hub)
    status, answer = post({"group": "cs 101!", "quota": 0.5})
    assert status == 400 and "no spaces" in answer["message"] and "'cs 101!'" in answer["message"]
    status, answer = post({"default_build_quota": "0.3x"})
    assert (status, answer["message"]) == (
        400,
        "the default build quota must be an amount of GPUs such as 0.25, 1 or 2; '0.3x' is not one",
    )
    status, answer = post({"group": "class-a", "quota": "lots"})
    assert (
        status == 400 and "the build quota of group 'class-a' must be an amount of GPUs" in answer["message"]
    )
    assert hub.api("GET", Q)["quotas"]["group_overrides"] == {"class-a": {"quota": 0.25}}  # nothing stored

    status, answer = post({"default_build_quota": 0})  # allowed (only groups get GPUs), never silently
    assert status == 200 and answer["notes"] == [
        "the default build quota is 0: users in no group with a quota of its own cannot start a GPU workspace"
    ]
    hub.api("POST", "/hub/api/users/zed")
    status, message = hub.api_error("POST", "/hub/api/users/zed/server", {"gpus": 0.25})
    assert status == 403 and "your build quota is 0 GPU" in message

    assert post({"group": "class-a", "total": "2"}) == (
        200,
        {
            "saved": True,
            "notes": [
                "the default build quota is 0: users in no group with a quota of its own cannot start a GPU workspace"
            ],
        },
    )
    assert hub.api("GET", Q)["quotas"]["group_totals"] == {"class-a": 2}
    assert post({"group": "class-a", "total": ""})[0] == 200  # no ceiling any more
    assert hub.api("GET", Q)["quotas"]["group_totals"] == {}
    assert post({"group": "class-a", "remove": True})[0] == 200
    quotas = hub.api("GET", Q)["quotas"]
    assert quotas["group_overrides"] == {} and quotas["group_totals"] == {}
    status, message = hub.api_error("PUT", Q, {"group_totals": {"cs 101!": 1}})  # the API checks names too
    assert status == 400 and "no spaces" in message
