"""GPU share handling shared by gpupool's spawners (embedded and Kubernetes).

The order in `start` is the contract: validate -> reserve (quota + placement, persisted)
-> start the server with the GPU environment -> mark running. Any failure after the
reservation releases it, and so do `stop` and a `poll` that finds the server dead.
"""

from __future__ import annotations

from typing import Any

from gpupool import runtime
from gpupool.gpu.env import gpu_env
from gpupool.manager import PoolManager, Workload
from gpupool.pool import GPU, PoolError
from gpupool.store import Allocation
from tornado import web
from traitlets import HasTraits, default

from .form import parse_form, render_form, requested_milli


def http_error(err: PoolError) -> web.HTTPError:
    """A PoolError as the 4xx JupyterHub shows on the spawn page and in API replies."""
    exc = web.HTTPError(err.status, reason=type(err).__name__)
    exc.jupyterhub_message = str(err)  # read by JupyterHub's form page and API errors
    return exc


class GPUSpawnerMixin(HasTraits):
    """Mix in before a JupyterHub Spawner class."""

    gpupool_allocation: Allocation | None = None

    # --- helpers -------------------------------------------------------------
    @property
    def pool(self) -> PoolManager:
        return runtime.pool(self.config)

    @property
    def workload(self) -> Workload:
        return Workload("build", self.user.name, self.name)

    @property
    def user_groups(self) -> list[str]:
        return sorted(g.name for g in self.user.groups)

    # --- the spawn form ------------------------------------------------------
    @default("options_form")
    def _options_form_default(self) -> Any:
        return self.render_gpu_form

    @default("apply_user_options")
    def _apply_user_options_default(self) -> Any:
        return self.check_user_options

    def check_user_options(self, spawner: Any, user_options: dict[str, Any]) -> None:
        """Reject malformed options (a tampered form, the REST API) before anything starts;
        JupyterHub answers 400 with this message."""
        try:
            requested_milli(user_options or {})
        except PoolError as err:
            raise http_error(err) from None

    def render_gpu_form(self, spawner: Any = None) -> str:
        pool = self.pool
        every = pool.holdings(self.user.name)  # every server counts on the form, re-rendered or fresh
        held = [h for h in every if h.server_name != self.name]
        limits = pool.quotas.limits_for(self.user_groups)
        gpus = [g for n in pool.inventory.nodes for g in n.gpus]
        offered = pool.quotas.offered_sizes(self.user_groups, held)
        return render_form(offered, every, limits.quota_milli, any(g.virtual for g in gpus),
                           memory_mib_per_gpu=min((g.memory_mib for g in gpus), default=0),
                           gpu_free=pool.state.gpu_free.tolist(), max_workspaces=limits.max_workspaces,
                           this_server=self.name)

    def options_from_form(self, formdata: dict[str, list[str]]) -> dict[str, str]:
        try:
            options = parse_form(formdata)
            milli = requested_milli(options)
            held = [h for h in self.pool.holdings(self.user.name) if h.server_name != self.name]
            # early, friendly check; the binding one is in start()
            self.pool.quotas.check(milli, self.user_groups, held, self.pool.group_usage())
        except PoolError as err:
            raise http_error(err) from None
        return options

    # --- lifecycle -----------------------------------------------------------
    def reserve_gpus(self) -> Allocation:
        try:
            milli = requested_milli(self.user_options or {})
        except PoolError as err:
            raise self.refused(err) from None
        return self.reserve_milli(milli)

    def reserve_milli(self, milli: int) -> Allocation:
        """Quota check, placement and the persisted share; a refusal is recorded and raised
        as the 4xx JupyterHub shows."""
        try:
            alloc = self.pool.reserve_build(self.user.name, self.user_groups, self.name, milli)
        except PoolError as err:
            raise self.refused(err) from None
        self.gpupool_allocation = alloc
        return alloc

    def refused(self, err: PoolError) -> web.HTTPError:
        self.pool.store.record("refuse", str(err), owner=self.user.name, name=self.name)
        self.log.warning("refused %s: %s", self._log_name, err)
        return http_error(err)

    async def reserve_share(self) -> Allocation | None:
        """The share this start needs (subclasses may take it from a profile)."""
        return self.reserve_gpus()

    def server_pid(self) -> int | None:
        """The pid the culler follows for this workspace (None where there is none)."""
        return None

    def pod_uid(self) -> str:
        """The pod the culler follows through the node agents (Kubernetes; "" elsewhere)."""
        return ""

    async def start(self):
        await self.reserve_share()
        try:
            url = await super().start()
        except BaseException:
            self.release_gpus("start failed")
            raise
        if self.gpupool_allocation is not None:
            self.pool.mark_running(self.workload, self.server_pid())
        return url

    async def stop(self, now: bool = False) -> None:
        try:
            await super().stop(now=now)
        finally:
            self.release_gpus("stopped")

    async def poll(self) -> int | None:
        status = await super().poll()
        if status is not None and not self._spawn_pending:
            self.release_gpus(f"server ended (status {status})")
        elif status is None and self.gpupool_allocation is None:
            # a hub restart: re-adopt the persisted share of a server that is still running
            self.gpupool_allocation = self.pool.allocation(self.workload)
        return status

    def allocated_gpus(self) -> list[GPU]:
        alloc = self.gpupool_allocation
        if alloc is None:
            return []
        node = self.pool.inventory.node(alloc.node)
        return [node.gpus[i] for i in alloc.gpus]

    def gpu_environment(self, pythonpath: str = "") -> dict[str, str]:
        alloc = self.gpupool_allocation
        if alloc is None:
            return {}
        cfg = runtime.settings(self.config)
        env = gpu_env(self.allocated_gpus(), alloc.gpu_milli, cfg.mps_pipe_directory, pythonpath)
        env["GPUPOOL_API_URL"] = cfg.api_url_for_servers(self.hub.base_url)
        return env

    def release_gpus(self, reason: str) -> None:
        if self.pool.release(self.workload, reason=reason):
            self.log.info("released GPU share of %s (%s)", self._log_name, reason)
        self.gpupool_allocation = None
