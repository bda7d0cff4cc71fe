"""The hub's loop stays free: usage reports and the usage gauges run in a worker thread, and read
every user's groups once (the hub's, on the loop) instead of asking the hub per user from there (a
report by group over 166 users once held the loop 2-5 s)."""

from __future__ import annotations

import asyncio
import threading

from gpupool.usage.metrics import UsageCollector
from gpupool.usage.service import UsageService
from tests.support.pools import make_pool
from tests.test_usage_accounting import backdate


class Groups(dict):
    """The hub's group map, noting the threads that read it."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.readers: set[str] = set()

    def get(self, key, default=None):
        self.readers.add(threading.current_thread().name)
        return super().get(key, default)


def usage_on_a_pool(tmp_path):
    pool = make_pool(tmp_path, 2)
    for owner in ("ann", "bob", "cy"):
        pool.reserve_build(owner, [], "", 250)
    backdate(pool.store, 1800)  # held for half an hour
    groups = Groups({"ann": ("physics",), "bob": ("physics", "cs101")})
    reads: list[int] = []

    def group_map():
        reads.append(1)
        return groups

    def per_user(owner):  # the hub's per-user question: must not be asked, least of all off the loop
        raise AssertionError(f"asked the hub for {owner}'s groups")

    return UsageService(pool, groups_of=per_user, group_map=group_map), groups, reads


def test_a_usage_report_runs_off_the_loop_with_groups_read_once(tmp_path) -> None:
    usage, groups, reads = usage_on_a_pool(tmp_path)
    now = usage.now()
    report = asyncio.run(usage.report_off_loop(now - 3600, now + 1, "group"))
    assert report["rows"], report
    assert {r["key"] for r in report["rows"]} >= {"physics", "cs101"}
    assert reads == [1]  # one read of the hub's groups for the whole report
    assert groups.readers and threading.main_thread().name not in groups.readers  # read in a worker


def test_a_metrics_scrape_answers_at_once_and_computes_in_a_worker(tmp_path) -> None:
    usage, groups, reads = usage_on_a_pool(tmp_path)
    collector = UsageCollector(usage)
    assert list(collector.collect()) == []  # the first scrape does not wait for the figures
    with collector._busy:  # the worker's computation has ended
        pass
    families = {f.name: f for f in collector.collect()}
    keys = {s.labels["key"] for s in families["gpupool_usage_allocated_gpu_hours"].samples}
    assert {"ann", "physics", "cs101"} <= keys
    assert reads == [1] and threading.main_thread().name not in groups.readers
