"""`helm test` for the gpupool chart: does the cluster have what the hub will need?

The chart's test pod runs `python -m gpupool.kube.check` with what it rendered (GPUPOOL_CHECK,
JSON: queues, priority classes, node pools, KAI's namespace and version) and its own service
account (read-only). Each finding is one line, `ok:` or `FAIL:` with what to do; it exits 1 on
any FAIL. `findings` is pure (the objects read -> the lines), `main` reads them.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from gpupool.kube.kai_version import ELASTIC_SINCE, KaiVersion, parse_version

NODE_POOL = "kai.scheduler/node-pool"


@dataclass
class Expected:
    """What the chart rendered and the hub relies on."""

    queues: list[str] = field(default_factory=list)
    priority_classes: list[str] = field(default_factory=list)
    pools: list[str] = field(default_factory=list)  # node pools: KAI shards (sharing backend kai)
    kai: bool = True  # the sharing backend is KAI's: its version matters
    kai_namespace: str = "kai-scheduler"
    kai_version: str = ""  # the chart's kai.version; "" = read from KAI's pod-grouper Deployment

    @classmethod
    def from_json(cls, text: str) -> Expected:
        data = json.loads(text)
        return cls(
            queues=list(data.get("queues") or []),
            priority_classes=list(data.get("priorityClasses") or []),
            pools=list(data.get("pools") or []),
            kai=bool(data.get("kai", True)),
            kai_namespace=data.get("kaiNamespace") or "kai-scheduler",
            kai_version=data.get("kaiVersion") or "",
        )


@dataclass
class Seen:
    """What the cluster has (None: the kind could not be listed, with why in `errors`)."""

    queues: set[str] | None = None
    priority_classes: set[str] | None = None
    shards: dict[str, str] | None = None  # SchedulingShard name -> partitionLabelValue
    pool_nodes: dict[str, int] | None = None  # pool -> nodes labelled for it
    kai: KaiVersion | None = None
    errors: dict[str, str] = field(default_factory=dict)


def findings(want: Expected, seen: Seen) -> list[str]:
    out: list[str] = []

    def listed(kind: str, have: set[Any] | dict[str, Any] | None, names: list[str], hint: str) -> None:
        if have is None:
            out.append(f"FAIL: cannot list {kind}: {seen.errors.get(kind, 'unknown error')}")
            return
        missing = [n for n in names if n not in have]
        if missing:
            out.append(f"FAIL: {kind} missing: {', '.join(missing)} ({hint})")
        elif names:
            out.append(f"ok: {len(names)} {kind}")

    listed(
        "queues",
        seen.queues,
        want.queues,
        "is KAI-Scheduler installed, with its CRDs? the chart's queues are kept on uninstall only",
    )
    listed(
        "priority classes",
        seen.priority_classes,
        want.priority_classes,
        "KAI's chart makes build and train; or set priorityClasses.create",
    )
    if want.pools:
        shards = {f"gpupool-{p}" for p in want.pools}
        if seen.shards is None:
            out.append(f"FAIL: cannot list SchedulingShards: {seen.errors.get('shards', 'unknown error')}")
        else:
            for name in sorted(shards):
                if name not in seen.shards:
                    out.append(f"FAIL: SchedulingShard {name} missing (KAI's operator makes its scheduler)")
            if "default" not in seen.shards:
                out.append(
                    "FAIL: KAI's default SchedulingShard is missing: projects without pools never run"
                    " (KAI's chart value defaultShard.enabled)"
                )
        if seen.pool_nodes is None:
            out.append(f"FAIL: cannot list nodes: {seen.errors.get('nodes', 'unknown error')}")
        else:
            for pool in want.pools:
                n = seen.pool_nodes.get(pool, 0)
                if n:
                    out.append(f"ok: node pool {pool}: {n} node(s) labelled {NODE_POOL}={pool}")
                else:
                    out.append(
                        f"FAIL: node pool {pool} has no node: label its nodes"
                        f" (kubectl label nodes NODE {NODE_POOL}={pool}); its workspaces and jobs stay"
                        " Pending until then"
                    )
    kai = seen.kai
    if not want.kai:
        pass
    elif kai is None or kai.version is None:
        why = kai.error if kai is not None else seen.errors.get("kai", "not read")
        out.append(f"FAIL: cannot tell which KAI-Scheduler runs ({why}): set kai.version")
    elif kai.version < ELASTIC_SINCE:
        out.append(
            f"ok: KAI-Scheduler {kai.text} (elastic jobs are refused: they need"
            f" v{'.'.join(map(str, ELASTIC_SINCE))} or later)"
        )
    else:
        out.append(f"ok: KAI-Scheduler {kai.text}")
    return out


async def read(want: Expected, api: Any) -> Seen:
    """The objects `findings` needs, through kubernetes_asyncio's `api` client."""
    from kubernetes_asyncio import client

    from gpupool.kube.kai_version import detect

    seen = Seen()
    custom, core, sched = client.CustomObjectsApi(api), client.CoreV1Api(api), client.SchedulingV1Api(api)

    async def attempt(kind: str, call):
        try:
            return await call()
        except Exception as err:  # noqa: BLE001 - reported as a finding
            seen.errors[kind] = _why(err)
            return None

    q = await attempt(
        "queues", lambda: custom.list_cluster_custom_object("scheduling.run.ai", "v2", "queues")
    )
    seen.queues = None if q is None else {i["metadata"]["name"] for i in q.get("items", [])}
    pc = await attempt("priority classes", sched.list_priority_class)
    seen.priority_classes = None if pc is None else {i.metadata.name for i in pc.items}
    if want.pools:
        s = await attempt(
            "shards", lambda: custom.list_cluster_custom_object("kai.scheduler", "v1", "schedulingshards")
        )
        seen.shards = (
            None
            if s is None
            else {
                i["metadata"]["name"]: (i.get("spec") or {}).get("partitionLabelValue", "")
                for i in s.get("items", [])
            }
        )
        nodes = await attempt("nodes", lambda: core.list_node(label_selector=NODE_POOL))
        if nodes is not None:
            seen.pool_nodes = {}
            for n in nodes.items:
                pool = (n.metadata.labels or {}).get(NODE_POOL, "")
                seen.pool_nodes[pool] = seen.pool_nodes.get(pool, 0) + 1
    if want.kai_version:
        version = parse_version(want.kai_version)
        seen.kai = KaiVersion(
            version,
            want.kai_version,
            "" if version else f"kai.version {want.kai_version!r} is not a version such as v0.17.0",
        )
    elif want.kai:
        seen.kai = await detect(api, want.kai_namespace)
    return seen


def _why(err: Exception) -> str:
    status = getattr(err, "status", None)
    return f"{status} {getattr(err, 'reason', '')}".strip() if status else str(err)[:200]


async def run(want: Expected) -> int:
    from kubernetes_asyncio import client, config

    if os.environ.get("KUBECONFIG"):
        await config.load_kube_config()
    else:
        config.load_incluster_config()
    async with client.ApiClient() as api:
        lines = findings(want, await read(want, api))
    for line in lines:
        print(line, flush=True)
    return 1 if any(line.startswith("FAIL") for line in lines) else 0


def main() -> int:
    text = os.environ.get("GPUPOOL_CHECK")
    if not text:
        print("GPUPOOL_CHECK is not set: it holds what the chart rendered (JSON)", file=sys.stderr)
        return 2
    return asyncio.run(run(Expected.from_json(text)))


if __name__ == "__main__":
    sys.exit(main())
