"""The culler service against a real hub: it reads every page of active users (JupyterHub
returns at most its page limit per request), and it lives and dies with the hub that
started it, so a restarted hub never has two cullers acting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpupool.idle_culler.config import IdleCuller
from gpupool.idle_culler.sampler import FileSampler
from gpupool.idle_culler.service import Client, Culler, service_definition
from tests.hubtools import Hub
from tests.support.wait import until

pytestmark = pytest.mark.hub
TOKEN = "test-culler-token-0123456789abcdef"
_, ROLE = service_definition("test-culler", "", {})
CONFIG = f"""
c.JupyterHub.services.append({{"name": "test-culler", "api_token": "{TOKEN}"}})
c.JupyterHub.load_roles.append({json.dumps({**ROLE, "name": "test-culler", "services": ["test-culler"]})})
c.JupyterHub.api_page_default_limit = 2
c.JupyterHub.api_page_max_limit = 2
"""


def test_the_culler_judges_every_active_server_past_the_hubs_page_limit(make_hub, tmp_path: Path) -> None:
    hub: Hub = make_hub(CONFIG, env={"GPUPOOL_CULLER": "0"}).start()
    users = [f"s{i}" for i in range(5)]
    for user in users:
        hub.spawn(user, "0.1")
    hub.api("POST", "/hub/api/users/nobody-running")  # a user without a server is not listed
    samples = tmp_path / "samples.json"
    samples.write_text(json.dumps({f"{u}/": {"util_pct": 50} for u in users}))
    culler = Culler(
        IdleCuller(sampler="file"),
        Client(TOKEN),
        f"{hub.url}/hub/api",
        f"http://127.0.0.1:{hub.api_port}/services/gpupool/",
        FileSampler(str(samples)),
    )
    assert sorted(culler.servers()) == [f"{u}/" for u in users]  # 3 pages of at most 2
    judged = culler.run_pass()["workspaces"]
    assert sorted(w["owner"] for w in judged) == users


def cullers(hub: Hub) -> list[int]:
    """Live culler processes started for this hub (they name its gpupool API port)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"gpupool.idle_culler" in args and f"127.0.0.1:{hub.api_port}/".encode() in args and state != "Z":
            found.append(int(proc.name))
    return found


def test_the_culler_dies_with_the_hub_and_is_never_doubled_after_a_restart(make_hub) -> None:
    hub: Hub = make_hub(env={"GPUPOOL_CULLER": "1"}).start()
    until(lambda: len(cullers(hub)) == 1, "the hub started its culler")
    hub.kill9()
    until(lambda: cullers(hub) == [], "the culler stopped with its hub")
    hub.start()
    until(lambda: len(cullers(hub)) == 1, "the restarted hub started one culler")
    hub.stop()
    until(lambda: cullers(hub) == [], "no culler left after the hub stopped")
