"""The composition root of the hub side: one `GPUPoolHub` per hub, built once from the traitlets
config by `configure(c)`. It owns the settings (c.GPUPool), the PoolManager (store, inventory,
quotas, node pools), the workload cgroups, and what runs once the hub has started (the gpupool
API, the training back-end, parking, usage accounting, the mover). Parts get what they need
through their constructors; nothing in gpupool keeps a process global of these.

              configure(c) ── GPUPoolHub(c) ──> c.JupyterHub.tornado_settings[ROOT_KEY]
                                  │
          settings, pool, cgroups │ serving(Running): the hub (HubApp), the API's services (ApiServices:
                                  │ training, parking, usage, the culler's findings), mover, started by
                                  │ gpupool.wiring.setup once the hub runs
          PoolManager(hooks=ServiceHooks(root.services)): what the pool asks of those services
          (make room for a build, budgets, moves, GPU files) reaches them once they run
                                  │
    ┌─────────────────────────────┼───────────────────────────────┬──────────────────────────┐
 spawners                  gpupool API handlers              admin page handlers      home page templates
 self.user.settings[ROOT_KEY]  self.root, self.services      initialize(services,root) closures over the root

How the parts reach it. JupyterHub merges its `tornado_settings` option into its tornado
application's settings and hands that same dict to every User it makes (app.py
`init_tornado_settings`: `settings.update(self.tornado_settings)`, then `UserDict(...,
settings=self.tornado_settings)`; user.py keeps it as the public `User.settings`); a spawner is made
with `user=` that User, so a spawner reads `self.user.settings[ROOT_KEY]`. The gpupool
API's own tornado application carries the root in its settings, as JupyterHub's handlers carry
the hub's. Neither imports this module, which sits above them: each names what it reads of the
root as a Protocol (gpupool.spawner.hub_parts.SpawnerRoot, gpupool.api.auth.ApiRoot), and mypy
checks that this root gives it where the root is handed over (gpupool.wiring.setup). This is the hub's documented option for handler settings, so no registry keyed by the
Config object is needed. kubespawner, for comparison, shares its API client through a module
cache (`kubespawner.clients.shared_client`) and its reflectors through a class attribute
(`KubeSpawner.reflectors`): process globals, which this root is here to avoid.

traitlets deep-copies a dict option when a Configurable loads it (`Configurable._load_config`), so
the root copies as itself: the hub's copy of `tornado_settings` holds this same root.

The JupyterHub application object itself is touched only through `gpupool.hub.adapter.HubApp`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from traitlets.config import Config

# the key and the error live below every part that reads the root (gpupool.hub.root_key): named
# here too for the root's own callers
from gpupool.hub.root_key import ROOT_KEY as ROOT_KEY
from gpupool.hub.root_key import NotConfigured as NotConfigured
from gpupool.hub.root_key import stored_root
from gpupool.settings.config import GPUPool
from gpupool.vocab.kinds import WorkloadKind

if TYPE_CHECKING:
    from gpupool.alloc.hooks import Services
    from gpupool.alloc.manager import PoolManager
    from gpupool.api.auth import Directory
    from gpupool.api.services import ApiServices
    from gpupool.contain import Tree, WorkloadCgroups
    from gpupool.contain.follow import WorkspaceDevices
    from gpupool.gpu.env_files import GPUEnvFiles
    from gpupool.hub.adapter import HubApp
    from gpupool.parking.mover import MoverService
    from gpupool.pool import BuildQuotaPolicy, Inventory
    from gpupool.pool.pools import NodePool
    from gpupool.store import Allocation

log = logging.getLogger("gpupool")


def root_of(settings: Mapping[str, object] | None) -> GPUPoolHub:
    """The root in a tornado settings dict (a User's `settings`, a handler's `settings`)."""
    root: GPUPoolHub = stored_root(settings)
    return root


class GPUPoolHub:
    """The hub side of gpupool, built once per hub from its config."""

    def __init__(
        self, config: Config, *, pool: PoolManager | None = None, cgroups: WorkloadCgroups | None = None
    ) -> None:
        """`pool`, `cgroups`: parts already built (tests); else each is built on first use."""
        self.config = config
        self.settings = GPUPool(config=config)
        self._pool = pool
        self._cgroups = cgroups
        self.running: Running | None = None  # what runs once the hub has started (`serving`)
        # the gpupool service's token for the hub's REST API (set by gpupool.wiring.setup.configure):
        # spawners remove a refused named server with it
        self.service_token = ""
        # what spawners read of the cluster and reuse for a while (GPUKubeSpawner.read_kai_queue)
        self.cluster_reads: dict[object, tuple[float, object]] = {}

    def __deepcopy__(self, memo: dict[int, object]) -> GPUPoolHub:
        return self  # one per hub: a copied config option shares it (see the module's docstring)

    def __copy__(self) -> GPUPoolHub:
        return self

    # --- parts built from the config -----------------------------------------------------------
    @property
    def pool(self) -> PoolManager:
        """The pool manager (its database opened on first use)."""
        if self._pool is None:
            from gpupool.alloc.hooks import ServiceHooks
            from gpupool.alloc.manager import PoolManager
            from gpupool.pool import get_policy
            from gpupool.settings.quotas import checked_pools, stored_quotas
            from gpupool.store import Store
            from gpupool.train.config import TrainPool

            store = Store(self.settings.db_url)
            pools = TrainPool(config=self.config).pool_table()
            quotas, skipped = stored_quotas(self.settings, store, pools)
            self._pool = PoolManager(
                inventory=build_inventory(self.settings),
                store=store,
                quotas=quotas,
                policy=get_policy(self.settings.build_placement_policy),
                node_pools=checked_pools(pools, quotas),
                skipped_settings=skipped,
                hooks=ServiceHooks(self.services),  # the services' answers once they run
            )
            self._pool.min_free_mib = self.settings.min_free_disk_mib
        return self._pool

    @property
    def hub_key(self) -> str:
        from gpupool.contain import hub_key

        return hub_key(self.settings.db_url)

    @property
    def cgroups(self) -> WorkloadCgroups:
        """This hub instance's cgroups (gpupool.contain), made on first use after the start-up
        check of the database's instance (gpupool.host.instance; LostState when it fails)."""
        if self._cgroups is None:
            from gpupool.contain import Containment, WorkloadCgroups, detect
            from gpupool.host.instance import settle

            opts = Containment(config=self.config)
            tree = detect(opts.mode, self.hub_key, devices=opts.devices)
            instance = settle(
                self.pool.store,
                tree,
                self.hub_key,
                where=db_where(self.settings.db_url),
                state_hint=os.environ.get("GPUPOOL_STATE_DIR", ""),
                known=self.known_work(tree),
            )
            policy = opts.policy()
            cgroups = WorkloadCgroups(tree, instance, self.hub_key, opts.stop_timeout_s, policy)
            missing = cgroups.missing(opts.require)
            if missing:
                raise Unenforceable(
                    "gpupool will not start: c.Containment.require lists limits this machine cannot apply: "
                    + "; ".join(f"{k}: {v}" for k, v in missing.items())
                )
            try:  # the hub and the proxy keep their share: all workloads together weigh less
                tree.controllers.reserve(
                    policy.workloads_cpu_shares, policy.workloads_memory_bytes, policy.jobs_cpu_shares
                )
            except OSError as err:
                log.warning("could not reserve CPU and memory for the hub: %s", err)
            self._cgroups = cgroups
        return self._cgroups

    def hold_hub_cpu(self) -> None:
        """This process (the hub) in its own CPU cgroup of weight c.Containment.hub_cpu_shares,
        before it starts the proxy and its services (born there too); said in the log."""
        cgroups = self.cgroups
        try:
            folder = cgroups.tree.controllers.hold_hub(cgroups.policy.hub_cpu_shares, [os.getpid()])
        except OSError as err:
            log.warning("the hub keeps no CPU share of its own: %s", err)
            return
        if folder is not None:
            log.info("the hub's processes weigh %d in %s", cgroups.policy.hub_cpu_shares, folder)

    def known_work(self, tree: Tree) -> set[str]:
        """The workload cgroup names (`job-<id>`, `ws-<digest>`) of what the databases know as
        running: the pool's running jobs and held shares, the hub's active servers. Any other
        populated cgroup of the instance is work they do not know (gpupool.host.instance)."""
        from sqlalchemy import create_engine, select, text
        from sqlalchemy.exc import SQLAlchemyError

        from gpupool.contain import WorkloadCgroups
        from gpupool.store.jobs import TrainJob
        from gpupool.vocab.states import HAS_RUN

        names = WorkloadCgroups(tree, "_")

        def ws(owner: str, name: str) -> str:
            return names.workspace(owner, name).split("/", 1)[1]

        store = self.pool.store
        known = {ws(r.owner, r.name) for r in store.allocations(kind=WorkloadKind.BUILD)}
        with store.session() as s:
            known |= {
                names.job(i).split("/", 1)[1]
                for i in s.scalars(select(TrainJob.id).where(TrainJob.state.in_(HAS_RUN)))
            }
        hub_db = (
            self.config.JupyterHub.db_url
            if "db_url" in self.config.JupyterHub
            else "sqlite:///jupyterhub.sqlite"
        )
        engine = create_engine(hub_db)
        try:
            with engine.connect() as conn:
                rows = conn.execute(
                    text(
                        "SELECT users.name, spawners.name FROM spawners JOIN users ON users.id = spawners.user_id"
                        " WHERE spawners.server_id IS NOT NULL"
                    )
                )
                known |= {ws(user, name or "") for user, name in rows}
        except SQLAlchemyError:
            pass  # a new hub: no table yet, no server
        finally:
            engine.dispose()
        return known

    @property
    def directory(self) -> Directory | None:
        """Users' admin flags and groups as the hub has them (gpupool.api.auth.Directory); None
        before the gpupool API runs."""
        return self.running.api.directory if self.running is not None else None

    def close(self) -> None:
        """Close the database (a hub that refuses to start leaves it as it found it)."""
        if self._pool is not None:
            self._pool.store.engine.dispose()

    def refuse_lost_state(self) -> None:
        """Open the database and check that running work is its own (gpupool.host.instance); the hub
        stops here with the reason and what to do (SystemExit) when it is not, or cannot be read."""
        from sqlalchemy.exc import SQLAlchemyError

        from gpupool.host.instance import LostState

        try:
            _ = self.cgroups  # opens the database and checks its instance
        except (LostState, Unenforceable) as err:
            self.close()
            raise SystemExit(str(err)) from None
        except (SQLAlchemyError, OSError) as err:  # the database cannot be opened, read or written
            self.close()
            where = db_where(self.settings.db_url)
            raise SystemExit(
                f"gpupool will not start: its database {where} cannot be used: {type(err).__name__}:"
                f" {str(err)[:500]}. Fix its permissions, or restore it from a backup (`gpupool restore`);"
                " move it aside to start empty only when no server or job of this hub runs."
            ) from None
        except Exception as err:
            # an error in a config file makes JupyterHub go on WITHOUT that file: stop here instead
            import traceback

            traceback.print_exc()
            raise SystemExit(f"gpupool will not start: {type(err).__name__}: {str(err)[:500]}") from None

    # --- the running hub ------------------------------------------------------------------------
    def serving(self, running: Running) -> None:
        """The hub has started and gpupool's services run (gpupool.wiring.setup starts them): from now on
        the pages read the culler's findings, and the reconcile asks the hub what runs."""
        if self.running is not None:
            raise RuntimeError("this hub's gpupool services are already running")
        self.running = running

    def services(self) -> Services | None:
        """What the pool's questions go to (gpupool.alloc.hooks): None until the services run."""
        from gpupool.alloc.hooks import Services

        r = self.running
        if r is None:
            return None
        engine = r.api.training.local if r.api.training is not None else None
        return Services(
            training=engine if engine is not None and engine.shares_build_gpus else None,
            usage=r.api.usage,
            mover=r.mover,
            gpu_files=r.gpu_files,
            devices=r.devices,
        )

    @property
    def hub(self) -> HubApp | None:
        return self.running.hub if self.running is not None else None

    @property
    def api_services(self) -> ApiServices | None:
        """What the gpupool API serves (the culler's findings, training, usage...); None before it runs."""
        return self.running.api if self.running is not None else None

    def is_running(self, row: Allocation) -> bool:
        """For the start-up reconcile: does the hub know this allocation's server as running? (Only
        build workspaces are reconciled here.) What is left of a workspace it does not know is ended."""
        if row.kind != WorkloadKind.BUILD:
            return True
        hub = self.hub
        if hub is None:
            raise RuntimeError("the reconcile runs once the hub serves (GPUPoolHub.serving)")
        if hub.server_active(row.owner, row.name):
            return True
        if hub.cleans_up_orphans:
            for pid in hub.cleanup_orphans(self.cgroups, row.owner, row.name):
                log.warning("stopped orphaned server process %d of %s/%s", pid, row.owner, row.name)
        return False


@dataclass(frozen=True)
class Running:
    """What runs once the hub has started (None: that part is off)."""

    hub: HubApp
    api: ApiServices  # what the gpupool API serves: training, parking, usage, the culler's findings
    mover: MoverService | None = None
    gpu_files: GPUEnvFiles | None = None  # each workspace's current GPU, where servers run here
    devices: WorkspaceDevices | None = None  # each workspace's device rules follow its share


class Unenforceable(RuntimeError):
    """A limit c.Containment.require lists cannot be applied on this machine."""


def build_inventory(cfg: GPUPool) -> Inventory:
    """The cluster's GPUs (c.GPUPool.gpu_inventory = "kubernetes"), else NVML's, or the virtual
    ones c.GPUPool declares where there is none."""
    from gpupool.gpu.nvml import discover_gpus
    from gpupool.pool import Inventory, Node, virtual_inventory

    if cfg.gpu_inventory == "kubernetes":
        from gpupool.kube.inventory import cluster_inventory

        found = cluster_inventory()
        log.info(
            "the cluster has %d GPU(s) on %d node(s): %s",
            found.gpu_count,
            len(found.nodes),
            ", ".join(f"{n.name} {len(n.gpus)} x {n.model} {n.gpus[0].memory_mib} MiB" for n in found.nodes),
        )
        return found

    gpus = discover_gpus() if cfg.use_nvml else []
    if gpus:
        log.info("NVML found %d GPU(s): %s", len(gpus), ", ".join(g.model for g in gpus))
        return Inventory(nodes=(Node(name="localhost", gpus=tuple(gpus)),))
    if cfg.virtual_gpus:
        log.warning(
            "no NVIDIA GPU found: declaring %d VIRTUAL GPU(s) of %d MiB",
            cfg.virtual_gpus,
            cfg.virtual_gpu_memory_mib,
        )
    return virtual_inventory(cfg.virtual_gpus, cfg.virtual_gpu_memory_mib)


def node_pools(config: Config, quotas: BuildQuotaPolicy) -> dict[str, NodePool]:
    """c.TrainPool.node_pools (one definition for train jobs and build workspaces), checked
    against the pools the build quotas name (TraitError)."""
    from gpupool.settings.quotas import checked_pools
    from gpupool.train.config import TrainPool

    return checked_pools(TrainPool(config=config).pool_table(), quotas)


def db_where(db_url: str) -> str:
    """Where the database is, for messages (a path, or a server without its credentials)."""
    return db_url.removeprefix("sqlite:///") if db_url.startswith("sqlite:///") else db_url.split("@")[-1]
