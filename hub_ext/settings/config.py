"""Admin configuration, as traitlets: every option has a help text with an example.

Set these in `jupyterhub_config.py` (`c.GPUPool.default_build_quota = 0.5`) or in a
gpupool config file (`gpupool up --config gpupool_config.py`); `gpupool up
--generate-config` writes a commented file with all of them.
"""

from __future__ import annotations

from traitlets import Bool, Dict, Enum, Int, List, Unicode
from traitlets.config import LoggingConfigurable

from gpupool.pool import BuildLimits, BuildQuotaPolicy
from gpupool.settings.quota_traits import (
    GROUP_NAME,
    GPUs,
    GPUSizes,
    GroupLimits,
    GroupTotals,
    PoolNames,
    WorkspaceCount,
    gpus_milli,
    pool_names,
    sizes_milli,
)
from gpupool.vocab.cluster import GPU_TOLERATION, KAI_NODE_POOL, SHARING_BACKENDS

__all__ = ["GROUP_NAME", "QUOTA_KEYS", "GPUPool", "policy_from_document", "quota_document", "quota_notes"]

# the options an admin may also change at run time through the API (PUT api/quotas)
QUOTA_KEYS = (
    "default_build_quota",
    "allowed_fractions",
    "max_gpus_per_workspace",
    "max_workspaces_per_user",
    "group_overrides",
    "group_totals",
    "build_pools",
)


class GPUPool(LoggingConfigurable):
    """GPU pool settings shared by the hub extension, the spawners and the API."""

    db_url = Unicode(
        "sqlite:///gpupool.sqlite",
        config=True,
        help="""SQLAlchemy URL of the database that keeps allocations, jobs and events.

        The default is an SQLite file in the hub's working directory. Example::

            c.GPUPool.db_url = "postgresql+psycopg://gpupool@db/gpupool"
        """,
    )

    min_free_disk_mib = Int(
        256,
        min=0,
        config=True,
        help="""MiB kept free on the disk that holds the hub's SQLite databases: below
        it no server or train job starts (507, with the reason) and the scheduler admits none, so
        that users' files — homes and job folders, on that disk in `gpupool up` — cannot take the
        space the hub needs to record what runs. What already runs goes on (a job's folder has its
        own limit, c.TrainPool.max_job_folder_mib). 0: no reserve. Example::

            c.GPUPool.min_free_disk_mib = 4096
        """,
    )

    use_nvml = Bool(
        True,
        config=True,
        help="""Discover GPUs with NVML (nvidia-ml-py). Turn off to use only virtual GPUs.

        Example::

            c.GPUPool.use_nvml = False
        """,
    )

    gpu_inventory = Enum(
        ["local", "kubernetes"],
        "local",
        config=True,
        help="""Where the GPUs that build quotas count against come from. "local": NVML on this
        machine, else `virtual_gpus`. "kubernetes": the cluster's nodes, read when the hub
        starts: each node's allocatable nvidia.com/gpu and the GPU Operator's labels
        (nvidia.com/gpu.product, nvidia.com/gpu.memory), so a fraction's memory is the real
        card's; the hub's account needs to list nodes (the gpupool chart grants it). The gpupool
        chart sets it. Example::

            c.GPUPool.gpu_inventory = "kubernetes"
        """,
    )

    virtual_gpus = Int(
        0,
        config=True,
        help="""Number of virtual GPUs to declare when NVML finds none.

        Virtual GPUs are labelled as such in the spawn form, the API and the logs: the
        whole flow (fractions, quotas, culling) can be tried on a laptop or in CI.
        Example::

            c.GPUPool.virtual_gpus = 4
        """,
    )

    virtual_gpu_memory_mib = Int(
        16384,
        config=True,
        help="""Memory of each virtual GPU in MiB. Example::

            c.GPUPool.virtual_gpu_memory_mib = 81559  # like an H100 80GB
        """,
    )

    build_placement_policy = Unicode(
        "frag-aware",
        config=True,
        help="""How build workspaces (notebook servers) are placed onto GPUs: frag-aware
        (default; keeps GPUs from fragmenting, learning the workload online), fgd, best-fit,
        first-fit, gpu-packing, spread, random. `gpupool simulate --help` compares them. Train
        jobs are placed by c.TrainPool.placement_policy. Example::

            c.GPUPool.build_placement_policy = "best-fit"
        """,
    )

    default_build_quota = GPUs(
        1.0,
        config=True,
        help="""Fixed build quota of every user, in GPUs, across all their workspaces.

        Example (half a GPU each)::

            c.GPUPool.default_build_quota = 0.5
        """,
    )

    allowed_fractions = GPUSizes(
        [0.1, 0.25, 0.5, 1.0],
        config=True,
        help="""GPU sizes offered on the spawn form, in GPUs. Values below 1 are fractions of
        one GPU; values of 1 and more must be whole GPUs. Example::

            c.GPUPool.allowed_fractions = [0.1, 0.25, 0.5, 1, 2]
        """,
    )

    max_gpus_per_workspace = GPUs(
        1.0,
        config=True,
        help="""Largest GPU size a single workspace may hold. Example::

            c.GPUPool.max_gpus_per_workspace = 2
        """,
    )

    max_workspaces_per_user = WorkspaceCount(
        2,
        config=True,
        help="""How many GPU workspaces (named servers) one user may run at once. Example::

            c.GPUPool.max_workspaces_per_user = 1
        """,
    )

    group_overrides = GroupLimits(
        config=True,
        help="""Per-group build limits. A user in several groups gets the most generous value of
        each key. Keys: quota, fractions, max_per_workspace (GPUs), max_workspaces, pools (the
        node pools of c.TrainPool.node_pools its workspaces may use, in order of preference).
        Missing keys fall back to the defaults above. Example::

            c.GPUPool.group_overrides = {
                "researchers": {"quota": 2, "fractions": [0.5, 1, 2], "max_per_workspace": 2,
                                "pools": ["workstations", "dgx"]},
                "students": {"quota": 0.25, "fractions": [0.1, 0.25], "max_workspaces": 1},
            }
        """,
    )

    build_pools = PoolNames(
        config=True,
        help="""Node pools (defined in c.TrainPool.node_pools) that build workspaces may use, in
        order of preference; empty: every GPU. A group's "pools" in group_overrides replaces
        it for its members. The spawn form lets a user pick one of them. Example::

            c.GPUPool.build_pools = ["workstations"]
        """,
    )

    group_totals = GroupTotals(
        config=True,
        help="""Optional ceiling, in GPUs, on what all members of a group hold together.
        Example (a class of 30 shares 2 GPUs)::

            c.GPUPool.group_totals = {"cs101": 2}
        """,
    )

    mps_pipe_directory = Unicode(
        "",
        config=True,
        help="""CUDA MPS pipe directory of a running MPS control daemon. When set, workspaces get
        CUDA_MPS_PIPE_DIRECTORY plus CUDA_MPS_PINNED_DEVICE_MEM_LIMIT and
        CUDA_MPS_ACTIVE_THREAD_PERCENTAGE matching their fraction. Example::

            c.GPUPool.mps_pipe_directory = "/tmp/nvidia-mps"
        """,
    )

    gpu_context_mib = Int(
        500,
        min=0,
        max=1 << 20,
        config=True,
        help="""GPU memory (MiB) each CUDA context takes outside a
        framework's allocator. A share's memory cap (GPUPOOL_GPU_MEMORY_MIB, the PyTorch hook's
        limit, MPS's pinned limit) is its part of the GPU's memory less the driver's reserve, less
        this: shares filled to their caps then never run a neighbour out of memory. The default is
        an estimate, not a measurement: measure it on your GPUs (one process that only initialises
        CUDA, its memory in nvidia-smi) and set it. Example::

            c.GPUPool.gpu_context_mib = 420
        """,
    )

    api_ip = Unicode(
        "127.0.0.1",
        config=True,
        help="""Address the gpupool API listens on inside the hub process. Example::

            c.GPUPool.api_ip = "0.0.0.0"  # in a hub pod
        """,
    )

    api_port = Int(
        8095,
        config=True,
        help="""Port of the gpupool API (reached through the proxy at /services/gpupool/). Example::

            c.GPUPool.api_port = 8095
        """,
    )

    api_url = Unicode(
        "",
        config=True,
        help="""URL at which workspaces reach the gpupool API (notebook widgets use it).

        Default: built from api_ip and api_port, which fits the embedded hub. On Kubernetes,
        the hub Service's address. Example::

            c.GPUPool.api_url = "http://hub:8095/services/gpupool/"
        """,
    )

    gpu_sharing = Unicode(
        "kai",
        config=True,
        help=f"""Kubernetes: how a GPU share reaches a pod, for build workspaces and train jobs
        alike: {", ".join(SHARING_BACKENDS)}, or the import path of a
        `gpupool.gpu.sharing.SharingBackend` subclass. kai: KAI-Scheduler with a gpu-fraction
        annotation (needs KAI's global.gpuSharing=true); hami: nvidia.com/gpucores and gpumem;
        mig: a MIG profile per fraction; whole: whole GPUs only. A subclass reads its own pod
        fields back (`read_fraction`, `read_annotations`) for the quota check, which refuses a
        GPU resource no backend reads. The gpupool chart sets it from `sharing.backend`. Example::

            c.GPUPool.gpu_sharing = "hami"
        """,
    )

    node_pool_label = Unicode(
        KAI_NODE_POOL,
        config=True,
        help="""Kubernetes: node label of the node pools (c.TrainPool.node_pools) defined by
        neither models nor nodes: a workspace or train job on such a pool gets node affinity to
        `<label>=<pool>`. KAI's label by default: with KAI every pool is a scheduling shard whose
        nodes carry it. Pools by model match GPU feature discovery's nvidia.com/gpu.product,
        pools by node the host name. Example::

            c.GPUPool.node_pool_label = "gpupool.io/node-pool"
        """,
    )

    gpu_tolerations = List(
        Dict(),
        [dict(GPU_TOLERATION)],
        config=True,
        help="""Kubernetes: tolerations added to every workspace and train pod with a GPU share
        (pods without one stay off tainted GPU nodes). GPU nodes are usually tainted (GKE:
        nvidia.com/gpu=present:NoSchedule); a pod asking for whole GPUs may get the toleration
        from the ExtendedResourceToleration admission plugin, but a fractional pod asks for no
        nvidia.com/gpu and gets nothing, so the scheduler never places it there. The default
        tolerates the nvidia.com/gpu taint of any value. The gpupool chart sets it from
        `gpuNodes.tolerations`. Example::

            c.GPUPool.gpu_tolerations = [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
            ]
        """,
    )

    def api_url_for_servers(self, hub_base_url: str = "/hub/") -> str:
        if self.api_url:
            return self.api_url
        host = "127.0.0.1" if self.api_ip in ("", "0.0.0.0") else self.api_ip
        prefix = hub_base_url[: -len("hub/")] if hub_base_url.endswith("hub/") else "/"
        return f"http://{host}:{self.api_port}{prefix}services/gpupool/"

    def quota_policy(self) -> BuildQuotaPolicy:
        """The pure policy object the manager enforces (every value was checked by its trait)."""
        default = BuildLimits(
            quota_milli=gpus_milli(self.default_build_quota, "GPUPool.default_build_quota"),
            sizes_milli=sizes_milli(self.allowed_fractions, "GPUPool.allowed_fractions"),
            max_per_workspace_milli=gpus_milli(self.max_gpus_per_workspace, "GPUPool.max_gpus_per_workspace"),
            max_workspaces=self.max_workspaces_per_user,
            pools=tuple(self.build_pools),
        )
        overrides = {}
        for group, lim in self.group_overrides.items():
            where = f"GPUPool.group_overrides[{group!r}]"
            overrides[group] = BuildLimits(
                quota_milli=gpus_milli(lim.get("quota", self.default_build_quota), where),
                sizes_milli=sizes_milli(lim.get("fractions", self.allowed_fractions), where),
                max_per_workspace_milli=gpus_milli(
                    lim.get("max_per_workspace", self.max_gpus_per_workspace), where
                ),
                max_workspaces=lim.get("max_workspaces", self.max_workspaces_per_user),
                pools=pool_names(lim.get("pools", self.build_pools), where),
            )
        totals = {g: gpus_milli(v, f"GPUPool.group_totals[{g!r}]") for g, v in self.group_totals.items()}
        return BuildQuotaPolicy(default=default, group_overrides=overrides, group_totals_milli=totals)


def quota_document(cfg: GPUPool) -> dict[str, object]:
    """The quota options as plain JSON, in GPUs like the config file."""
    return {key: getattr(cfg, key) for key in QUOTA_KEYS}


def policy_from_document(doc: dict[str, object]) -> BuildQuotaPolicy:
    """Validate quota options exactly as the config file is validated (TraitError on a
    bad value, ValueError on an unknown key)."""
    unknown = set(doc) - set(QUOTA_KEYS)
    if unknown:
        raise ValueError(f"unknown quota options {sorted(unknown)}; use {list(QUOTA_KEYS)}")
    return GPUPool(**doc).quota_policy()


def quota_notes(policy: BuildQuotaPolicy) -> list[str]:
    """What a quota setting means when it shuts people out: said back to the admin who saved it
    (a default of 0 is allowed, for hubs where only some groups get GPUs, but never silently)."""
    notes = []
    if policy.default.quota_milli == 0:
        notes.append(
            "the default build quota is 0: users in no group with a quota of its own cannot start"
            " a GPU workspace"
        )
    notes += [
        f"group {g!r} has a build quota of 0: its members cannot start a GPU workspace (unless another"
        " of their groups allows it)"
        for g, lim in sorted(policy.group_overrides.items())
        if lim.quota_milli == 0
    ]
    notes += [
        f"group {g!r} has a total of 0: its members cannot start a GPU workspace"
        for g, total in sorted(policy.group_totals_milli.items())
        if total == 0
    ]
    return notes
