"""Twenty users press Start at the same moment: nobody gets a GPU share that is not there."""

from __future__ import annotations

import urllib.error
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.hubtools import Hub

pytestmark = pytest.mark.hub
USERS = [f"student{i:02d}" for i in range(20)]


def test_twenty_simultaneous_spawns_never_over_allocate(make_hub) -> None:
    hub: Hub = make_hub().start()  # 4 virtual GPUs = 16 shares of 0.25
    for name in USERS:
        hub.api("POST", f"/hub/api/users/{name}")

    def start(name: str) -> tuple[str, int, str]:
        try:
            hub.api("POST", f"/hub/api/users/{name}/server", {"gpus": 0.25}, timeout=120)
            return name, 202, ""
        except urllib.error.HTTPError as err:
            return name, err.code, err.read().decode()

    with ThreadPoolExecutor(len(USERS)) as pool:
        results = list(pool.map(start, USERS))

    started = [n for n, code, _ in results if code in (201, 202)]
    refused = [(n, code, body) for n, code, body in results if code not in (201, 202)]
    assert len(started) == 16, refused
    assert all(code == 409 and "no GPU has room for 0.25 GPU" in body for _, code, body in refused)

    for name in started:
        hub.wait_ready(name, timeout=240)
    shares = hub.allocations()
    assert sorted(s["owner"] for s in shares) == sorted(started)
    per_gpu: dict[int, int] = {}
    for s in shares:
        per_gpu[s["gpu"]] = per_gpu.get(s["gpu"], 0) + s["milli"]
    assert per_gpu == {0: 1000, 1: 1000, 2: 1000, 3: 1000}
    for name, _, _ in refused:
        assert hub.api("GET", f"/hub/api/users/{name}")["servers"] == {}
