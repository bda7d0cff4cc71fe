"""The JSON that crosses between the culler service and the hub, typed once for both ends.

`GET api/culler/targets` answers {"workspaces": [CullTarget]} (gpupool.api.culler builds them, the
culler reads them); `POST api/culler/report` carries a CullReport (the culler builds it, the hub
checks it whole with gpupool.api.culler.parse_report, which returns these same shapes). The
OpenAPI description (docs/openapi.yaml) says the same for other clients. Stdlib only: the culler
runs in its own process and imports no hub code.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

from gpupool.vocab.hibernate_wire import SavedSummary


class CullTarget(TypedDict):
    """One GPU workspace the culler judges: who, where its GPU is, and the rules' inputs."""

    owner: str
    name: str
    pid: int | None  # the server's process on one machine (None on Kubernetes, or parked)
    pod_uid: str  # its pod on Kubernetes ("" elsewhere)
    server_url: str  # where the culler reaches the server itself (restart kernels, hibernate)
    gpu_uuids: list[str]
    whole_gpus: bool
    milli: int  # its share in milli-GPU
    memory_limit_mib: int  # what NVML may show its processes use (0: no cap)
    groups: list[str]
    admin: bool
    extended: bool
    profile: NotRequired[str]  # the spawn profile the spawner started ("" or absent: none)
    started: NotRequired[str]  # ISO 8601, UTC
    budget: NotRequired[str]  # a gpupool.vocab.culling.BudgetAction
    parked: NotRequired[bool]  # parked: no GPU to sample, the time limits still apply


class Finding(TypedDict):
    """What the culler found of one workspace in a pass; the pages and widgets read these keys."""

    owner: str
    name: str
    action: str  # a gpupool.vocab.culling.CullAction
    reason: str  # a gpupool.vocab.culling.CullReason ("" : none)
    cull_at: float | None
    extended_cull_at: float | None  # the end once extended: shown the moment Extend is pressed
    message: str
    gpu_idle_s: float | None
    gpu_util_pct: float | None
    memory_mib: int
    memory_limit_mib: int
    extended: bool
    gpu_data: bool  # fresh GPU readings back the finding
    parked: str  # the text the JupyterLab item shows when parked ("" when not)
    planned: NotRequired[bool]  # no pass judged it yet: the end of its session by the time rules (the hub's)


class ReportEvent(TypedDict):
    """A warning or an action of the pass, kept in the hub's event log."""

    kind: str  # a gpupool.vocab.kinds.EventKind
    owner: str
    name: str
    reason: str
    message: str
    hibernated: NotRequired[SavedSummary]  # what the server's save reported (a cull that hibernated)
    idle_s: NotRequired[int]  # idle how long before a cull for idleness


class CullerStatus(TypedDict):
    """`GET api/culler/status`: the culler's last findings the caller may see (their own, or all for
    an admin); the widgets, JupyterLab's status item and `%gpupool` read it (gpupool.widgets.summary)."""

    pass_time: float | None  # None: no pass yet
    workspaces: list[Finding]


class CullReport(TypedDict):
    pass_time: float
    workspaces: list[Finding]
    events: list[ReportEvent]
