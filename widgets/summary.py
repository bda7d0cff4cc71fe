"""One workspace's GPU share and culling outlook in plain words: pure, for the JupyterLab status
item (through `labserver`) and `%gpupool` alike, so both say the same thing."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from gpupool.pool.units import format_gpus, gpus_number
from gpupool.vocab.culler_wire import CullerStatus
from gpupool.vocab.culling import CullAction, CullReason
from gpupool.vocab.job_wire import JobList, JobView
from gpupool.vocab.pool_wire import GPUView, MeView, PoolView, ShareView
from gpupool.vocab.reason_words import UPCOMING
from gpupool.vocab.states import JobState


def gpus_text(milli: int) -> str:
    return format_gpus(milli)  # the hub's own wording and rounding, on every screen


def clock(epoch: float) -> str:
    return time.strftime("%H:%M", time.localtime(epoch))


def left_text(seconds: float) -> str:
    minutes = max(0, int(seconds // 60))
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60} min" if minutes % 60 else f"{minutes // 60} h"


def parked_milli(me: MeView, server: str) -> int:
    """This server's parked share as the pool counts it (api/me's holdings), 0 when not parked."""
    return sum(
        h.get("milli", 0) for h in me.get("holdings", []) if h.get("server") == server and h.get("parked")
    )


def my_shares(pool: PoolView, owner: str, server: str) -> list[tuple[GPUView, ShareView]]:
    return [
        (gpu, share)
        for gpu in pool.get("gpus", [])
        for share in gpu.get("shares", [])
        if share.get("owner") == owner and share.get("name") == server and share.get("kind") == "build"
    ]


def moved_text(share: ShareView) -> str:
    """'moved to GPU 3 at 14:02 (to make room for a training job)' for a share the hub moved
    (gpupool.parking.mover), '' otherwise."""
    m = share.get("moved")
    at = m.get("at") if isinstance(m, Mapping) else None
    if m is None or not isinstance(at, int | float):
        return ""
    gpus = ", ".join(str(g) for g in m.get("to_gpus") or [])
    node = f" on {m.get('to_node')}" if m.get("to_node") != m.get("from_node") else ""
    why = f" (to make room for {m['why']})" if m.get("why") else ""
    return f"moved to GPU {gpus}{node} at {clock(at)}{why}"


def last_move(mine: list[tuple[GPUView, ShareView]]) -> tuple[str, float | None]:
    """The text and time of this workspace's last move (its shares move together)."""
    for _, share in mine:
        text, moved = moved_text(share), share.get("moved")
        if text and moved is not None and moved["at"] is not None:  # moved_text checked it
            return text, float(moved["at"])
    return "", None


def culler_finding(culler: CullerStatus | None, owner: str, server: str) -> Mapping[str, Any]:
    """This workspace's Finding, read with .get (a hub may leave keys out); {} when the culler has none."""
    for found in culler.get("workspaces", []) if culler else []:
        if found.get("owner") == owner and found.get("name") == server:
            return found
    return {}


def budget_summary(budget: Mapping[str, Any] | None) -> dict[str, object] | None:
    """The user's GPU-hour budget as the status item shows it (api/budget): None without one."""
    if not budget or budget.get("status") in (None, "none"):
        return None
    worst = max(budget.get("budgets") or [{}], key=lambda b: b.get("used_pct", 0))
    return {
        "status": budget["status"],
        "message": budget.get("message", ""),
        "used_pct": worst.get("used_pct", 0),
        "used_gpu_hours": worst.get("used_gpu_hours", 0),
        "limit_gpu_hours": worst.get("limit_gpu_hours", 0),
        "used_text": worst.get("used_text", ""),  # formatted by the hub, as on every other screen
        "limit_text": worst.get("limit_text", ""),
        "frees_at": worst.get("frees_at"),
        "min_share_gpus": worst.get("min_share_gpus", 0),
    }


def _start(job: JobView) -> float | None:
    eta = job.get("eta")
    return eta.get("start") if eta else None


def next_job(jobs: JobList | None) -> dict[str, object] | None:
    """The user's queued train job that should start first, with when and why it waits (api/jobs)."""
    queued = [j for j in jobs.get("jobs", []) if j.get("state") == JobState.QUEUED] if jobs else []
    if not queued:
        return None
    timed = [(start, j) for j in queued if (start := _start(j))]
    first = min(timed, key=lambda t: t[0])[1] if timed else queued[0]
    eta = first.get("eta")
    return {
        "queued": len(queued),
        "id": first.get("id", ""),
        "name": first.get("name", ""),
        "start": eta.get("start") if eta else None,
        "text": eta.get("text", "") if eta else "",
        "reason": first.get("wait_reason", ""),
    }


def summary(
    me: MeView,
    pool: PoolView,
    culler: CullerStatus | None,
    server: str,
    now: float,
    budget: Mapping[str, Any] | None = None,
    jobs: JobList | None = None,
) -> dict[str, Any]:
    """What the status item shows: the share ("0.25" GPU), when and why the server stops, whether
    the culler warns now and whether Extend may still be pressed, and tooltip lines."""
    mine = my_shares(pool, me.get("name", ""), server)
    milli = sum(share["milli"] for _, share in mine)
    found = culler_finding(culler, me.get("name", ""), server)
    parked = parked_milli(me, server) if not mine else 0
    out: dict[str, Any] = {
        "share": gpus_number(milli or parked) if mine or parked else "",
        "virtual": any(gpu.get("virtual") for gpu, _ in mine),
        "now": now,
        "cull_at": found.get("cull_at"),
        "reason": found.get("reason", ""),
        "reason_text": UPCOMING.get(found.get("reason", ""), ""),
        "action": found.get("action", ""),
        "message": found.get("message", ""),
        "extendable": bool(found) and not found.get("extended") and found.get("reason") != CullReason.MEMORY,
        "gpu_util_pct": found.get("gpu_util_pct"),
        "gpu_idle_s": found.get("gpu_idle_s"),
        # GPU parking fills this in; the item shows it and offers Resume. A share the pool counts
        # as parked is parked here too, whatever the culler's last pass said
        "parked": found.get("parked") or ("it comes back when you run a cell" if parked else ""),
    }
    # the kernel killed a process of this server over its host memory limit (api/me; "" none)
    out["memory_killed"] = next(
        (str(h.get("memory_killed") or "") for h in me.get("holdings", []) if h.get("server") == server), ""
    )
    out["moved"], out["moved_at"] = last_move(mine)  # the status item shows it for a while after the move
    lines = []
    for gpu, share in mine:
        kind = "virtual GPU" if gpu.get("virtual") else gpu.get("model", "GPU")
        memory = gpu.get("memory_mib", 0) * share["milli"] // 1000
        lines.append(f"{gpus_text(share['milli'])} of {kind} #{gpu.get('index')} ({memory:,} MiB)")
    if parked:
        lines.append(f"{gpus_text(parked)} parked: it still counts against your quota and comes back on use")
    elif not mine:
        lines.append("no GPU share: this server runs on CPU only")
    if out["gpu_util_pct"] is not None:
        lines.append(f"GPU use {out['gpu_util_pct']:.0f} %")
    elif mine and out["virtual"]:
        lines.append("no GPU use data: virtual GPU")
    if out["gpu_idle_s"] is not None:
        lines.append(f"GPU idle for {left_text(out['gpu_idle_s'])}")
    if found.get("extended") and not out["cull_at"]:
        lines.append("extended once: the new end time comes with the idle culler's next pass")
    if out["cull_at"]:
        why = f" {out['reason_text']}" if out["reason_text"] else ""
        lines.append(f"stops at {clock(out['cull_at'])} (in {left_text(out['cull_at'] - now)}){why}")
    if out["moved"]:
        lines.append(f"{out['moved']}: nothing restarted")
    if out["memory_killed"]:
        lines.append(f"a process of this server was {out['memory_killed']}")
    if out["action"] == CullAction.WARN and out["message"]:
        lines.append(f"warning: {out['message']}")
    out["budget"] = budget_summary(budget)
    if out["budget"]:
        lines.append(f"GPU-hour budget: {out['budget']['message']}")
    out["job"] = next_job(jobs)
    if out["job"]:
        j = out["job"]
        when = j["text"] or "no estimate yet"
        lines.append(
            f"train job {j['id']} ({j['name']}) queued: {when}"
            + (f"; {j['reason']}" if j["reason"] else "")
            + (f" ({j['queued']} queued)" if j["queued"] > 1 else "")
        )
    out["lines"] = lines
    return out
