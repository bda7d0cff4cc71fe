"""The training pool's structured options as trait types, one per option (as the build quotas'
in gpupool.settings.quota_traits and the culler's in gpupool.idle_culler.traits): each entry is checked
where traitlets reads the value — a config file, or the chart's rendered config on Kubernetes —
with the option, the entry and the bad value named. What spans two options (a project's
department and pools exist, a department's projects fit in its guarantee) is checked by
TrainPool's *_table methods, which read both."""

from __future__ import annotations

import dataclasses
from typing import Any

from traitlets import Dict, TraitError

from gpupool.pool.pools import NodePool
from gpupool.pool.training import Department, Project
from gpupool.pool.units import UnitError, parse_gpus, shown

PROJECT_KEYS = frozenset(
    {"guarantee", "weight", "limit", "priority", "department", "users", "groups"}
    | {"idle_gpu_s"}  # idle train jobs (train/idle.py)
    | {"pools"}  # node pools, in order of preference
)
POOL_KEYS = frozenset({"models", "nodes", "gpus"})
DEPARTMENT_KEYS = frozenset({"guarantee", "limit"})
MAX_POOLS = 16  # node pools a project names
MAX_IDLE_S = 7 * 86400


def _where(obj: Any, name: str | None) -> str:
    return f"{type(obj).__name__}.{name}"


def pool_guarantees(where: str, raw: object) -> tuple[tuple[str, int], ...]:
    """A project's `guarantee` given per node pool ({"dgx": 4, "workstations": 2}), checked;
    () for a plain number."""
    if not isinstance(raw, dict):
        return ()
    if not 1 <= len(raw) <= MAX_POOLS or not all(isinstance(k, str) and k for k in raw):
        raise TraitError(
            f"{where}: guarantee per pool is a dict of 1 to {MAX_POOLS}"
            ' node pool names and GPUs, e.g. {"dgx": 4, "workstations": 2}'
        )
    out = []
    for pool, value in raw.items():
        try:
            milli = parse_gpus(value)
        except UnitError as err:
            raise TraitError(f"{where}: guarantee[{pool!r}]: {err}") from None
        if milli < 0:
            raise TraitError(f"{where}: guarantee[{pool!r}] must be >= 0")
        out.append((pool, milli))
    return tuple(out)


def idle_seconds(where: str, spec: dict[str, Any]) -> float:
    """A project's idle_gpu_s: seconds from 0 (never) to a week."""
    raw = spec.get("idle_gpu_s", 0)
    try:
        idle_s = float(raw)
    except (TypeError, ValueError):
        raise TraitError(f"{where}: idle_gpu_s must be seconds, got {shown(raw)}") from None
    if not 0 <= idle_s <= MAX_IDLE_S:
        raise TraitError(f"{where}: idle_gpu_s must be between 0 and {MAX_IDLE_S}")
    return idle_s


def project_of(name: object, spec: object, where: str = "TrainPool.projects") -> Project:
    """One entry of c.TrainPool.projects, checked, as the pool's Project."""
    here = f"{where}[{name!r}]"
    if not isinstance(name, str) or not name:
        raise TraitError(f"{where}: a project's name is a non-empty string, not {shown(name)}")
    if not isinstance(spec, dict):
        raise TraitError(f"{here} must be a dict")
    unknown = set(spec) - PROJECT_KEYS
    if unknown:
        raise TraitError(f"{here}: unknown keys {sorted(map(str, unknown))}; use {sorted(PROJECT_KEYS)}")
    for key in ("users", "groups"):
        names = spec.get(key, [])
        if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
            raise TraitError(f"{here}[{key!r}] must be a list of names")
    per_pool = pool_guarantees(here, spec.get("guarantee", 0))
    try:
        guarantee = sum(g for _, g in per_pool) if per_pool else parse_gpus(spec.get("guarantee", 0))
        limit = -1 if spec.get("limit") is None else parse_gpus(spec["limit"])
    except UnitError as err:
        raise TraitError(f"{here}: {err}") from None
    if guarantee < 0 or (limit >= 0 and limit < guarantee):
        raise TraitError(
            f"{here}: need 0 <= guarantee <= limit"
            + (" (the guarantee is the sum of its pools' guarantees)" if per_pool else "")
        )
    weight, priority = spec.get("weight", 1), spec.get("priority", 0)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0:
        raise TraitError(f"{here}: weight must be > 0, got {shown(weight)}")
    if isinstance(priority, bool) or not (
        isinstance(priority, int) or (isinstance(priority, float) and priority.is_integer())
    ):
        raise TraitError(f"{here}: priority must be a whole number, got {shown(priority)}")
    pools = spec.get("pools", [g for g, _ in per_pool])  # per-pool guarantees: their order by default
    if not isinstance(pools, list) or not all(isinstance(x, str) for x in pools) or len(pools) > MAX_POOLS:
        raise TraitError(f"{here}: pools must be a list of at most {MAX_POOLS} node pool names")
    missing = [g for g, _ in per_pool if g not in pools]
    if missing:
        raise TraitError(f"{here}: guarantee names pools {missing} that are not in its pools {pools}")
    idle_seconds(here, spec)
    order = {g: i for i, g in enumerate(pools)}
    return Project(
        name,
        guarantee,
        float(weight),
        limit,
        int(priority),
        str(spec.get("department", "")),
        tuple(pools),
        tuple(sorted(per_pool, key=lambda pg: order[pg[0]])),
    )


def department_of(name: object, spec: object, where: str = "TrainPool.departments") -> Department:
    """One entry of c.TrainPool.departments, checked."""
    here = f"{where}[{name!r}]"
    if not isinstance(name, str) or not isinstance(spec, dict) or set(spec) - DEPARTMENT_KEYS:
        raise TraitError(f"{here} must be a dict with keys {sorted(DEPARTMENT_KEYS)}")
    try:
        guarantee = parse_gpus(spec.get("guarantee", 0))
        limit = -1 if spec.get("limit") is None else parse_gpus(spec["limit"])
    except UnitError as err:
        raise TraitError(f"{here}: {err}") from None
    if guarantee < 0:
        raise TraitError(f"{here}: the guarantee must be >= 0")
    if limit >= 0 and limit < guarantee:
        raise TraitError(f"{here}: need guarantee <= limit")
    return Department(name, guarantee, limit)


def node_pool_of(name: object, spec: object, where: str = "TrainPool.node_pools") -> NodePool:
    """One entry of c.TrainPool.node_pools, checked ({}: by label, Kubernetes only)."""
    here = f"{where}[{name!r}]"
    if not isinstance(name, str) or not isinstance(spec, dict) or set(spec) - POOL_KEYS:
        raise TraitError(f"{here} must be a dict with some of {sorted(POOL_KEYS)}")
    models, nodes, gpus = (spec.get(k, []) for k in ("models", "nodes", "gpus"))
    if (
        not all(isinstance(v, list) for v in (models, nodes, gpus))
        or not all(isinstance(m, str) for m in models + nodes)
        or not all(isinstance(g, int) and not isinstance(g, bool) and 0 <= g < 1024 for g in gpus)
    ):
        raise TraitError(f"{here}: models and nodes are lists of names, gpus a list of GPU indices")
    return NodePool(name, frozenset(models), frozenset(nodes), frozenset(gpus))


class _Entries(Dict):
    """A dict of {name: spec}, each entry checked by `check(name, spec, where)` as it is read."""

    @staticmethod
    def check(name: object, spec: Any, where: str) -> object:
        raise NotImplementedError

    def validate(self, obj: object, value: Any) -> dict[str, Any]:
        value = super().validate(obj, value)
        for name, spec in value.items():
            self.check(name, spec, _where(obj, self.name))
        return value


class ProjectTable(_Entries):
    """{project: {guarantee, weight, limit, priority, department, pools, users, groups,
    idle_gpu_s}}."""

    info_text = "a dict of {project: {guarantee, ...}}"
    check = staticmethod(project_of)


class DepartmentTable(_Entries):
    """{department: {guarantee, limit}}."""

    info_text = "a dict of {department: {guarantee, limit}}"
    check = staticmethod(department_of)


class NodePoolTable(_Entries):
    """{pool: {models, nodes, gpus}}."""

    info_text = "a dict of {pool: {models, nodes, gpus}}"
    check = staticmethod(node_pool_of)


# JobOptions fields that are kubespawner's settings (enable_user_namespaces and its template,
# slug scheme and labels): a job goes to the namespace its owner's workspace goes to
USER_NAMESPACE_FIELDS = ("user_namespace_template", "slug_scheme", "user_namespace_labels")
# JobOptions fields of the owner's home in the job: TrainPool.home_mount and the workspaces'
# own volumes (KubeSpawner's), never set twice
HOME_FIELDS = ("home_claim", "home_pvc_template", "home_sub_path", "home_mount_path", "home_read_only")


class JobOptionFields(Dict):
    """Fields of gpupool.kube.objects.JobOptions, but those set in their one place elsewhere:
    grace_s (TrainPool.grace_s), node_pool_label and gpu_tolerations (GPUPool's, for workspaces
    and jobs alike), the user namespaces' (KubeSpawner's), the home's (TrainPool.home_mount)."""

    info_text = "a dict of JobOptions fields"

    def validate(self, obj: object, value: Any) -> dict[str, object]:
        from gpupool.kube.objects import JobOptions

        value = super().validate(obj, value)
        known = {f.name for f in dataclasses.fields(JobOptions)} - {
            "grace_s",
            "node_pool_label",
            "gpu_tolerations",
            *USER_NAMESPACE_FIELDS,
            *HOME_FIELDS,
        }
        unknown = set(value) - known
        if unknown:
            raise TraitError(
                f"{_where(obj, self.name)}: unknown keys {sorted(map(str, unknown))}; use {sorted(known)}"
            )
        return value
