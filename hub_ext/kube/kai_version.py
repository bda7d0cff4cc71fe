"""Which KAI-Scheduler runs, for what gpupool may ask of it.

KAI's operator runs the pod grouper as Deployment `pod-grouper` in KAI's namespace, from an
image tagged with KAI's release (`.../podgrouper:v0.17.0`): its tag is read (the chart grants
the hub `get` on that one object), or the admin states it (the chart's `kai.version`).

What depends on it: elastic jobs. A Job's pods form one gang of `min_gpus` only where KAI's
pod grouper reads `kai.scheduler/batch-min-member` and groups all of a Job's pods into one
PodGroup, both from v0.14.1 (before: a PodGroup per pod, minMember 1, so no gang).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

ELASTIC_SINCE = (0, 14, 1)
POD_GROUPER = "pod-grouper"
_VERSION = re.compile(r"v?(\d+)\.(\d+)\.(\d+)")


def parse_version(text: str) -> tuple[int, int, int] | None:
    """(0, 17, 0) from "v0.17.0", "0.17.0", an image "…/podgrouper:v0.17.0" or "v0.17.0-fips"."""
    tag = text.rsplit(":", 1)[-1] if "/" in text or ":" in text else text
    m = _VERSION.match(tag.strip())
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


@dataclass(frozen=True)
class KaiVersion:
    version: tuple[int, int, int] | None
    text: str  # as found ("v0.12.0"), or as stated
    error: str = ""  # why it is unknown

    @property
    def elastic(self) -> bool:
        return self.version is not None and self.version >= ELASTIC_SINCE


def elastic_refusal(kai: KaiVersion | None, where: str = "") -> str | None:
    """Why an elastic job cannot run on this KAI (None: it can)."""
    since = "v" + ".".join(map(str, ELASTIC_SINCE))
    if kai is not None and kai.elastic:
        return None
    what = (
        "elastic jobs (min_gpus) need KAI-Scheduler " + since + " or later, which gang-schedules a Job's"
        " pods as one group of min_gpus (kai.scheduler/batch-min-member)"
    )
    if kai is None or kai.version is None:
        why = kai.error if kai is not None else "not read yet"
        return (
            f"{what}; which KAI runs here is unknown ({why}): the admin sets it (the chart's kai.version)."
            " Submit a fixed-size job (gpus without min_gpus) meanwhile"
        )
    return (
        f"{what}; this cluster runs {kai.text}{where}, which would start each pod on its own:"
        " submit a fixed-size job (gpus without min_gpus), or ask the admin to upgrade KAI"
    )


async def detect(api: Any, namespace: str = "kai-scheduler") -> KaiVersion:
    """The version of KAI's pod grouper image, through kubernetes_asyncio's `api` client."""
    from kubernetes_asyncio import client

    try:
        dep = await client.AppsV1Api(api).read_namespaced_deployment(POD_GROUPER, namespace)
    except Exception as err:  # noqa: BLE001 - any failure is an unknown version, with why
        status = getattr(err, "status", None)
        why = f"{status} {getattr(err, 'reason', '')}".strip() if status else str(err)[:200]
        return KaiVersion(None, "", f"reading deployment {namespace}/{POD_GROUPER}: {why}")
    images = [c.image or "" for c in dep.spec.template.spec.containers or []]
    for image in images:
        version = parse_version(image)
        if version is not None:
            return KaiVersion(version, image.rsplit(":", 1)[-1])
    return KaiVersion(
        None,
        "",
        f"deployment {namespace}/{POD_GROUPER} runs {', '.join(images) or 'no image'},"
        " which has no version tag",
    )
