"""The real node's containerd keeps only this build's images (tests/cluster/node.py): each change
to gpupool makes new image tags, and the CRI plugin names every image it saw a second time by its
id, so the old builds' layers piled up on the machine that runs CI (21 GB in a few days)."""

from __future__ import annotations

from tests.cluster.node import old_images

HUB_NOW, HUB_OLD, DNS = "sha256:" + "a" * 64, "sha256:" + "b" * 64, "sha256:" + "c" * 64


def test_old_builds_go_by_tag_and_by_id_and_this_builds_stay() -> None:
    refs = [
        ("gpupool.local/hub:new", HUB_NOW),
        ("gpupool.local/hub:old", HUB_OLD),
        ("gpupool.local/coredns:1", DNS),
        ("sha256:" + "1" * 64, HUB_NOW),  # the CRI's id-named reference of the current hub image
        ("sha256:" + "2" * 64, HUB_OLD),  # ... of the old one, which no name points at any more
        ("sha256:" + "3" * 64, DNS),
        ("registry.example/other:1", "sha256:" + "d" * 64),  # not ours: kept
        ("sha256:" + "4" * 64, "sha256:" + "d" * 64),
    ]
    current = {"gpupool.local/hub:new", "gpupool.local/coredns:1"}
    assert old_images(refs, current) == ["gpupool.local/hub:old", "sha256:" + "2" * 64]
    assert old_images([r for r in refs if r[1] != HUB_OLD], current) == []


def test_the_image_cache_keeps_the_newest_archives_of_each_image_and_drops_old_builds() -> None:
    from tests.cluster.images import ARCHIVE_UNUSED_S, stale_archives

    now = 10_000_000.0
    hour = 3600.0
    archives = [
        ("gpupool.local_hub_aaaa.tar", now - 5 * hour),
        ("gpupool.local_hub_bbbb.tar", now - 3 * hour),
        ("gpupool.local_hub_cccc.tar", now - 2 * hour),  # the two newest hub builds: kept
        ("gpupool.local_hub_dddd.tar", now - 60),
        ("gpupool.local_singleuser_1111.tar", now - 9 * hour),
        # not among the newest, but used half an hour ago (another checkout's build): kept
        ("gpupool.local_singleuser_2222.tar", now - ARCHIVE_UNUSED_S / 2),
        ("gpupool.local_singleuser_3333.tar", now - 10),
        ("gpupool.local_singleuser_4444.tar", now - 20),
        ("pause.tar", now - 100 * hour),  # one of its kind: kept whatever its age
    ]
    assert stale_archives(archives, now) == [
        "gpupool.local_hub_aaaa.tar",
        "gpupool.local_hub_bbbb.tar",
        "gpupool.local_singleuser_1111.tar",
    ]
