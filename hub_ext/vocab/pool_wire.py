"""The JSON of `GET api/pool` and `GET api/me`, typed once: gpupool.api.pool writes them, the
widgets, JupyterLab's status item and `%gpupool` read them (gpupool.widgets.summary, .status,
.jobs), as docs/openapi.yaml says for other clients. Stdlib only: the widgets run in the user's
server and kernels."""

from __future__ import annotations

from typing import NotRequired, TypedDict


class Moved(TypedDict):
    """A workspace's last move (gpupool.parking.mover), shown for a day."""

    at: float | None
    from_node: str
    from_gpus: list[int]
    to_node: str
    to_gpus: list[int]
    why: str


class ShareView(TypedDict):
    """One share of a GPU: another user's shows no names ("(another user)", "")."""

    kind: str  # a gpupool.vocab.kinds.WorkloadKind
    owner: str
    name: str
    milli: int
    state: str
    pid: NotRequired[int | None]  # admins and services only
    moved: NotRequired[Moved]


class GPUView(TypedDict):
    node: str
    index: int
    uuid: str
    model: str
    memory_mib: int
    virtual: bool
    free_milli: int
    shares: list[ShareView]


class PoolView(TypedDict):
    """`GET api/pool`."""

    gpus: list[GPUView]


class Holding(TypedDict):
    """One of the caller's GPU workspaces, parked ones too (they count against the quota)."""

    server: str
    milli: int
    parked: bool
    memory_killed: str  # what the OOM killer did in its cgroup ("": nothing)


class OfferedSize(TypedDict):
    milli: int
    fits: bool  # within the caller's quota beside what they hold


class MeView(TypedDict):
    """`GET api/me`: the caller, their quota and what they hold."""

    name: str
    admin: bool
    groups: list[str]
    build_quota_milli: int
    build_quota: str
    sizes_milli: list[int]
    max_per_workspace_milli: int
    max_workspaces: int
    holdings: list[Holding]
    offered: list[OfferedSize]
