"""The status widget reads the real API with a user's own token."""

from __future__ import annotations

import pytest

from gpupool.widgets import Client, GPUPoolError, WorkspaceStatus
from gpupool.widgets.status import status_rows
from tests.hubtools import Hub
from tests.support.wait import until

pytestmark = pytest.mark.hub


def test_status_shows_this_workspace_share_and_quota(hub: Hub) -> None:
    hub.spawn("wanda", "0.5")
    hub.spawn("wanda", "0.25", server="side")
    client = Client(f"http://127.0.0.1:{hub.api_port}/services/gpupool/", hub.user_token("wanda"))
    rows = dict(status_rows(client.get("api/me"), client.get("api/pool"), {"CUDA_VISIBLE_DEVICES": "1"}))
    assert rows["Share"] == "0.5 GPU = 8,192 MiB of 16,384 MiB"
    assert rows["GPU"].startswith("virtual GPU #") and rows["GPU"].endswith(" on localhost")
    assert rows["Build quota"] == "0.75 GPU of 1 GPU in use (also: side 0.25 GPU)"

    widget = WorkspaceStatus(client=client, interval=0.3)
    assert "0.5 GPU = 8,192 MiB" in widget.table.value and widget.message.value == ""
    assert "also: side 0.25 GPU" in widget.table.value
    assert (
        "Train projects" in widget.table.value
        and "default (2 GPUs guaranteed, 0 GPU in use)" in widget.table.value
    )
    hub.stop_server("wanda", "side")
    # nobody refreshes: the widget reads again by itself
    until(
        lambda: "also: side" not in widget.table.value,
        "the widget to drop the stopped server",
        timeout=20,
        detail=lambda: widget.table.value,
    )
    widget.close()
    hub.stop_server("wanda")


def test_status_explains_a_bad_token(hub: Hub) -> None:
    client = Client(f"http://127.0.0.1:{hub.api_port}/services/gpupool/", "not-a-token")
    with pytest.raises(GPUPoolError, match="HTTP 403"):
        client.get("api/me")
    widget = WorkspaceStatus(client=client)
    assert "HTTP 403" in widget.message.value


def test_client_outside_a_workspace_says_so(monkeypatch) -> None:
    monkeypatch.delenv("GPUPOOL_API_URL", raising=False)
    with pytest.raises(GPUPoolError, match="not set: is this notebook running in a gpupool workspace"):
        Client()


def test_culler_findings_become_rows_with_the_warning() -> None:
    from gpupool.widgets.status import culler_rows

    finding = {
        "owner": "ann",
        "name": "",
        "action": "warn",
        "reason": "idle-gpu",
        "cull_at": 1000 + 600,
        "message": "will stop in 10 min because its GPU has been idle: save your work",
        "gpu_idle_s": 1500,
        "gpu_util_pct": 0.0,
        "memory_mib": 512,
        "memory_limit_mib": 4096,
    }
    rows = dict(culler_rows({"workspaces": [finding]}, "ann", "", now=1000))
    assert rows["GPU idle"] == "25 min"
    assert rows["Session"].endswith("(in 10 min) if its GPU stays idle")
    assert rows["GPU use"] == "0 % now, 512 of 4,096 MiB"
    assert rows["Warning"].startswith("will stop in 10 min")
    assert culler_rows({"workspaces": [finding]}, "bob", "", now=1000) == [("GPU use", "no GPU data yet")]
    assert culler_rows(None, "ann", "", now=1000, virtual=True) == [("GPU use", "no GPU data: virtual GPU")]
    just_extended = {**finding, "action": "keep", "extended": True, "cull_at": None}  # as the API leaves it
    assert dict(culler_rows({"workspaces": [just_extended]}, "ann", "", 1000))["Session"].startswith(
        "extended once"
    )  # at once, not the old end time
    later = {**just_extended, "cull_at": 1000 + 3600}  # the culler's next pass
    assert dict(culler_rows({"workspaces": [later]}, "ann", "", 1000))["Session"].endswith(
        "(in 1 h) if its GPU stays idle"
    )
