"""The culler as a traitlets Application (`python -m gpupool.idle_culler`, like
jupyterhub-idle-culler): the hub's settings, a config file and flags, in that order; and the
arbiter hook that may veto a decision. The hub's side is a stand-in (the calls a pass makes,
answered from a table); the culler that a real hub starts is tests/test_culler_hub.py."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from traitlets import TraitError
from traitlets.config import Config

from gpupool.idle_culler.app import CONFIG_ENV, CullerApp
from gpupool.idle_culler.config import IdleCuller
from gpupool.idle_culler.sampler import Target
from gpupool.idle_culler.service import Client, Culler

STARTED = "2026-11-23T08:00:00Z"
GROUPS = {"ann": ["exam"], "bob": ["cs101"]}


def app_for(argv: list[str], monkeypatch: pytest.MonkeyPatch, hub: dict | None = None) -> CullerApp:
    monkeypatch.setenv(CONFIG_ENV, json.dumps(hub or {}))
    app = CullerApp()
    app.initialize(argv)
    return app


def test_settings_come_from_the_hub_then_the_config_file_then_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "culler_config.py"
    conf.write_text("c.IdleCuller.idle_limit_s = 1200\nc.IdleCuller.sampler = 'nvml'\n")
    hub = IdleCuller(interval_s=60, idle_limit_s=100, sampler="file").as_dict()  # what the hub hands it
    app = app_for(
        [
            f"--config={conf}",
            "--sampler=node-agent",
            "--dry-run",
            "--once",
            "--gpupool-url=http://127.0.0.1:8095/services/gpupool/",
        ],
        monkeypatch,
        hub,
    )
    cfg = app.settings()
    assert (cfg.interval_s, cfg.idle_limit_s, cfg.sampler, cfg.dry_run) == (60, 1200, "node-agent", True)
    assert app.once and app.gpupool_url.endswith("/services/gpupool/")
    # a bad value stops it with the option and the value, wherever it came from
    conf.write_text("c.IdleCuller.workday_end = '25:99'\n")
    with pytest.raises(TraitError, match="IdleCuller.workday_end: '25:99' is not a time of day"):
        app_for([f"--config={conf}"], monkeypatch).settings()


def test_generate_config_lists_every_option_once_and_loads_back(monkeypatch, capsys) -> None:
    app = app_for(["--generate-config"], monkeypatch)
    assert app.run() == 0
    text = capsys.readouterr().out
    assert "# c.IdleCuller.arbiter = " in text and "# c.CullerApp.gpupool_url = " in text
    assert "c.IdleCuller.enabled" not in text  # the dead switch's old name is left out
    settings = [line.split(" = ")[0] for line in text.splitlines() if line.startswith("# c.")]
    assert len(settings) == len(set(settings))
    c = Config()
    exec(compile(text, "culler_config.py", "exec"), {"c": c, "get_config": lambda: c})
    IdleCuller(config=c).policy()


def target(owner: str, groups: list[str]) -> dict:
    return {
        "owner": owner,
        "name": "",
        "pid": None,
        "gpu_uuids": ["GPU-x"],
        "whole_gpus": False,
        "milli": 250,
        "memory_limit_mib": 0,
        "groups": groups,
        "admin": False,
        "extended": False,
    }


class Hub(Client):
    """GET the targets and the users, DELETE a server, POST the report: nothing else."""

    def __init__(self) -> None:
        super().__init__("token")
        self.deleted: list[str] = []
        self.report: dict | None = None
        self.targets: object = {"workspaces": [target(u, g) for u, g in GROUPS.items()]}

    def call(self, method, url, body=None, accept="application/json"):
        if url.endswith("api/culler/targets"):
            return self.targets
        if url.endswith("api/culler/report"):
            self.report = body
            return {"ok": True}
        if method == "DELETE":
            self.deleted.append(url.split("/users/")[1].split("/")[0])
            return None
        raise AssertionError(f"unexpected {method} {url}")

    def paginated(self, url, concurrency=1):
        return [
            {"name": u, "servers": {"": {"ready": True, "started": STARTED, "last_activity": STARTED}}}
            for u in GROUPS
        ]


class NoGPUData:
    def sample(self, targets: list[Target]) -> dict:
        return {}  # Jupyter activity decides: both sessions idle for days


asked: list[dict] = []


def keep_exam_takers(*, action: str, reason: str, workspace: dict) -> bool:
    asked.append({"action": action, "reason": reason, **workspace})
    return "exam" not in workspace["groups"]


def broken(*, action: str, reason: str, workspace: dict) -> bool:
    raise RuntimeError("the admin's hook has a bug")


async def keep_exam_takers_later(*, action: str, reason: str, workspace: dict) -> bool:
    """keep_exam_takers as an async hook: it awaits something before it answers."""
    await asyncio.sleep(0)
    asked.append({"action": action, "reason": reason, **workspace})
    return "exam" not in workspace["groups"]


def a_pass(arbiter: object, hub: Hub | None = None) -> tuple[Hub, dict]:
    hub = hub or Hub()
    # as the hub hands it over: an import path in JSON, imported by the culler's process
    cfg = IdleCuller(
        **json.loads(json.dumps(IdleCuller(sampler="file", concurrency=1, arbiter=arbiter).as_dict()))
    )
    culler = Culler(
        cfg,
        hub,
        "http://hub/hub/api",
        "http://hub/services/gpupool/",
        NoGPUData(),
        clock=lambda: time.time() + 30 * 86400,
    )
    try:
        return hub, culler.run_pass()
    finally:
        culler.close()


def test_the_arbiter_hook_keeps_what_it_vetoes_and_the_rest_is_culled() -> None:
    asked.clear()
    hub, result = a_pass(keep_exam_takers)
    assert hub.deleted == ["bob"]  # ann's exam session is kept, bob's is stopped
    assert {a["owner"]: a["action"] for a in asked} == {"ann": "cull", "bob": "cull"}
    assert asked[0]["reason"] and asked[0]["gpu_idle_s"] is None and asked[0]["admin"] is False
    kept = next(w for w in hub.report["workspaces"] if w["owner"] == "ann")
    assert kept["action"] == "keep" and "kept by the arbiter hook" in kept["message"]
    assert {e["owner"] for e in result["events"] if e["kind"] == "cull"} == {"bob"}


def test_an_async_arbiter_is_awaited_and_its_no_keeps_the_session() -> None:
    # as jupyterhub-idle-culler's cull_arbiter_hook may be: a coroutine function; its coroutine
    # object is truthy, so reading it as the answer would stop the exam session it keeps
    asked.clear()
    hub, _ = a_pass(keep_exam_takers_later)
    assert hub.deleted == ["bob"]
    assert {a["owner"] for a in asked} == {"ann", "bob"}
    kept = next(w for w in hub.report["workspaces"] if w["owner"] == "ann")
    assert kept["action"] == "keep" and "kept by the arbiter hook" in kept["message"]


def test_a_broken_arbiter_is_logged_and_the_decision_stands(caplog) -> None:
    with caplog.at_level("ERROR"):
        hub, _ = a_pass(broken)
    assert sorted(hub.deleted) == ["ann", "bob"]
    assert "the arbiter hook failed" in caplog.text


def test_an_arbiter_the_culler_cannot_import_is_refused_when_the_hub_reads_its_config() -> None:
    def local(**kwargs: object) -> bool:
        return True

    with pytest.raises(TraitError, match="cannot import"):
        IdleCuller(arbiter=local).as_dict()  # a function of jupyterhub_config.py: no path to it
    with pytest.raises(TraitError, match="cannot import 'nowhere.hook'"):
        IdleCuller(arbiter="nowhere.hook").arbiter_hook()


def test_a_target_the_culler_cannot_read_is_skipped_and_the_pass_goes_on(caplog) -> None:
    # a hub of another version, or a broken proxy: entries without a key, of the wrong type, out
    # of bounds; the well-formed ones are still judged, and each skipped one is logged
    hub = Hub()
    hostile: list[object] = [
        target("ann", ["exam"]),
        "not an object",
        {k: v for k, v in target("cat", []).items() if k != "gpu_uuids"},
        {**target("dan", []), "milli": "250"},
        {**target("eve", []), "groups": [1, 2]},
        {**target("fay", []), "owner": ""},
        {**target("gus", []), "pid": -4},
        {**target("hal", []), "gpu_uuids": ["GPU-x"] * 10_000},
        {**target("ivy", []), "admin": "yes"},
        target("bob", ["cs101"]),
    ]
    hub.targets = {"workspaces": hostile}
    with caplog.at_level("WARNING"):
        hub, result = a_pass("", hub)
    assert sorted(hub.deleted) == ["ann", "bob"]
    assert sorted(w["owner"] for w in result["workspaces"]) == ["ann", "bob"]
    assert caplog.text.count("skipping a target") == len(hostile) - 2


@pytest.mark.parametrize("body", [[], {"workspaces": {"ann": {}}}, {}, "ok"])
def test_a_targets_answer_that_is_no_list_fails_the_pass_and_reports_nothing(body: object) -> None:
    # the loop logs a ValueError and retries next pass; an empty report would clear the findings
    hub = Hub()
    hub.targets = body
    with pytest.raises(ValueError, match="api/culler/targets"):
        a_pass("", hub)
    assert hub.report is None and hub.deleted == []
