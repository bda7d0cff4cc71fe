"""A class-sized hub: 300 users with running GPU workspaces on a real hub (written into its
databases as a restarted hub finds them, benchmarks/culling/class_hub.populate; page limit 200).
The culler judges every one of them, reading the active users page by page, and stops them with
one request at a time or a bounded number in flight (IdleCuller.concurrency). The workspaces' servers are one
shared HTTP responder (tests/support/shared_server.py): the hub, the proxy, the gpupool API and
the culler are real. The figures go to docs/culling.md (`python -m benchmarks.culling
--class-size 500` prints the same table)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.culling.class_hub import measure, table
from gpupool.idle_culler.service import _at_offset, _remaining_offsets

USERS = 300  # two pages of the hub's 200: what paging must get right; the benchmark runs 500
STOPS = 40


@pytest.mark.hub
def test_the_culler_judges_and_stops_every_workspace_of_a_class_of_300(make_hub, tmp_path: Path) -> None:
    # 40 of the 300 stopped here (20 one at a time, 20 ten at once): the benchmark stops all 500
    # the quiet hub's baseline is only printed here: a second of it, not the benchmark's five
    f = measure(make_hub, tmp_path / "samples.json", USERS, concurrency=10, stops=STOPS, quiet_s=1.0)
    print("\n" + table(f))
    users = [f"student{i:04d}" for i in range(USERS)]
    assert f["unpaged_seen"] < USERS  # what the culler saw before it paged
    assert f["read_sequential_seen"] == f["read_concurrent_seen"] == USERS
    assert f["judged"] == users
    assert f["stop_sequential_culled"] == f["stop_sequential_expected"]
    assert f["stop_concurrent_culled"] == f["stop_concurrent_expected"]
    assert f["left_running"] == USERS - STOPS  # every stop reached the hub, and its share went back
    probe = f["probe_stopping"]
    assert probe["errors"] == 0 and probe["n"] > 0, probe  # other users were served meanwhile


def test_pages_after_the_first_come_from_its_numbers_and_only_sane_ones() -> None:
    page = {"offset": 0, "limit": 200, "total": 500, "next": {"offset": 200, "limit": 200, "url": "x"}}
    assert _remaining_offsets(page, 10) == [(200, 200), (400, 200)]
    assert _remaining_offsets(page, 1) == []  # concurrency 1: follow `next`, one page at a time
    for bad in (
        {**page, "total": "500"},
        {**page, "limit": 0},
        {**page, "total": 10**12},
        {**page, "next": {"offset": 900, "url": "x"}},
        {**page, "limit": True},
    ):
        assert _remaining_offsets(bad, 10) == []  # not trusted: read by `next` links instead
    assert (
        _at_offset("http://h/hub/api/users?state=active&offset=0", 400, 200)
        == "http://h/hub/api/users?state=active&offset=400&limit=200"
    )
