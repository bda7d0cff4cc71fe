"""Projects, guarantees and the training pool's knobs (traitlets)."""

from __future__ import annotations

import sys

from traitlets import Dict, Enum, Float, Int, List, TraitError, Unicode, validate
from traitlets.config import Configurable

from ..pool.training import Department, Project
from ..pool.units import UnitError, parse_gpus

PROJECT_KEYS = {"guarantee", "weight", "limit", "priority", "department"}
DEPARTMENT_KEYS = {"guarantee", "limit"}


class TrainPool(Configurable):
    """Train jobs in a shared pool with guaranteed quotas per project."""

    projects = Dict(
        {"default": {"guarantee": 1}},
        config=True,
        help="""Projects (queues) with their guaranteed quota and how they borrow idle GPUs.
        Keys: guarantee (GPUs, always reclaimable), weight (share of idle GPUs lent beyond the
        guarantee, default 1), limit (GPUs at most, default none), priority (higher is served and
        kept first), department (a level above projects, for reports and Kubernetes queues).
        Example::

            c.TrainPool.projects = {
                "vision": {"guarantee": 2, "weight": 2, "limit": 4, "department": "research"},
                "nlp": {"guarantee": 1, "weight": 1, "department": "research"},
                "teaching": {"guarantee": 1, "limit": 1, "priority": 1},
            }
        """,
    )
    departments = Dict(
        {},
        config=True,
        help="""Departments: a quota level above projects (KAI-Scheduler's parent queues). Keys:
        guarantee (GPUs; the guarantees of its projects must add up to no more), limit (GPUs its
        projects may use together, borrowing included; default none). A project joins one with
        its "department" key. Example::

            c.TrainPool.departments = {"research": {"guarantee": 3, "limit": 5}}
        """,
    )
    grace_s = Float(60.0, config=True, help="""Seconds between SIGTERM and SIGKILL when a job is
        preempted or cancelled: time to write a checkpoint. Example::

            c.TrainPool.grace_s = 120
        """)
    tick_s = Float(2.0, config=True, help="""Seconds between scheduling cycles. Example::

            c.TrainPool.tick_s = 5
        """)
    max_queued_per_user = Int(20, config=True, help="""Jobs one user may have waiting at once. Example::

            c.TrainPool.max_queued_per_user = 5
        """)
    jobs_root = Unicode("gpupool-jobs/{username}", config=True, help="""Folder of a user's jobs
        ({username} is replaced); each job gets a sub-folder with its log, code and checkpoint.
        Example::

            c.TrainPool.jobs_root = "/home/{username}/gpupool-jobs"
        """)
    train_gpus = List(Int(), config=True, help="""GPU indices train jobs may use (empty: all): split
        build and train GPUs, or share one pool where build workspaces come first. Example::

            c.TrainPool.train_gpus = [2, 3]
        """)
    run_as = Unicode("owner-if-exists", config=True, help="""Whose Unix account runs a job: "owner" (the
        job owner's account; submissions from users without one are refused), "owner-if-exists"
        (the owner's account when there is one, else the hub's — as SimpleLocalProcessSpawner
        does for workspaces) or "hub". Switching accounts needs the hub to run as root. Example::

            c.TrainPool.run_as = "owner"
        """)

    @validate("run_as")
    def _check_run_as(self, proposal: dict) -> str:
        if proposal["value"] not in ("owner", "owner-if-exists", "hub"):
            raise TraitError("TrainPool.run_as must be owner, owner-if-exists or hub")
        return proposal["value"]

    python = Unicode(sys.executable, config=True, help="""Python that runs the small job wrapper (standard
        library only); it must be executable by the accounts jobs run as. Example::

            c.TrainPool.python = "/usr/bin/python3"
        """)
    placement_policy = Unicode("best-fit", config=True, help="""How train jobs are packed onto GPUs
        (best-fit by default); build workspaces have their own, c.GPUPool.placement_policy.
        Example::

            c.TrainPool.placement_policy = "gpu-packing"
        """)

    runner = Enum(["local", "kubernetes"], "local", config=True, help="""Where train jobs run.
        "local": gpupool schedules them itself and runs them as processes on this machine.
        "kubernetes": each job becomes a batch/v1 Job that KAI-Scheduler (or Kueue) queues, admits,
        preempts and resumes; the hub validates, records and follows it. Set by the gpupool
        chart's apply_chart_config. Example::

            c.TrainPool.runner = "kubernetes"
        """)
    image = Unicode("", config=True, help="""Container image of train jobs on Kubernetes; it needs
        Python, the job's libraries and gpupool (for notebook jobs), like the single-user image.
        Example::

            c.TrainPool.image = "quay.io/jupyter/pytorch-notebook:cuda12-2025-01-06"
        """)
    kube_job_options = Dict({}, config=True, help="""Settings of train Jobs on Kubernetes (fields of
        gpupool.kube.objects.JobOptions: namespace, queue, priority_class, checkpoint_dir,
        checkpoint_size, storage_class, checkpoint_claim, backoff_limit, ttl_after_finished_s,
        service_account, kueue, device_memory_mib; grace_s comes from TrainPool.grace_s).
        Example::

            c.TrainPool.kube_job_options = {"namespace": "jhub", "storage_class": "fast", "kueue": False}
        """)
    gpu_sharing = Unicode("kai", config=True, help="""How a train job's pod asks for GPUs on
        Kubernetes: kai, hami, mig, whole (as GPUKubeSpawner.gpu_sharing). Example::

            c.TrainPool.gpu_sharing = "hami"
        """)

    @validate("kube_job_options")
    def _check_job_options(self, proposal: dict) -> dict:
        import dataclasses

        from ..kube.objects import JobOptions

        known = {f.name for f in dataclasses.fields(JobOptions)} - {"grace_s"}
        unknown = set(proposal["value"]) - known
        if unknown:
            raise TraitError(f"TrainPool.kube_job_options: unknown keys {sorted(unknown)}; use {sorted(known)}")
        return proposal["value"]

    def job_options(self):
        from ..kube.objects import JobOptions

        return JobOptions(**{**self.kube_job_options, "grace_s": int(self.grace_s)})

    @validate("projects")
    def _check_projects(self, proposal: dict) -> dict:
        for name, spec in proposal["value"].items():
            if not isinstance(spec, dict):
                raise TraitError(f"TrainPool.projects[{name!r}] must be a dict")
            unknown = set(spec) - PROJECT_KEYS
            if unknown:
                raise TraitError(f"TrainPool.projects[{name!r}]: unknown keys {sorted(unknown)};"
                                 f" use {sorted(PROJECT_KEYS)}")
        return proposal["value"]

    def department_table(self) -> dict[str, Department]:
        """Departments, checked against the projects that name them."""
        out = {}
        for name, spec in self.departments.items():
            if not isinstance(spec, dict) or set(spec) - DEPARTMENT_KEYS:
                raise TraitError(f"TrainPool.departments[{name!r}] must be a dict with keys {sorted(DEPARTMENT_KEYS)}")
            try:
                guarantee = parse_gpus(spec.get("guarantee", 0))
                limit = -1 if spec.get("limit") is None else parse_gpus(spec["limit"])
            except UnitError as err:
                raise TraitError(f"TrainPool.departments[{name!r}]: {err}") from None
            if limit >= 0 and limit < guarantee:
                raise TraitError(f"TrainPool.departments[{name!r}]: need guarantee <= limit")
            out[name] = Department(name, guarantee, limit)
        projects = self.project_table()
        for p in projects.values():
            if p.department and out and p.department not in out:
                raise TraitError(f"TrainPool.projects[{p.name!r}]: department {p.department!r} is not in"
                                 f" TrainPool.departments ({sorted(out)})")
        for d in out.values():
            total = sum(p.guarantee_milli for p in projects.values() if p.department == d.name)
            if total > d.guarantee_milli:
                raise TraitError(f"TrainPool.departments[{d.name!r}]: its projects' guarantees add up to"
                                 f" {total / 1000:g} GPUs, more than its guarantee of {d.guarantee_milli / 1000:g}")
        return out

    def project_table(self) -> dict[str, Project]:
        out = {}
        for name, spec in self.projects.items():
            try:
                guarantee = parse_gpus(spec.get("guarantee", 0))
                limit = -1 if spec.get("limit") is None else parse_gpus(spec["limit"])
            except UnitError as err:
                raise TraitError(f"TrainPool.projects[{name!r}]: {err}") from None
            if guarantee < 0 or (limit >= 0 and limit < guarantee):
                raise TraitError(f"TrainPool.projects[{name!r}]: need 0 <= guarantee <= limit")
            weight = float(spec.get("weight", 1))
            if weight <= 0:
                raise TraitError(f"TrainPool.projects[{name!r}]: weight must be > 0")
            out[name] = Project(name, guarantee, weight, limit, int(spec.get("priority", 0)),
                                str(spec.get("department", "")))
        return out
