"""A class-sized hub: 500 users with running GPU workspaces on a real hub (page limit 200).
The culler judges every one of them, reading the active users page by page. The workspaces'
servers are one shared HTTP responder (tests/support/shared_server.py): the hub, the proxy,
the gpupool API and the culler are real."""

from __future__ import annotations

import http.server
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from gpupool.idle_culler.config import IdleCuller
from gpupool.idle_culler.sampler import FileSampler
from gpupool.idle_culler.service import Client, Culler, service_definition

from tests.hubtools import REPO, Hub

pytestmark = pytest.mark.hub
USERS = 500
TOKEN = "test-culler-token-0123456789abcdef"
_, ROLE = service_definition("test-culler", "", {})
CONFIG = f"""
c.JupyterHub.services.append({{"name": "test-culler", "api_token": "{TOKEN}"}})
c.JupyterHub.load_roles.append({json.dumps({**ROLE, "name": "test-culler", "services": ["test-culler"]})})
c.GPUPool.virtual_gpus = {USERS // 10}
c.GPUPool.allowed_fractions = [0.1]
c.GPUPool.build_placement_policy = "first-fit"
c.JupyterHub.concurrent_spawn_limit = 0
c.JupyterHub.init_spawners_timeout = 1
"""


class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_the_culler_judges_every_workspace_of_a_class_of_500(make_hub, tmp_path: Path) -> None:
    responder = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=responder.serve_forever, daemon=True).start()
    try:
        hub: Hub = make_hub(CONFIG, env={
            "GPUPOOL_CULLER": "0", "GPUPOOL_SPAWNER": "tests.support.shared_server.SharedServerGPUSpawner",
            "GPUPOOL_TEST_RESPONDER_PORT": str(responder.server_address[1]), "PYTHONPATH": str(REPO),
        }).start()
        users = [f"student{i:03d}" for i in range(USERS)]

        def spawn(user: str) -> None:
            hub.api("POST", f"/hub/api/users/{user}")
            hub.api("POST", f"/hub/api/users/{user}/server", {"gpus": 0.1})

        with ThreadPoolExecutor(8) as pool:  # bounded, like a class logging in
            list(pool.map(spawn, users))
        deadline = time.monotonic() + 300
        while len(hub.allocations()) < USERS:
            assert time.monotonic() < deadline, hub.tail()
            time.sleep(1)

        samples = tmp_path / "samples.json"
        samples.write_text(json.dumps({f"{u}/": {"util_pct": 50} for u in users}))
        culler = Culler(IdleCuller(sampler="file"), Client(TOKEN), f"{hub.url}/hub/api",
                        f"http://127.0.0.1:{hub.api_port}/services/gpupool/", FileSampler(str(samples)))
        t = time.perf_counter()
        first_page = Client(TOKEN).call("GET", f"{hub.url}/hub/api/users?state=active")
        one_read_s = time.perf_counter() - t
        t = time.perf_counter()
        paged = culler.servers()
        paged_s = time.perf_counter() - t
        t = time.perf_counter()
        judged = culler.run_pass()["workspaces"]
        pass_s = time.perf_counter() - t
        print(f"\n{USERS} workspaces: one unpaginated read {one_read_s:.2f} s sees {len(first_page)};"
              f" paged read {paged_s:.2f} s sees {len(paged)}; whole culler pass {pass_s:.2f} s")
        assert len(first_page) < USERS  # what the culler saw before it paged
        assert sorted(w["owner"] for w in judged) == users
    finally:
        responder.shutdown()
