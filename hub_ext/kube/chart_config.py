"""Apply the gpupool chart's settings (its ConfigMap `gpupool-config`, mounted into the z2jh
hub) to the hub's traitlets config, so projects and quotas are written once, in the chart's
values. In z2jh's hub.extraConfig::

    from gpupool.kube.chart_config import apply_chart_config
    apply_chart_config(c, "/etc/gpupool/gpupool.json")
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from gpupool.kube.objects import JobOptions

BUILD_KEYS = {
    "quota": "default_build_quota",
    "fractions": "allowed_fractions",
    "maxPerWorkspace": "max_gpus_per_workspace",
    "maxWorkspaces": "max_workspaces_per_user",
    "groupOverrides": "group_overrides",
}


def train_projects(values: dict[str, Any]) -> dict[str, dict]:
    """Chart projects -> c.TrainPool.projects (the same guarantees KAI's queues carry)."""
    out = {}
    for name, p in (values.get("projects") or {}).items():
        limit = p.get("limit", -1)
        out[name] = {
            "guarantee": p["guarantee"],
            "weight": p.get("overQuotaWeight", 1),
            "limit": None if limit is None or limit < 0 else limit,
            "priority": p.get("priority", 100),
            "department": p.get("department", ""),
        }
        if p.get("pools"):
            out[name]["pools"] = list(p["pools"])
    return out


def job_options(values: dict[str, Any]) -> JobOptions:
    jobs = values.get("jobs") or {}
    kai = values.get("kai") or {}
    return JobOptions(
        namespace=values.get("hubNamespace", "default"),
        queue="{project}",
        checkpoint_size=jobs.get("checkpointSize", "10Gi"),
        storage_class=jobs.get("storageClass") or None,
        grace_s=int(jobs.get("graceSeconds", 60)),
        high_priority_class=jobs.get("highPriorityClass", "gpupool-train-high"),
        kueue=bool((values.get("kueue") or {}).get("enabled")),
        kai_namespace=kai.get("namespace") or "kai-scheduler",
        kai_version=kai.get("version") or "",
    )


def apply_chart_config(c: Any, path: str | Path) -> dict[str, Any]:
    """Set GPUPool, GPUKubeSpawner and TrainPool options from the chart's JSON (each option once:
    the sharing backend is c.GPUPool.gpu_sharing, for workspaces and jobs); returns it."""
    values = json.loads(Path(path).read_text())
    build = values.get("build") or {}
    for key, trait in BUILD_KEYS.items():
        if key in build:
            setattr(c.GPUPool, trait, build[key])
    sharing = values.get("sharing") or {}
    if "backend" in sharing:  # workspaces and train jobs alike
        c.GPUPool.gpu_sharing = sharing["backend"]
    if "fractionByMemory" in sharing:
        c.GPUKubeSpawner.fraction_by_memory = bool(sharing["fractionByMemory"])
    # the workspace queue is an explicit choice: the listed groups in order, else the projects;
    # users in none of them: the chart's defaultProject (it names one that exists)
    c.GPUKubeSpawner.kai_queue_groups = list(build.get("queues") or sorted(values.get("projects") or {}))
    if build.get("defaultProject"):
        c.GPUKubeSpawner.kai_default_group = build["defaultProject"]
    users = values.get("userNamespaces") or {}
    if users.get("enabled"):  # the chart made <prefix><user> namespaces with the hub's RBAC there
        c.KubeSpawner.enable_user_namespaces = True
        c.KubeSpawner.user_namespace_template = users.get("prefix", "gpupool-") + "{username}"
    c.TrainPool.projects = train_projects(values)
    c.TrainPool.node_pools = {
        name: {k: list(v) for k, v in (pool or {}).items() if v}
        for name, pool in (values.get("nodePools") or {}).items()
    }
    c.TrainPool.departments = {
        name: {"guarantee": d.get("quota", 0), "limit": None if d.get("limit", -1) < 0 else d["limit"]}
        for name, d in (values.get("departments") or {}).items()
    }
    # train jobs become Jobs in the hub's namespace, queued by KAI (or Kueue) under the same projects
    jobs = values.get("jobs") or {}
    opts = job_options(values)
    c.TrainPool.runner = "kubernetes"
    c.TrainPool.image = jobs.get("image", "")
    c.TrainPool.grace_s = float(opts.grace_s)
    c.TrainPool.kube_job_options = {k: v for k, v in dataclasses.asdict(opts).items() if k != "grace_s"}
    return values
