"""What the JupyterLab status item (and %gpupool) says about a workspace, from the API's answers."""

from __future__ import annotations

import time

from gpupool.widgets.summary import summary

ME = {"name": "ann"}
POOL = {
    "gpus": [
        {
            "index": 1,
            "model": "A100",
            "virtual": False,
            "memory_mib": 40960,
            "shares": [
                {"owner": "ann", "name": "", "kind": "build", "milli": 250},
                {"owner": "ann", "name": "other", "kind": "build", "milli": 500},
                {"owner": "bob", "name": "", "kind": "build", "milli": 250},
            ],
        },
    ]
}
NOW = time.mktime((2026, 11, 23, 17, 0, 0, 0, 0, -1))


def test_share_time_left_and_reason_in_plain_words() -> None:
    culler = {
        "workspaces": [
            {
                "owner": "ann",
                "name": "",
                "action": "keep",
                "reason": "workday-end",
                "cull_at": NOW + 3600,
                "gpu_util_pct": 12.0,
                "gpu_idle_s": 0,
                "extended": False,
            }
        ]
    }
    got = summary(ME, POOL, culler, "", NOW)
    assert got["share"] == "0.25" and not got["virtual"] and got["extendable"]
    assert got["lines"] == [
        "0.25 GPU of A100 #1 (10,240 MiB)",
        "GPU use 12 %",
        "GPU idle for 0 min",
        "stops at 18:00 (in 1 h) at the end of the workday",
    ]


def test_no_culler_data_yet_and_a_virtual_gpu_say_so() -> None:
    pool = {"gpus": [{**POOL["gpus"][0], "virtual": True}]}
    got = summary(ME, pool, None, "other", NOW)
    assert got["share"] == "0.5" and got["cull_at"] is None and not got["extendable"]
    assert "no GPU use data: virtual GPU" in got["lines"]


def test_a_warning_once_extended_or_about_memory_cannot_be_extended() -> None:
    base = {
        "owner": "ann",
        "name": "",
        "action": "warn",
        "cull_at": NOW + 300,
        "message": "will stop in 5 min",
    }
    assert summary(ME, POOL, {"workspaces": [{**base, "reason": "idle-gpu"}]}, "", NOW)["extendable"]
    assert not summary(ME, POOL, {"workspaces": [{**base, "reason": "idle-gpu", "extended": True}]}, "", NOW)[
        "extendable"
    ]
    assert not summary(ME, POOL, {"workspaces": [{**base, "reason": "memory"}]}, "", NOW)["extendable"]


def test_a_server_without_a_share() -> None:
    got = summary({"name": "cy"}, POOL, None, "", NOW)
    assert got["share"] == "" and got["lines"] == ["no GPU share: this server runs on CPU only"]


def test_right_after_extend_the_old_end_is_gone_and_extend_is_not_offered_again(tmp_path) -> None:
    """The session had a planned end (no warning yet). Before, right after Extend `%gpupool` and
    the status bar kept that old end and an enabled Extend until the culler's next pass."""
    from gpupool.api.auth import Directory
    from gpupool.api.culler import extend_workspace
    from gpupool.api.services import ApiServices
    from gpupool.widgets.status import culler_rows
    from tests.support.pools import make_pool

    pool = make_pool(tmp_path, 1)
    pool.reserve_build("ann", [], "", 250)
    now = time.time()
    services = ApiServices(pool, Directory())
    services.culler["workspaces"]["ann/"] = {
        "owner": "ann",
        "name": "",
        "action": "keep",
        "reason": "max-age",
        "cull_at": now + 600,
        "extended": False,
        "message": "",
    }
    extend_workspace(services, pool, "ann", "ann", "")
    culler = {"workspaces": list(services.culler["workspaces"].values())}
    rows = dict(culler_rows(culler, "ann", "", now))
    assert rows["Session"] == "extended once: the new end time comes with the idle culler's next pass"
    bar = summary({"name": "ann"}, {"gpus": []}, culler, "", now)
    assert not bar["extendable"] and bar["cull_at"] is None
