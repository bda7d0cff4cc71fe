"""Projects, guarantees and the training pool's knobs (traitlets)."""

from __future__ import annotations

import sys
from typing import Any

from traitlets import Bool, Enum, Float, Int, List, TraitError, Unicode, validate
from traitlets.config import LoggingConfigurable

from gpupool.pool.training import Department, Project
from gpupool.train.traits import (
    DepartmentTable,
    JobOptionFields,
    NodePoolTable,
    ProjectTable,
    department_of,
    idle_seconds,
    node_pool_of,
    project_of,
)
from gpupool.vocab.culling import IDLE_UTIL_PCT


class TrainPool(LoggingConfigurable):
    """Train jobs in a shared pool with guaranteed quotas per project."""

    projects = ProjectTable(
        {"default": {"guarantee": 1}},
        config=True,
        help="""Projects (queues) with their guaranteed quota and how they borrow idle GPUs.
        Keys: guarantee (GPUs, always reclaimable; or GPUs per node pool, {"dgx": 4,
        "workstations": 2}, each reclaimed within its pool), weight (share of idle GPUs lent beyond the
        guarantee, default 1), limit (GPUs at most, default none), priority (higher is served and
        kept first), department (a level above projects, for reports and Kubernetes queues),
        idle_gpu_s (stop a train job whose GPUs stay idle this long; default: never), pools (the
        node pools its jobs may use, in order of preference; default: every GPU),
        users and groups (who may submit: hub user names and hub group names; a project with
        neither list is open to every user; admins may always submit). Example::

            c.TrainPool.projects = {
                "vision": {"guarantee": 2, "weight": 2, "limit": 4, "department": "research",
                           "groups": ["vision-lab"], "users": ["ada"]},
                "nlp": {"guarantee": 1, "weight": 1, "department": "research", "groups": ["nlp"]},
                "teaching": {"guarantee": 1, "limit": 1, "priority": 1},  # everyone
                "robots": {"guarantee": {"dgx": 4, "workstations": 2}, "limit": 8},  # per pool
            }
        """,
    )
    departments = DepartmentTable(
        {},
        config=True,
        help="""Departments: a quota level above projects (KAI-Scheduler's parent queues). Keys:
        guarantee (GPUs; the guarantees of its projects must add up to no more), limit (GPUs its
        projects may use together, borrowing included; default none). A project joins one with
        its "department" key. Example::

            c.TrainPool.departments = {"research": {"guarantee": 3, "limit": 5}}
        """,
    )
    reserve_after_s = Float(
        1800.0,
        config=True,
        help="""Seconds an in-quota job of several GPUs
        waits before a node is reserved for it, so that a stream of small jobs cannot starve it:
        the reserved node's free GPUs are held for it, backfilled only by jobs whose declared
        max runtime ends before it could start, or by other projects' borrowers (reclaimable).
        A negative value turns reservations off. Example::

            c.TrainPool.reserve_after_s = 600
        """,
    )
    grace_s = Float(
        60.0,
        config=True,
        help="""Seconds between SIGTERM and SIGKILL when a job is
        preempted or cancelled: time to write a checkpoint. Example::

            c.TrainPool.grace_s = 120
        """,
    )
    stop_jobs_at_stop = Bool(
        False,
        config=True,
        help="""End the running train jobs when the hub stops (SIGTERM, Ctrl-C): they
        go back to the queue and resume from their checkpoints at the next start. Off: they keep
        running as their users' accounts, the hub says so at stop, and the next start adopts them
        (as after a crash). `gpupool up --stop-jobs` turns it on. Example::

            c.TrainPool.stop_jobs_at_stop = True
        """,
    )
    tick_s = Float(
        2.0,
        config=True,
        help="""Seconds between scheduling cycles. Example::

            c.TrainPool.tick_s = 5
        """,
    )
    usage_relist_s = Float(
        60.0,
        min=5.0,
        config=True,
        help="""On Kubernetes: seconds between lists of the train pods whose lifetimes are
        the train jobs' GPU-hours in the usage report (a pod deleted between two lists is
        counted until the last list that saw it). Example::

            c.TrainPool.usage_relist_s = 30
        """,
    )
    usage_finalizer = Bool(
        True,
        config=True,
        help="""On Kubernetes: put the finalizer gpupool.io/usage on train pods (through the
        Job's pod template), so that a pod deleted while the hub is down (a preemption, a
        cancel, a node drain) stays until the hub's next list of train pods has recorded its
        end: its GPU-hours are then exact. The hub takes it off at that list (every
        usage_relist_s), so a deleted train pod lingers, its containers ended, up to one
        interval. `helm uninstall` of gpupool's chart takes it off every train pod first (its
        pre-delete hook); without the chart (or after `--no-hooks`) a pod left with it once the
        hub is gone goes with `kubectl patch pod NAME --type=strategic -p
        '{"metadata":{"$deleteFromPrimitiveList/finalizers":["gpupool.io/usage"]}}'`. Off: a
        pod deleted between two lists is counted until the last list that saw it alive.
        Example::

            c.TrainPool.usage_finalizer = False
        """,
    )
    max_queued_per_user = Int(
        20,
        min=0,
        config=True,
        help="""Jobs one user may have waiting at once; a
        submission over it is refused (429). Example::

            c.TrainPool.max_queued_per_user = 5
        """,
    )
    max_active_per_user = Int(
        50,
        min=0,
        config=True,
        help="""Jobs one user may have queued and running
        together (a sweep counts each of its runs); over it a submission is refused (429). Example::

            c.TrainPool.max_active_per_user = 20
        """,
    )
    max_active_per_project = Int(
        500,
        min=0,
        config=True,
        help="""Jobs a project may have queued and
        running together, all its users' together; over it a submission is refused (429). Example::

            c.TrainPool.max_active_per_project = 100
        """,
    )
    max_submissions_per_minute = Int(
        30,
        min=1,
        config=True,
        help="""Job submissions (requests, a sweep
        is one) one user may make in any 60 seconds; more are refused (429) until the minute has
        passed. Example::

            c.TrainPool.max_submissions_per_minute = 10
        """,
    )
    max_code_kib = Int(
        1024,
        min=1,
        max=2048,
        config=True,
        help="""Largest code a job may carry: a
        script, a cell's code or a notebook, in KiB as sent (at most 2048: the API's request limit).
        Larger is refused (413). Example::

            c.TrainPool.max_code_kib = 256
        """,
    )
    max_cells = Int(
        1000,
        min=1,
        max=100_000,
        config=True,
        help="""Most cells a code or notebook job may
        have; more is refused (413) before anything is parsed. Example::

            c.TrainPool.max_cells = 300
        """,
    )
    max_sweep_runs = Int(
        20,  # at most max_queued_per_user's default: a sweep the limit allows is never refused for the queue
        min=1,
        max=1000,
        config=True,
        help="""Most runs (combinations of values)
        one sweep may submit; more is refused (400). Each run waits as a job of its own, so a sweep
        also has to fit max_queued_per_user and max_active_per_user. Example::

            c.TrainPool.max_sweep_runs = 16
        """,
    )
    max_log_mib = Int(
        100,
        min=0,
        config=True,
        help="""Size of a job's log in MiB: past it the log gets a
        line saying so and the rest of the job's output is dropped; the job goes on (0: no limit).
        Example::

            c.TrainPool.max_log_mib = 20
        """,
    )
    max_job_folder_mib = Int(
        10 * 1024,
        min=0,
        config=True,
        help="""Disk space a running job's folder
        (checkpoints, outputs, its log) may use, in MiB; a job over it is stopped and fails with the
        reason (0: no limit). Measured every folder_check_s. Example::

            c.TrainPool.max_job_folder_mib = 50 * 1024
        """,
    )
    folder_check_s = Float(
        60.0,
        min=1.0,
        config=True,
        help="""Seconds between measurements of running
        jobs' folders (max_job_folder_mib) and clean-ups of finished ones (keep_finished_days).
        Example::

            c.TrainPool.folder_check_s = 300
        """,
    )
    keep_finished_days = Float(
        14.0,
        min=0.0,
        config=True,
        help="""Days a finished (succeeded, failed or
        cancelled) job's folder is kept; then it is removed, its record stays (0: keep forever).
        Example::

            c.TrainPool.keep_finished_days = 30
        """,
    )
    job_path = Unicode(
        "",
        config=True,
        help="""PATH of train jobs; empty: the folder of
        c.TrainPool.python, then /usr/local/bin:/usr/bin:/bin (never the hub's own PATH). Example::

            c.TrainPool.job_path = "/opt/conda/bin:/usr/local/bin:/usr/bin:/bin"
        """,
    )
    jobs_root = Unicode(
        "gpupool-jobs/{username}",
        config=True,
        help="""Folder of a user's jobs
        ({username} is replaced); each job gets a sub-folder with its log, code and checkpoint.
        Example::

            c.TrainPool.jobs_root = "/home/{username}/gpupool-jobs"
        """,
    )
    train_gpus = List(
        Int(),
        config=True,
        help="""GPU indices train jobs may use (empty: all): split
        build and train GPUs, or share one pool where build workspaces come first. Example::

            c.TrainPool.train_gpus = [2, 3]
        """,
    )
    run_as = Unicode(
        "owner-if-exists",
        config=True,
        help="""Whose Unix account runs a job: "owner" (the
        job owner's account; submissions from users without one are refused), "owner-if-exists"
        (the owner's account when there is one, else the hub's — as SimpleLocalProcessSpawner
        does for workspaces) or "hub". Switching accounts needs the hub to run as root. Example::

            c.TrainPool.run_as = "owner"
        """,
    )

    node_pools = NodePoolTable(
        {},
        config=True,
        help="""Named groups of GPUs (KAI-Scheduler's node pools) that
        projects choose with their "pools" key, in order of preference. A pool takes the GPUs
        that match every key it gives: models (GPU model names), nodes (node names), gpus (GPU
        indices). On Kubernetes, models match GPU feature discovery's nvidia.com/gpu.product,
        nodes the host name, and a pool given as {} is the nodes labelled
        gpupool.io/node-pool=<name>; GPU indices mean nothing there. Example::

            c.TrainPool.node_pools = {
                "workstations": {"models": ["NVIDIA RTX A2000"]},
                "dgx": {"models": ["NVIDIA H100 80GB HBM3"]},
            }
            c.TrainPool.projects = {"vision": {"guarantee": 8, "pools": ["dgx", "workstations"]}}
        """,
    )

    def pool_table(self):
        """The node pools (each checked by its trait), checked against the projects that name
        them."""
        out = {name: node_pool_of(name, spec) for name, spec in self.node_pools.items()}
        for p in self.project_table().values():
            unknown = set(p.pools) - set(out)
            if unknown:
                raise TraitError(
                    f"TrainPool.projects[{p.name!r}]: pools {sorted(unknown)} are not in"
                    f" TrainPool.node_pools ({sorted(out)})"
                )
        return out

    idle_warn_s = Float(
        300.0,
        config=True,
        help="""Seconds before an idle train job is stopped (a
        project's idle_gpu_s) that a warning is written to its log. Example::

            c.TrainPool.idle_warn_s = 600
        """,
    )

    def gpu_use_source(self, culler: tuple[str, str, str]) -> tuple[str, str, str]:
        """(sampler, argument, token file) that measures train jobs' GPU use. `culler`: the idle
        culler's (c.IdleCuller.sampler, sampler_arg, node_agent_token_file), which the hub's
        set-up passes (train/ never imports the culler). The culler's demo sampler (users say what
        their workspace's GPU does) knows nothing of jobs: nvml then."""
        return ("nvml", "", "") if culler[0] == "demo" else culler

    def idle_rules(self, util_pct: float | None = None):
        """Per project: the rule for its idle train jobs (projects without idle_gpu_s: none).
        `util_pct`: c.IdleCuller.util_threshold_pct, which the hub's set-up passes."""
        from gpupool.train.idle import IdleRule

        out = {}
        threshold = IDLE_UTIL_PCT if util_pct is None else util_pct
        for name, spec in self.projects.items():
            idle_s = idle_seconds(f"TrainPool.projects[{name!r}]", spec)
            if idle_s:
                out[name] = IdleRule(idle_s, min(self.idle_warn_s, idle_s), threshold)
        return out

    @validate("run_as")
    def _check_run_as(self, proposal: dict[str, Any]) -> str:
        if proposal["value"] not in ("owner", "owner-if-exists", "hub"):
            raise TraitError("TrainPool.run_as must be owner, owner-if-exists or hub")
        return proposal["value"]

    python = Unicode(
        sys.executable,
        config=True,
        help="""Python that runs the small job wrapper (standard
        library only); it must be executable by the accounts jobs run as. Example::

            c.TrainPool.python = "/usr/bin/python3"
        """,
    )
    placement_policy = Unicode(
        "best-fit",
        config=True,
        help="""How train jobs are packed onto GPUs:
        best-fit (default), first-fit, gpu-packing, spread, random, fgd, frag-aware. Build
        workspaces are placed by c.GPUPool.build_placement_policy. Example::

            c.TrainPool.placement_policy = "gpu-packing"
        """,
    )

    runner = Enum(
        ["local", "kubernetes"],
        "local",
        config=True,
        help="""Where train jobs run.
        "local": gpupool schedules them itself and runs them as processes on this machine.
        "kubernetes": each job becomes a batch/v1 Job that KAI-Scheduler (or Kueue) queues, admits,
        preempts and resumes; the hub validates, records and follows it. The gpupool chart
        renders it into the hub's config (hub-config.json). Example::

            c.TrainPool.runner = "kubernetes"
        """,
    )
    image = Unicode(
        "",
        config=True,
        help="""Container image of train jobs on Kubernetes; it needs
        Python, the job's libraries and gpupool (for notebook jobs), like the single-user image.
        Empty: the workspaces' image (c.KubeSpawner.image, which z2jh sets from singleuser.image),
        where the notebook the job came from already runs.
        Example::

            c.TrainPool.image = "registry.example.org/gpupool-singleuser:0.1.0"
        """,
    )
    kube_job_options = JobOptionFields(
        {},
        config=True,
        help="""Settings of train Jobs on Kubernetes (fields of
        gpupool.kube.objects.JobOptions: namespace, queue, priority_class, high_priority_class, checkpoint_dir,
        checkpoint_size, storage_class, checkpoint_claim, backoff_limit, ttl_after_finished_s,
        service_account, kueue, device_memory_mib, startup_dir (default: the workspaces'
        c.GPUKubeSpawner.hibernate_startup_dir when jobs run in their image); fitting the pods to the cluster: tolerations,
        node_selector, affinity, resources, project_resources, image_pull_secrets,
        pod_security_context, container_security_context, automount_service_account_token;
        grace_s is TrainPool.grace_s, the node pool label GPUPool.node_pool_label, the GPU
        nodes' tolerations GPUPool.gpu_tolerations).
        Example::

            c.TrainPool.kube_job_options = {"namespace": "jhub", "storage_class": "fast", "kueue": False}
            c.TrainPool.kube_job_options = {
                "resources": {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "32Gi"}},
                "project_resources": {"vision": {"requests": {"memory": "16Gi"}}},
                "node_selector": {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
                "image_pull_secrets": ["my-registry"],
            }
        """,
    )

    home_mount = Enum(
        ["off", "read-only", "read-write"],
        "off",
        config=True,
        help="""On Kubernetes: mount each train job's owner's home, the claim their workspace
        mounts at home_mount_path (KubeSpawner.volume_mounts, named as kubespawner names it:
        z2jh's claim-<user>), into the job's pod at the same path, so a `%%train` cell reads
        the files its notebook reads. "read-write" lets the job write there too, beside the
        running notebook (the same files from two places: last writer wins). A ReadWriteOnce
        home (z2jh's default storage) is attached to one node: the job is then placed on the
        node where the user's server runs (it may wait there for GPUs), and refused with the
        reason when no server of theirs runs; ReadWriteMany storage (NFS, CephFS, Filestore)
        lets jobs run anywhere. "off": jobs see their code and checkpoints only. Example::

            c.TrainPool.home_mount = "read-only"
        """,
    )
    home_mount_path = Unicode(
        "/home/jovyan",
        config=True,
        help="""With home_mount: where the workspaces mount their home, as written in
        KubeSpawner.volume_mounts (z2jh: singleuser.storage.homeMountPath; a template such as
        /home/{username} is matched as written and expanded for each owner). Example::

            c.TrainPool.home_mount_path = "/home/{username}"
        """,
    )

    kube_logs_dir = Unicode(
        "gpupool-train-logs",
        config=True,
        help="""On Kubernetes: the folder, on the hub's own
        storage, where the hub keeps each train job's log (its pods' output, followed as they run
        and cut at max_log_mib with a note, as on one machine), so the job's page shows it after
        its pods are gone. Relative paths are from the hub's working folder (z2jh: the hub's
        volume, beside gpupool.sqlite). Empty: no log is kept; a job's log is its newest pod's
        while that pod exists. Example::

            c.TrainPool.kube_logs_dir = "/srv/jupyterhub/gpupool-train-logs"
        """,
    )
    kube_log_streams = Int(
        200,
        min=1,
        max=5000,
        config=True,
        help="""On Kubernetes: most pod logs the hub follows at
        once (kube_logs_dir), each an open connection to the API server for the pod's life; a pod
        over it is copied from its start once a slot is free. Example::

            c.TrainPool.kube_log_streams = 500
        """,
    )

    def kube_image(self) -> str:
        """The train Jobs' image: c.TrainPool.image, else the workspaces' (GPUKubeSpawner's, then
        KubeSpawner's as set in the config): a notebook job needs gpupool and the notebook's own
        libraries, which the image its notebook ran in has. Empty when neither is set."""
        if self.image:
            return self.image
        for section in ("GPUKubeSpawner", "KubeSpawner"):
            if section in self.config and "image" in self.config[section]:
                return str(self.config[section].image)
        return ""

    def sharing(self) -> str:
        """How train job pods ask for GPUs: c.GPUPool.gpu_sharing (one setting for workspaces and
        train jobs)."""
        from gpupool.settings.config import GPUPool

        return GPUPool(config=self.config).gpu_sharing

    def job_options(self):
        """The train Jobs' settings: kube_job_options, with grace_s (TrainPool.grace_s),
        node_pool_label and gpu_tolerations (GPUPool's) from their one place."""
        from gpupool.kube.objects import JobOptions
        from gpupool.settings.config import GPUPool

        opts = {**self.kube_job_options, "grace_s": int(self.grace_s)}
        opts.setdefault("work_size_mib", int(self.max_job_folder_mib))  # one limit on both runners
        opts.setdefault("usage_finalizer", bool(self.usage_finalizer))  # the hub relists: it takes it off
        shared = GPUPool(config=self.config)
        opts["node_pool_label"] = shared.node_pool_label
        opts["gpu_tolerations"] = [dict(t) for t in shared.gpu_tolerations]  # one setting: workspaces too
        spawner = self.config.get("GPUKubeSpawner") if "GPUKubeSpawner" in self.config else None
        if "startup_dir" not in opts and not self.image and spawner and "hibernate_startup_dir" in spawner:
            # jobs run in the workspaces' image: its start-up hook is where the spawner's is, and
            # caps a fractional job's PyTorch at its share as it caps the notebook's
            opts["startup_dir"] = str(spawner.hibernate_startup_dir)
        opts.update(self.user_namespaces())
        opts.update(self.home_options())
        return JobOptions(**opts)

    def kubespawner_setting(self, name: str) -> Any:
        """KubeSpawner's setting as the workspaces get it: GPUKubeSpawner's over KubeSpawner's,
        else kubespawner's default."""
        for section in ("GPUKubeSpawner", "KubeSpawner"):
            if section in self.config and name in self.config[section]:
                return self.config[section][name]
        from kubespawner import KubeSpawner

        # default(), not default_value: a Dict's or a List's class default is unset there
        return KubeSpawner.class_traits()[name].default()

    def home_options(self) -> dict[str, object]:
        """The JobOptions of the owner's home in their jobs (home_mount): the claim and subPath
        the workspaces mount at home_mount_path, and kubespawner's pvc_name_template. A home
        that cannot be found in the workspaces' volumes stops the hub here, with the reason."""
        if self.home_mount == "off":
            return {}
        from gpupool.kube.home_mount import find_home

        setting = self.kubespawner_setting
        try:
            claim, sub_path = find_home(setting("volumes"), setting("volume_mounts"), self.home_mount_path)
        except ValueError as err:
            raise TraitError(f"c.TrainPool.home_mount: {err}") from None
        return {
            "home_claim": claim,
            "home_pvc_template": str(setting("pvc_name_template")),
            "home_sub_path": sub_path,
            "home_mount_path": self.home_mount_path,
            "home_read_only": self.home_mount == "read-only",
            # kubespawner's names are its slug scheme's, with or without user namespaces
            "slug_scheme": str(setting("slug_scheme")),
        }

    def user_namespaces(self) -> dict[str, Any]:
        """With kubespawner's enable_user_namespaces, its template, slug scheme and namespace
        labels (GPUKubeSpawner's over KubeSpawner's, else kubespawner's defaults): train Jobs go
        to the namespace their owner's workspace goes to (gpupool.kube.job_namespace). Empty
        without: every Job in the hub's namespace."""
        setting = self.kubespawner_setting
        if not setting("enable_user_namespaces"):
            return {}
        return {
            "user_namespace_template": str(setting("user_namespace_template")),
            "slug_scheme": str(setting("slug_scheme")),
            "user_namespace_labels": {
                str(k): str(v) for k, v in dict(setting("user_namespace_labels")).items()
            },
        }

    def may_submit(self, project: str, user: str, groups: tuple[str, ...] | list[str], admin: bool) -> bool:
        """Membership: admins always; a project without users and groups lists is open to all."""
        # checked by the validator above; traitlets types the table by its default's values (ints)
        spec: dict[str, Any] | None = self.projects.get(project)
        if spec is None:
            return False
        users, allowed_groups = spec.get("users"), spec.get("groups")
        if admin or (users is None and allowed_groups is None):
            return True
        return user in (users or ()) or bool(set(groups) & set(allowed_groups or ()))

    def projects_for(self, user: str, groups: tuple[str, ...] | list[str], admin: bool) -> list[str]:
        return sorted(p for p in self.projects if self.may_submit(p, user, groups, admin))

    def department_table(self) -> dict[str, Department]:
        """Departments (each checked by its trait), checked against the projects that name them."""
        out = {name: department_of(name, spec) for name, spec in self.departments.items()}
        projects = self.project_table()
        for p in projects.values():
            if p.department and out and p.department not in out:
                raise TraitError(
                    f"TrainPool.projects[{p.name!r}]: department {p.department!r} is not in"
                    f" TrainPool.departments ({sorted(out)})"
                )
        for d in out.values():
            total = sum(p.guarantee_milli for p in projects.values() if p.department == d.name)
            if total > d.guarantee_milli:
                raise TraitError(
                    f"TrainPool.departments[{d.name!r}]: its projects' guarantees add up to"
                    f" {total / 1000:g} GPUs, more than its guarantee of {d.guarantee_milli / 1000:g}"
                )
        return out

    def project_table(self) -> dict[str, Project]:
        """The projects, each checked by its trait."""
        return {name: project_of(name, spec) for name, spec in self.projects.items()}
