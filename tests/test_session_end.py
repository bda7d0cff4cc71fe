"""The time left is known from the spawn on: the culler's own time rules (maximum session length,
end of the workday) computed from the start, before the culler's first pass. Time is travelled."""

from __future__ import annotations

import datetime as dt
import re
import time
from pathlib import Path

import pytest

from gpupool.api.auth import Directory
from gpupool.api.culler import EXTENSION, extend_workspace, findings, parse_report, session_of
from gpupool.api.services import ApiServices
from gpupool.idle_culler.config import IdleCuller
from gpupool.idle_culler.policy import Limits, Workspace, deadlines, decide, extended_end, session_end
from gpupool.pool import BuildLimits
from gpupool.widgets.summary import summary
from tests.hubtools import PASSWORD, Hub
from tests.support.pools import make_pool
from tests.support.wait import until

UTC = dt.UTC


def at(hour: int, minute: int = 0, day: int = 23) -> float:
    return dt.datetime(2026, 11, day, hour, minute, tzinfo=UTC).timestamp()


def test_the_session_end_is_the_earliest_time_limit_from_the_start() -> None:
    limits = Limits(workday_end="18:00", timezone="UTC", max_age_s=12 * 3600, extension_s=7200)
    assert session_end(at(9), False, limits) == ("workday-end", at(18))
    assert session_end(at(9), True, limits) == ("workday-end", at(20))  # the one extension
    # started after the workday ended: the next one ends at 18:00 tomorrow, 12 h is sooner
    assert session_end(at(19), False, limits) == ("max-age", at(7, day=24))
    assert session_end(at(9), False, Limits(max_age_s=3600)) == ("max-age", at(10))
    # the culler enforces the same times: one rule, not two
    ws = Workspace("ann", "", started=at(9), last_activity=at(9), gpu_idle_s=None)
    assert deadlines(ws, at(9, 1), limits)["workday-end"] == at(18)


def test_the_culler_config_gives_each_user_their_end_or_none_when_exempt() -> None:
    end = IdleCuller(
        max_age_s=3600, exempt_users=["prof"], group_overrides={"night": {"max_age_s": 8 * 3600}}
    ).session_end()
    assert end("ann", (), False, "", at(9), False) == ("max-age", at(10))
    assert end("ann", ("night",), False, "", at(9), False) == ("max-age", at(17))
    assert end("prof", (), False, "", at(9), False) is None
    assert end("root", (), True, "", at(9), False) is None  # admins are exempt by default


def test_findings_hold_the_end_before_the_first_pass_and_pages_read_it(tmp_path: Path) -> None:
    pool = make_pool(tmp_path, 1, limits=BuildLimits(1000, (250, 500), 1000, 2))
    row = pool.reserve_build("ann", [], "", 250)
    other = pool.reserve_build("ann", [], "b", 250)
    started = row.created.replace(tzinfo=UTC).timestamp()
    services = ApiServices(
        pool, Directory(), session_end=IdleCuller(max_age_s=7200, extension_s=3600).session_end()
    )
    found = findings(services, pool)
    assert found["ann/"]["cull_at"] == started + 7200 and found["ann/"]["reason"] == "max-age"
    assert found["ann/b"]["planned"] is True

    # what %gpupool and the status bar make of it, an hour after the spawn
    me = {"name": "ann"}
    gpus = {
        "gpus": [
            {
                "index": 0,
                "virtual": True,
                "memory_mib": 16384,
                "shares": [{"owner": "ann", "name": "", "kind": "build", "milli": 250}],
            }
        ]
    }
    out = summary(me, gpus, {"workspaces": list(found.values())}, "", now=started + 3600)
    assert out["share"] == "0.25" and out["reason"] == "max-age"
    assert any(line.endswith("(in 1 h) at the end of the longest session allowed") for line in out["lines"])

    # an extension moves the end at once; the culler's own finding wins once it has one
    pool.store.put_setting(
        EXTENSION.format(owner="ann", name=""), {"session": session_of(None, "ann", "", row)}
    )
    services.culler = {
        "pass_time": started,
        "workspaces": {
            "ann/b": {
                "owner": "ann",
                "name": "b",
                "action": "warn",
                "reason": "idle-jupyter",
                "cull_at": started + 60,
            },
            "ann/": {"owner": "ann", "name": "", "action": "keep", "extended": True, "cull_at": None},
        },
    }
    found = findings(services, pool)
    assert found["ann/"]["cull_at"] == started + 7200 + 3600 and found["ann/"]["extended"] is True
    assert found["ann/b"] == services.culler["workspaces"]["ann/b"]
    assert other.id != row.id
    assert findings(ApiServices(pool, Directory()), pool) == {}  # no culler: no time limit to show


def test_right_after_extend_the_time_left_is_the_one_the_next_pass_gives(tmp_path: Path) -> None:
    """An idle GPU warned 10 min before its cull, in a hub whose sessions last 8 h: Extend gives
    the idle end plus the extension at once (the status bar said 8 h + 2 h left until the
    culler's next pass), the end that pass then reports."""
    pool = make_pool(tmp_path, 1, limits=BuildLimits(1000, (250, 500), 1000, 2))
    row = pool.reserve_build("ann", [], "", 250)
    started = row.created.replace(tzinfo=UTC).timestamp()
    cfg = IdleCuller(max_age_s=8 * 3600, extension_s=7200, idle_limit_s=1800, warn_before_s=900)
    limits = cfg.limits()
    now = started + 1500
    ws = Workspace("ann", "", started=started, last_activity=started, gpu_idle_s=1500)
    d = decide(ws, now, limits)
    assert (d.action, d.reason, d.cull_at) == ("warn", "idle-gpu", started + 1800)
    # the culler's report of that pass, as the hub keeps it
    _, found, _ = parse_report(
        {
            "pass_time": now,
            "workspaces": [
                {
                    "owner": "ann",
                    "name": "",
                    "action": d.action,
                    "reason": d.reason,
                    "cull_at": d.cull_at,
                    "message": d.message,
                    "gpu_idle_s": 1500,
                    "extended_cull_at": extended_end(ws, now, limits),
                }
            ],
        },
        now,
    )
    services = ApiServices(pool, Directory(), session_end=cfg.session_end())
    services.culler = {"pass_time": now, "workspaces": {"ann/": found[0]}}
    extend_workspace(services, pool, "ann", "ann", "")
    ann = findings(services, pool)["ann/"]
    assert ann["cull_at"] == started + 1800 + 7200  # not the 8 h limit + 2 h
    assert ann["extended"] is True and ann["action"] == "keep"
    # the culler's next pass, nothing else changed (the GPU idle 5 min more): the same end
    later = decide(Workspace("ann", "", started, started, 1800, extended=True), now + 300, limits)
    assert later.cull_at == ann["cull_at"]
    me = {"name": "ann"}
    gpus = {
        "gpus": [
            {
                "index": 0,
                "virtual": True,
                "memory_mib": 16384,
                "shares": [{"owner": "ann", "name": "", "kind": "build", "milli": 250}],
            }
        ]
    }
    bar = summary(me, gpus, {"workspaces": [ann]}, "", now=now)
    assert bar["cull_at"] == started + 9000 and not bar["extendable"]
    assert extended_end(Workspace("ann", "", started, started, 1500, extended=True), now, limits) is None


@pytest.mark.hub
@pytest.mark.browser
def test_time_left_shows_in_each_row_of_the_home_page_right_after_the_spawn(make_hub) -> None:
    from tests.browser import browser_page, login, shot

    # the culler's first pass came before these spawns; its next is an hour away
    hub: Hub = make_hub("c.IdleCuller.interval_s = 3600\nc.IdleCuller.max_age_s = 7200\n").start()
    before = time.time()
    hub.spawn("nina", "0.25", server="small")
    hub.spawn("nina", "0.5", server="big")
    after = time.time()
    status = hub.api("GET", "/services/gpupool/api/culler/status", token=hub.user_token("nina"))
    ends = {w["name"]: w for w in status["workspaces"]}
    assert set(ends) == {"small", "big"}
    for w in ends.values():
        assert w["reason"] == "max-age" and before - 5 + 7200 <= w["cull_at"] <= after + 7200
    with browser_page("home-shares") as page:
        login(page, hub.url, "nina", PASSWORD)
        page.goto(f"{hub.url}/hub/home")
        header = page.locator("table.server-table thead th").all_inner_texts()
        assert header[:3] == ["Server name", "GPU share", "Time left"]
        for name, share in (("small", "0.25 GPU"), ("big", "0.5 GPU")):
            row = page.locator(f"tr.home-server-row[data-server-name='{name}']")
            assert row.locator("td.gpupool-share").inner_text() == share
            assert re.fullmatch(
                r"stops at \d\d:\d\d \(in (1 h 5\d|2 h 0) min\)",
                row.locator("td.gpupool-time-left").inner_text(),
            ), row.inner_text()
            assert row.locator("a.stop-server").count() == 1  # the hub's own row, with its actions
        assert page.locator(".gpupool-default-share").count() == 0  # no default server running
        shot(page, "home-0-shares")
        # stopped from the page: its row no longer claims a share, without a reload
        small = page.locator("tr.home-server-row[data-server-name='small']")
        small.locator("a.stop-server").click()
        small.locator("td.gpupool-share", has_text="—").wait_for(timeout=60_000)
        assert small.locator("td.gpupool-time-left").inner_text() == ""
        # the share goes back once JupyterHub's stop reaches the spawner, which may be just after
        # the page says so (the page reads the hub's own record of the server)
        until(
            lambda: [s["name"] for s in hub.allocations()] == ["big"], "the stopped server's share to go back"
        )
