"""A train job's submission, parsed in one place: every field of the request body bounded and
checked against the caller's projects, the pools and the cluster's largest node, before anything is
read from the database or written (the API's `JobsHandler.post` keeps only what needs I/O: the rate
limit, the GPU-hour budget, the count of active jobs and the code's snapshot). Pure: the same body
and context give the same form or the same refusal."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from gpupool.pool import InvalidRequest, Request
from gpupool.pool.pools import NodePool
from gpupool.pool.training import Project
from gpupool.pool.units import MILLI_PER_GPU, UnitError, parse_gpus, shown
from gpupool.train.code import JobCode
from gpupool.train.request import JobRequest
from gpupool.train.sweep import SweepError, combinations
from gpupool.train.volume import code_refusal
from gpupool.vocab.priority import PRIORITY_MAX, PRIORITY_MIN

NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
MAX_POOLS = 16
CODE_KINDS = ("script", "code", "notebook")


class JobRefused(ValueError):
    """The body is refused: `status` is the API's answer (400 bad field, 403 not your project,
    413 too much code), the message names the field."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Limits(Protocol):
    """What of c.TrainPool the form reads."""

    max_sweep_runs: int
    max_code_kib: int
    max_cells: int

    def may_submit(
        self, project: str, user: str, groups: tuple[str, ...] | list[str], admin: bool
    ) -> bool: ...

    def projects_for(self, user: str, groups: tuple[str, ...] | list[str], admin: bool) -> list[str]: ...


@dataclass(frozen=True)
class JobForm:
    """One submission: a job, or a sweep's runs (`runs`: each run's name and its parameters, None
    for a plain job), each run differing only in its name and code."""

    project: str
    request: Request
    name: str
    runs: list[tuple[str, dict[str, object] | None]]
    pools: tuple[str, ...] = ()
    min_gpus: int = 0
    priority: int = 0
    min_runtime_s: float = 0.0
    max_runtime_s: float = 0.0

    def job(self, owner: str, code: JobCode) -> JobRequest:
        """The request of the first run (a sweep's others: `replace(name=..., code=...)`)."""
        return JobRequest(
            owner=owner,
            project=self.project,
            name=self.name,
            num_gpu=self.request.num_gpu,
            gpu_milli=self.request.gpu_milli,
            code=code,
            priority=self.priority,
            min_runtime_s=self.min_runtime_s,
            max_runtime_s=self.max_runtime_s,
            min_gpus=self.min_gpus,
            pools=tuple(self.pools),
        )


def number(body: Mapping[str, object], key: str, default: float, lo: float, hi: float) -> float:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise JobRefused(400, f"{key} must be a number, got {shown(value)}")
    if not lo <= value <= hi:
        raise JobRefused(400, f"{key} must be between {lo:g} and {hi:g}, got {shown(value)}")
    return value


def parse_job(
    body: Mapping[str, object],
    user: str,
    groups: tuple[str, ...],
    admin: bool,
    cfg: Limits,
    projects: Mapping[str, Project],
    pools: Mapping[str, NodePool],
    max_gpus_per_node: int,
) -> JobForm:
    """The submission `body` as a JobForm, or JobRefused naming the first field at fault."""
    project = body.get("project")
    if not isinstance(project, str) or project not in projects:
        raise JobRefused(400, f"unknown project {shown(project)}; choose one of {sorted(projects)}")
    if not cfg.may_submit(project, user, groups, admin):
        mine = cfg.projects_for(user, groups, admin)
        raise JobRefused(403, f"you may not submit to project {project!r}; your projects: {mine}")
    try:
        request = Request.for_gpus(parse_gpus(body.get("gpus")))
    except (UnitError, InvalidRequest) as err:
        raise JobRefused(400, f"gpus: {err}") from None
    if request.num_gpu > max_gpus_per_node:
        raise JobRefused(
            400, f"gpus: no node has {request.num_gpu} GPUs (the largest has {max_gpus_per_node})"
        )
    cap = projects[project].limit_milli
    if 0 <= cap < request.total_milli:
        raise JobRefused(400, f"gpus: project {project} may use at most {cap / MILLI_PER_GPU:g} GPUs")
    name = body.get("name", "job")
    if not isinstance(name, str) or not 1 <= len(name) <= 40 or set(name) - NAME_CHARS or name[0] in ".-":
        raise JobRefused(400, "name: 1-40 letters, digits, '.', '_' or '-', not starting with '.' or '-'")
    min_gpus = 0
    if "min_gpus" in body:  # an elastic job: min_gpus to gpus whole GPUs
        min_gpus = int(number(body, "min_gpus", 0, 1, request.num_gpu))
        if request.gpu_milli != MILLI_PER_GPU or min_gpus != body["min_gpus"]:
            raise JobRefused(400, "min_gpus: a whole number of GPUs, for a job of whole GPUs")
    chosen = job_pools(body, project, projects, pools)
    runs = sweep_runs(body, name, cfg.max_sweep_runs)
    form = JobForm(
        project=project,
        request=request,
        name=name,
        runs=runs,
        pools=chosen,
        min_gpus=min_gpus,
        priority=int(number(body, "priority", 0, PRIORITY_MIN, PRIORITY_MAX)),
        min_runtime_s=number(body, "min_runtime_s", 0, 0, 7 * 86400),
        max_runtime_s=number(body, "max_runtime_s", 0, 0, 30 * 86400),
    )
    kind = next((k for k in CODE_KINDS if k in body), "")
    if why := code_refusal(kind, body.get(kind), cfg.max_code_kib * 1024, cfg.max_cells):
        raise JobRefused(413, why)
    return form


def job_pools(
    body: Mapping[str, object], project: str, projects: Mapping[str, Project], pools: Mapping[str, NodePool]
) -> tuple[str, ...]:
    """The node pools the job chose, in its order: some of its project's (or, for a project
    without pools, of all node pools)."""
    if "pools" not in body:
        return ()
    allowed = projects[project].pools or tuple(pools)
    chosen = body["pools"]
    if (
        not isinstance(chosen, list)
        or not 1 <= len(chosen) <= MAX_POOLS
        or not all(isinstance(p, str) for p in chosen)
        or len(set(chosen)) != len(chosen)
        or set(chosen) - set(allowed)
    ):
        raise JobRefused(400, f"pools: a list of node pools of project {project}: {list(allowed)}")
    return tuple(chosen)


def sweep_runs(
    body: Mapping[str, object], name: str, max_runs: int
) -> list[tuple[str, dict[str, object] | None]]:
    """Without "sweep": the job itself. With it: one run per combination, its values
    injected into the code's parameters (so only for "code" and "notebook")."""
    if "sweep" not in body:
        return [(name, None)]
    if "code" not in body and "notebook" not in body:
        raise JobRefused(400, "sweep: only for code or notebook jobs (their parameters get the values)")
    base = body.get("parameters") or {}
    if not isinstance(base, dict):
        raise JobRefused(400, "parameters must be an object")
    try:
        combos = combinations(body["sweep"], max_runs)
    except SweepError as err:
        raise JobRefused(400, str(err)) from None
    return [(f"{name[:36]}-{k + 1}", {**base, **combo}) for k, combo in enumerate(combos)]
