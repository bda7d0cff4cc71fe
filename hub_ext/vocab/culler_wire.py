"""The JSON that crosses between the culler service and the hub, typed once for both ends.

`GET api/culler/targets` answers {"workspaces": [CullTarget]} (gpupool.api.culler builds them, the
culler reads them); `POST api/culler/report` carries a CullReport (the culler builds it, the hub
checks it whole with gpupool.api.culler.parse_report, which returns these same shapes). The
OpenAPI description (docs/openapi.yaml) says the same for other clients. Stdlib only: the culler
runs in its own process and imports no hub code.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict, cast

from gpupool.vocab.hibernate_wire import SavedSummary

MAX_TARGETS = 100_000  # workspaces in one answer: far over the GPU workspaces one hub runs
MAX_TEXT = 2048  # one name, URL or timestamp
MAX_ITEMS = 1024  # one workspace's GPUs or groups


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


def parse_targets(body: object) -> tuple[list[CullTarget], list[str]]:
    """The well-formed targets of a `GET api/culler/targets` answer, and why each other entry was
    left out (a key missing, a wrong type, a value out of bounds): the culler judges the rest and
    says what it skipped. An answer that is no {"workspaces": [...]} raises ValueError: the pass
    fails and is retried, rather than reporting an empty pass that would clear the findings."""
    workspaces = body.get("workspaces") if isinstance(body, dict) else None
    if not isinstance(workspaces, list):
        raise ValueError('api/culler/targets: the answer is no {"workspaces": [...]}')
    if len(workspaces) > MAX_TARGETS:
        raise ValueError(f"api/culler/targets: more than {MAX_TARGETS} workspaces")
    targets: list[CullTarget] = []
    skipped: list[str] = []
    for n, entry in enumerate(workspaces):
        why = _unreadable(entry)
        if why:
            who = entry.get("owner") if isinstance(entry, dict) else None
            skipped.append(f"#{n} ({who!r}): {why}" if isinstance(who, str) else f"#{n}: {why}")
        else:
            read = {k: v for k, v in cast(dict[str, object], entry).items() if k in _KEYS}
            targets.append(cast(CullTarget, _DEFAULTS | read))
    return targets, skipped


def _text(value: object, least: int = 0) -> bool:
    return isinstance(value, str) and least <= len(value) <= MAX_TEXT


def _count(value: object, top: int) -> bool:
    return type(value) is int and 0 <= value <= top


def _texts(value: object) -> bool:
    return isinstance(value, list) and len(value) <= MAX_ITEMS and all(_text(v, 1) for v in value)


_REQUIRED = {
    "owner": lambda v: _text(v, 1),
    "name": _text,
    "gpu_uuids": _texts,
    "whole_gpus": lambda v: isinstance(v, bool),
    "milli": lambda v: _count(v, 1_000_000),
    "memory_limit_mib": lambda v: _count(v, 1 << 40),
    "groups": _texts,
    "admin": lambda v: isinstance(v, bool),
    "extended": lambda v: isinstance(v, bool),
}
# keys whose absence has a meaning the culler can act on safely: no process, no pod, no URL
# (nothing to sample or to save; the time limits still apply)
_DEFAULTS: dict[str, object] = {"pid": None, "pod_uid": "", "server_url": ""}
_OPTIONAL = {
    "pid": lambda v: v is None or _count(v, 1 << 31),
    "pod_uid": _text,
    "server_url": _text,
    "profile": _text,
    "started": _text,
    "budget": _text,  # the culler acts only on a BudgetAction it knows
    "parked": lambda v: isinstance(v, bool),
}
_KEYS = frozenset(_REQUIRED) | frozenset(_OPTIONAL)


def _unreadable(entry: object) -> str:
    """Why `entry` is no CullTarget ("" : it is one)."""
    if not isinstance(entry, dict):
        return "not an object"
    for key, ok in _REQUIRED.items():
        if key not in entry:
            return f"no {key}"
        if not ok(entry[key]):
            return f"{key} is not what a target holds"
    for key, ok in _OPTIONAL.items():
        if key in entry and not ok(entry[key]):
            return f"{key} is not what a target holds"
    return ""
