"""The hub's record of hibernated sessions (gpupool.api.hibernation): sizes as the save reported
them, bounded; what %gpupool, the home page and the admin page say; retention's warning before a
state is deleted — time travelled with injected clocks."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpupool.api import hibernation as hib
from gpupool.store import Store

DAY = 86400.0
NOW = 1_780_300_000.0


@pytest.fixture
def store(store_url: str) -> Store:
    """On SQLite and on PostgreSQL (tests/conftest.py's store_url)."""
    return Store(store_url)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ([], "must be an object"),
        ({"bytes": True}, "bytes must be a whole number"),
        ({"bytes": -1}, "bytes must be a whole number"),
        ({"bytes": 1 << 51}, "bytes must be a whole number"),
        ({"bytes": 1.5}, "bytes must be a whole number"),
        ({"kernels": 10**6}, "kernels must be a whole number"),
        ({"notebooks": "a.ipynb"}, "notebooks must be a list"),
        ({"notebooks": [1]}, "notebooks must be a list"),
        ({"notebooks": ["x"] * 1001}, "at most 1000"),
    ],
)
def test_a_hostile_size_report_is_refused_with_the_reason(body: object, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        hib.parse_saved(body)


def test_names_are_cut_and_counted_within_bounds() -> None:
    saved = hib.parse_saved(
        {"bytes": 5, "kernels": 2, "notebooks": ["0" + "n" * 10_000, *map(str, range(80))]}
    )
    assert saved["bytes"] == 5 and saved["kernels"] == 2
    assert len(saved["notebooks"]) == hib.MAX_NOTEBOOKS and max(map(len, saved["notebooks"])) == 255


def test_the_culler_reports_the_size_the_server_saved_and_the_hub_checks_it() -> None:
    from gpupool.api.culler import parse_report
    from gpupool.vocab.hibernate_wire import answer_of, saved_summary

    answer = {
        "ok": False,
        "kernels": [
            {"ok": True, "bytes": 3 << 20, "notebook": "work/a.ipynb"},
            {"ok": True, "bytes": 1 << 20, "notebook": "b.ipynb"},
            {"ok": False, "error": "NameError: get_ipython"},  # an R kernel: not counted
        ],
    }
    saved = saved_summary(answer_of(answer)["kernels"])  # as the culler reads the server's answer
    assert saved == {"bytes": 4 << 20, "kernels": 2, "notebooks": ["b.ipynb", "work/a.ipynb"]}
    assert saved_summary(answer_of({"ok": False, "kernels": [{"ok": False}]})["kernels"]) is None
    cull = {"kind": "cull", "owner": "ada", "name": "", "message": "m", "reason": "r", "hibernated": saved}
    _, _, events = parse_report({"events": [cull]}, NOW)
    assert events[0]["hibernated"]["bytes"] == 4 << 20
    with pytest.raises(ValueError, match=r"events\[0\]\.hibernated\.bytes"):
        parse_report({"events": [{**cull, "hibernated": {"bytes": "4 GiB"}}]}, NOW)
    with pytest.raises(ValueError, match="only a cull hibernates"):
        parse_report({"events": [{**cull, "kind": "warn"}]}, NOW)


def test_retention_warns_days_before_and_the_record_goes_with_the_state(store: Store) -> None:
    hib.record(store, "ada", "", {"bytes": 7 << 20, "kernels": 1, "notebooks": ["a.ipynb"]}, "culler", NOW)
    hib.record(store, "bob", "big", {"bytes": 1 << 30, "kernels": 2, "notebooks": []}, "user", NOW + DAY)
    rows = hib.records(store, "ada")
    assert [r["owner"] for r in rows] == ["ada"]  # a user's own only
    assert hib.with_expiry(rows[0], 14)["expires"] == NOW + 14 * DAY
    assert hib.with_expiry(rows[0], 0)["expires"] is None  # no retention: kept until woken
    assert hib.retention_warnings(rows, 14, NOW + 10 * DAY) == []  # not yet
    [warning] = hib.retention_warnings(rows, 14, NOW + 12 * DAY)
    assert warning["message"].startswith("your hibernated variables of a.ipynb are deleted after ")
    assert hib._date(NOW + 14 * DAY) in warning["message"]
    assert "kept until" in hib.hibernated_text(rows[0], 14)
    assert "the idle culler hibernated it, 7 MiB" in hib.hibernated_text(rows[0], 14)
    assert hib.prune(store, 14, NOW + 14.5 * DAY) == ["hibernated:ada/"]  # bob's is younger
    assert [r["owner"] for r in hib.records(store)] == ["bob"]


def test_home_page_says_a_user_hibernated_server_and_warns_before_retention(store: Store) -> None:
    from gpupool.api.auth import Directory
    from gpupool.api.services import ApiServices
    from gpupool.api.warnings import retention_for, stops_for
    from gpupool.vocab.kinds import EventKind

    store.record(EventKind.HIBERNATE, "ada/ hibernated by its user", owner="ada", name="")
    hib.record(store, "ada", "", {"bytes": 1, "kernels": 1, "notebooks": ["a.ipynb"]}, "user", NOW)
    services = ApiServices(SimpleNamespace(store=store), Directory(), hibernate_keep_days=14.0)
    root = SimpleNamespace(api_services=services, pool=services.pool)
    ada = SimpleNamespace(name="ada")
    at = store.events(owner="ada")[0].time.replace(tzinfo=dt.UTC).timestamp()
    [said] = stops_for(root, ada, now=at + 60)
    assert said["message"].startswith("hibernated at ") and said["message"].endswith(
        "(you asked) — your variables come back when you start"
    )
    assert retention_for(root, ada, now=NOW + DAY) == []
    [warned] = retention_for(root, ada, now=NOW + 13 * DAY)
    assert "your hibernated variables of a.ipynb are deleted after" in warned["message"]


def test_gpupool_magic_shows_when_it_was_hibernated_and_the_warning() -> None:
    from gpupool.widgets.status import hibernated_rows

    row = {"owner": "ada", "name": "", "by": "culler", "at": NOW, "bytes": 3 << 20}
    answer = {
        "hibernated": [{**row, "message": hib.hibernated_text(row, 14)}],
        "warnings": hib.retention_warnings([{**row, "notebooks": ["a.ipynb"]}], 14, NOW + 12 * DAY),
    }
    rows = dict(hibernated_rows(answer, "gpu"))
    assert "your variables come back when you start it" in rows["Hibernated: default server"]
    assert "a.ipynb are deleted after" in rows["Deleted soon: default server"]
    assert hibernated_rows(None, "") == []


def test_gpupool_hibernate_records_its_size_in_the_hub(tmp_path: Path, monkeypatch) -> None:
    from gpupool.gpu import hibernate as h

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("JPY_SESSION_NAME", "a.ipynb")
    env = {
        "JUPYTERHUB_SERVICE_URL": "http://127.0.0.1:9/user/ada/",
        "JUPYTERHUB_API_TOKEN": "t",
        "JUPYTERHUB_SERVER_NAME": "gpu",
        "GPUPOOL_API_URL": "http://127.0.0.1:9/services/gpupool/",
    }
    shell = SimpleNamespace(user_ns={"x": list(range(1000))}, user_ns_hidden={})
    asked: list[str] = []
    recorded: list[dict] = []

    def post(path, body, environ, timeout):
        asked.append(path)
        return {"ok": True, "kernels": [{"ok": True, "bytes": 5, "notebook": "b.ipynb"}]}

    said: list[str] = []
    assert h.hibernate_now(shell, env, post, said.append, lambda body, environ: recorded.append(body))
    [body] = recorded
    assert body["server"] == "gpu" and body["hibernated"]["kernels"] == 2
    assert body["hibernated"]["notebooks"] == ["a.ipynb", "b.ipynb"]
    mine = h.read_manifest(h.kernel_folder())[1]["bytes"]  # type: ignore[index]
    assert body["hibernated"]["bytes"] == mine + 5 and mine > 1000
    assert hib.parse_saved(body["hibernated"]) == body["hibernated"]  # what the hub accepts
    assert asked[-1] == "api/shutdown"

    def down(body, environ):
        raise OSError("connection refused")

    said.clear()
    asked.clear()
    assert h.hibernate_now(shell, env, post, said.append, down)  # saved: still stops
    assert "did not record" in said[-1] and asked[-1] == "api/shutdown"
    assert os.environ.get("JPY_SESSION_NAME") == "a.ipynb"


def test_the_admin_page_lists_hibernated_sessions_with_their_sizes(store: Store) -> None:
    from gpupool.admin.view import hibernated

    hib.record(store, "ada", "", {"bytes": 3 << 20, "kernels": 1, "notebooks": ["a.ipynb"]}, "culler", NOW)
    pool = SimpleNamespace(store=store)
    [row] = hibernated(pool, 14)  # type: ignore[arg-type]
    assert row["owner"] == "ada" and row["name"] == "default" and row["size"] == "3.0 MiB"
    assert row["by"] == "the idle culler" and row["notebooks"] == "a.ipynb"
    assert row["expires"].startswith(dt.datetime.fromtimestamp(NOW + 14 * DAY).strftime("%Y-%m-%d"))
    assert hibernated(pool, 0)[0]["expires"] == "kept until woken"  # type: ignore[arg-type]


def test_the_home_pages_hibernate_now_links_to_the_servers_own_page() -> None:
    from gpupool.api.warnings import hibernate_url

    ada = SimpleNamespace(name="ada b", spawners={})
    assert hibernate_url(ada, "", "/jh") == "/jh/user/ada%20b/gpupool/hibernate-now"
    assert hibernate_url(ada, "gpu", "") == "/user/ada%20b/gpu/gpupool/hibernate-now"
    running = SimpleNamespace(server=SimpleNamespace(base_url="/jh/user/ada/gpu/"))
    assert hibernate_url(SimpleNamespace(name="ada", spawners={"gpu": running}), "gpu") == (
        "/jh/user/ada/gpu/gpupool/hibernate-now"
    )


def test_hibernation_is_available_only_where_the_culler_hibernates_that_group_or_profile() -> None:
    from gpupool.api.auth import Directory
    from gpupool.api.hibernation import available
    from gpupool.api.services import ApiServices
    from gpupool.idle_culler.config import IdleCuller

    culler = IdleCuller(
        group_overrides={"keepers": {"hibernate": True}}, profile_overrides={"big": {"hibernate": True}}
    )
    services = ApiServices(SimpleNamespace(), Directory(), hibernates=culler.hibernates_for())
    profiled = SimpleNamespace(culler_profile=lambda: "big")
    assert available(services, ["keepers"], None)
    assert not available(services, ["students"], None)  # off by default: JupyterLab offers nothing
    assert available(services, ["students"], profiled)  # the server's own profile turns it on
    assert available(
        ApiServices(SimpleNamespace(), Directory(), hibernates=IdleCuller(hibernate=True).hibernates_for()),
        [],
        None,
    )
    assert not available(ApiServices(SimpleNamespace(), Directory()), ["keepers"], None)  # no rules: off
