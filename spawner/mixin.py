"""GPU share handling shared by gpupool's spawners (embedded and Kubernetes).

The order in `start` is the contract: validate -> reserve (quota + placement, persisted)
-> start the server with the GPU environment -> mark running. Any failure after the
reservation releases it, and so do `stop` and a `poll` that finds the server dead.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from tornado import web
from traitlets import HasTraits, default

from gpupool.alloc.manager import PoolManager, Workload
from gpupool.gpu.env import gpu_env
from gpupool.hub import failpoints
from gpupool.hub.quiet_refusals import REFUSAL
from gpupool.pool import GPU, PoolError, Request
from gpupool.pool.errors import RoomBeingFreed
from gpupool.pool.pools import within
from gpupool.spawner.form import SpawnChoice, free_slots, parse_choice, parse_form, render_form
from gpupool.spawner.hub_parts import SpawnerRoot, spawner_root
from gpupool.store import Allocation
from gpupool.vocab.disk import disk_full
from gpupool.vocab.kinds import EventKind, WorkloadKind


def with_message(exc: web.HTTPError, message: str) -> web.HTTPError:
    """`exc` (its status and reason) with the message JupyterHub shows on its spawn page and in
    API replies."""
    # the message as tornado's own (no % arguments): JupyterHub 5's API errors read only that
    out = web.HTTPError(exc.status_code, message, reason=exc.reason)
    # JupyterHub 6's convention: it reads this attribute, which tornado's class does not declare
    out.jupyterhub_message = message  # type: ignore[attr-defined]
    return out


def http_error(err: PoolError) -> web.HTTPError:
    """A PoolError as the 4xx JupyterHub shows on the spawn page and in API replies."""
    exc = with_message(web.HTTPError(err.status, reason=type(err).__name__), str(err))
    setattr(exc, REFUSAL, True)  # logged once as a refusal, without a traceback (gpupool.hub.quiet_refusals)
    return exc


_REMOVALS: set[asyncio.Task[None]] = set()  # refused named servers being removed (spawner/mixin.py)

if TYPE_CHECKING:
    # what the mixin goes into: for mypy it has the spawner's user, name, config, log... (Any, as
    # JupyterHub ships no type information); at run time the spawner class comes later in the MRO
    from jupyterhub.spawner import Spawner
    from jupyterhub.spawner import Spawner as _SpawnerBase
else:
    _SpawnerBase = HasTraits


class GPUSpawnerMixin(_SpawnerBase):
    """Mix in before a JupyterHub Spawner class."""

    gpupool_allocation: Allocation | None = None

    # --- helpers -------------------------------------------------------------
    @property
    def gpupool_root(self) -> SpawnerRoot:
        """The hub side's composition root, as spawners use it: JupyterHub hands every User the
        hub's tornado settings (`User.settings`), where `configure(c)` put it (gpupool.wiring.root)."""
        return spawner_root(getattr(self.user, "settings", None))

    @property
    def pool(self) -> PoolManager:
        return self.gpupool_root.pool

    @property
    def workload(self) -> Workload:
        return Workload(WorkloadKind.BUILD, self.user.name, self.name)

    @property
    def server_label(self) -> str:
        """user/server, for the log."""
        return f"{self.user.name}/{self.name}" if self.name else self.user.name

    @property
    def user_groups(self) -> list[str]:
        return sorted(g.name for g in self.user.groups)

    def membership(self):
        """Every build holder's groups as the hub has them now, for group totals (members
        added to a group after their spawn count for it); None before the gpupool API runs,
        and when none of this user's groups has a total (nothing to count: a spawn in a class of
        thousands reads no other user). Read on the event loop: the hub's ORM is not threadsafe."""
        directory = self.gpupool_root.directory
        if directory is None or not set(self.user_groups) & set(self.pool.quotas.group_totals_milli):
            return None
        return directory.groups_of(self.pool.build_holders())

    # --- the spawn form ------------------------------------------------------
    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        # The GPU form, unless the admin configured a form of their own (or, on Kubernetes, a
        # profile list brings kubespawner's). Set as values, not trait defaults, so that the
        # parent class's defaults stay reachable without naming its private methods.
        if self.uses_gpu_form():
            if not self.trait_has_value("options_form"):
                self.options_form = self.render_gpu_form
            if not self.trait_has_value("options_from_form"):
                self.options_from_form = self.gpu_options_from_form

    def uses_gpu_form(self) -> bool:
        return True

    def places_in_pools(self) -> bool:
        """Whether the hub's own placement keeps a workspace on its node pools' GPUs (embedded);
        on Kubernetes the hub's inventory is nominal and the pod's node affinity does it."""
        return True

    @default("apply_user_options")
    def _gpupool_apply_user_options(self) -> object:
        return self.check_user_options

    def check_user_options(self, spawner: Spawner, user_options: dict[str, object]) -> None:
        """Reject malformed options (a tampered form, the REST API) before anything starts;
        JupyterHub answers 400 with this message."""
        try:
            self.spawn_choice(user_options or {})
        except PoolError as err:
            self.forget_if_never_ran()
            raise http_error(err) from None

    # (the options it was parsed from, the choice): kept for the steps after the check
    _gpupool_choice: tuple[dict[str, object], SpawnChoice] | None = None

    def spawn_choice(self, options: dict[str, Any] | None = None) -> SpawnChoice:
        """The user's options (`options`, else self.user_options) parsed once: by the form's
        parser or JupyterHub's apply_user_options check, then read by every later step. Options
        changed since (a pre_spawn_hook, a spawner restored after a hub restart) are parsed anew,
        so nothing reads a choice the options no longer say."""
        if options is None:
            options = self.user_options or {}
        kept = self._gpupool_choice
        if kept is None or kept[0] != options:
            # a copy: a hook that edits the options in place must not edit the key too
            kept = self._gpupool_choice = (
                dict(options),
                parse_choice(options, profiles=not self.uses_gpu_form()),
            )
        return kept[1]

    def render_gpu_form(self, spawner: Spawner | None = None) -> str:
        pool = self.pool
        every = pool.holdings(self.user.name)  # every server counts on the form, re-rendered or fresh
        held = [h for h in every if h.server_name != self.name]
        limits = pool.quotas.limits_for(self.user_groups)
        gpus = [g for n in pool.inventory.nodes for g in n.gpus]
        offered = pool.quotas.offered_sizes(self.user_groups, held)
        pools = pool.build_pools(self.user_groups)
        state = (
            within(pool.state, [pool.node_pools[p] for p in pools if p in pool.node_pools])
            if pools and self.places_in_pools()
            else pool.state
        )
        gpu_free = state.gpu_free.tolist()
        reclaim, moves = {}, {}
        for milli, fits in offered:
            if not fits or free_slots(gpu_free, milli):
                continue
            # build first: what borrowing train jobs would give back
            victims = pool.hooks.room_for_build(
                Request.for_gpus(milli), pools=tuple(pools) if self.places_in_pools() else ()
            )
            if victims is not None:
                reclaim[milli] = len(victims)
            elif not (pools and self.places_in_pools()):
                steps = pool.hooks.room_by_moving(
                    Request.for_gpus(milli)
                )  # then idle notebooks that would move
                if steps is not None:
                    moves[milli] = steps
        notes = pool.hooks.form_notes(self.user.name, self.user_groups)
        return render_form(
            offered,
            every,
            limits.quota_milli,
            any(g.virtual for g in gpus),
            memory_mib_per_gpu=min((g.memory_mib for g in gpus), default=0),
            gpu_free=gpu_free,
            max_workspaces=limits.max_workspaces,
            this_server=self.name,
            pools=pools,
            reclaim=reclaim,
            moves=moves,
            notes=notes,
        )

    def gpu_options_from_form(self, formdata: dict[str, list[str]]) -> dict[str, str]:
        try:
            options = parse_form(formdata)
            choice = self.spawn_choice(options)  # JupyterHub's check then finds it parsed
            milli = choice.milli
            self.pool.build_pools(self.user_groups, choice.pool)  # a pool not theirs: 403
            held = [h for h in self.pool.holdings(self.user.name) if h.server_name != self.name]
            # early, friendly check; the binding one is in start()
            self.pool.quotas.check(
                milli, self.user_groups, held, self.pool.group_usage(self.membership(), only=self.user_groups)
            )
            self.pool.hooks.admit(self.workload, self.user_groups, milli)  # a GPU-hour budget used up
        except PoolError as err:
            # recorded and logged as a refusal in start() is (the admins' events listed those of
            # the REST API only, where most users are refused on this form), and forgotten alike
            raise self.refused(err) from None
        return options

    # --- lifecycle -----------------------------------------------------------
    def reserve_gpus(self) -> Allocation:
        try:
            choice = self.spawn_choice()
        except PoolError as err:
            raise self.refused(err) from None
        return self.reserve_milli(choice.milli, choice.pool)

    def reserve_milli(self, milli: int, pool: str | None = None) -> Allocation:
        """Quota check, placement (in the user's node pools, or `pool` of them) and the
        persisted share; a refusal is recorded and raised as the 4xx JupyterHub shows."""
        try:
            alloc = self.pool.reserve_build(
                self.user.name,
                self.user_groups,
                self.name,
                milli,
                pool=pool,
                groups_of=self.membership(),
                in_pools=self.places_in_pools(),
            )
        except Exception as err:
            raise self.reserve_failed(err) from None
        self.gpupool_allocation = alloc
        return alloc

    def reserve_failed(self, err: Exception) -> Exception:
        """What a failed reservation raises: RoomBeingFreed as it is (start() waits for it), a
        PoolError as the 4xx JupyterHub shows, a full disk as 507, anything else as it is."""
        if isinstance(err, RoomBeingFreed):
            return err
        if isinstance(err, PoolError):
            return self.refused(err)
        if why := disk_full(err):  # said as such, not a bare 500
            self.forget_if_never_ran()
            return with_message(
                web.HTTPError(507, reason="disk full"),
                f"the disk is full: {why}; no GPU was reserved (tell an admin)",
            )
        return err

    async def reserve_milli_off_loop(self, milli: int, pool: str | None = None) -> Allocation:
        """`reserve_milli` with the quota check, placement and commit in a worker thread
        (PoolManager.reserve_build_async): the hub's event loop serves other spawns meanwhile.
        For spawners whose hub changes the pool's state only under the manager's lock."""
        groups_of = self.membership()
        try:
            alloc = await self.pool.reserve_build_async(
                self.user.name,
                self.user_groups,
                self.name,
                milli,
                pool=pool,
                in_pools=self.places_in_pools(),
                groups_of=groups_of,
            )
        except Exception as err:
            raise self.reserve_failed(err) from None
        self.gpupool_allocation = alloc
        return alloc

    def refused(self, err: PoolError) -> web.HTTPError:
        self.pool.store.record(EventKind.REFUSE, str(err), owner=self.user.name, name=self.name)
        self.log.warning("refused %s: %s", self.server_label, err)
        self.forget_if_never_ran()
        return http_error(err)

    # --- a refused named server leaves no row ----------------------------------
    _gpupool_ran = False  # this server has started once (kept in the spawner's state)

    def get_state(self) -> dict[str, object]:
        state = super().get_state()
        if self._gpupool_ran:
            state["gpupool_ran"] = True
        return state

    def load_state(self, state: dict[str, object]) -> None:
        super().load_state(state)
        self._gpupool_ran = bool(state.get("gpupool_ran"))

    # clear_state (at every stop) keeps the mark: a server that ran stays the user's

    def forget_if_never_ran(self) -> None:
        """A named server refused at its first start (quota, budget, disk reserve, a bad size) is
        removed from the user's servers once JupyterHub has settled the failed start, through the
        hub's REST API: the home page listed it, stopped, as if the user had one more server. One
        that has run (its state's mark, or a share it held in the pool's records) is kept."""
        if not self.name or self._gpupool_ran or not self.gpupool_root.service_token:
            return
        if self.pool.store.events(limit=1, kind=EventKind.ALLOCATE, owner=self.user.name, name=self.name):
            return
        import asyncio

        task = asyncio.ensure_future(self._remove_refused())
        _REMOVALS.add(task)  # held until done: the loop keeps only a weak reference
        task.add_done_callback(_REMOVALS.discard)

    async def _remove_refused(self, wait_s: float = 60) -> None:
        import asyncio
        import json
        import time
        from urllib.parse import quote

        from tornado.httpclient import AsyncHTTPClient, HTTPClientError

        deadline = time.monotonic() + wait_s
        await asyncio.sleep(0)  # the refusal is raised first
        while self.pending and time.monotonic() < deadline:  # JupyterHub settles the failed start
            await asyncio.sleep(0.1)
        url = f"{self.hub.api_url.rstrip('/')}/users/{quote(self.user.name, safe='')}/servers/{quote(self.name, safe='')}"
        try:
            await AsyncHTTPClient().fetch(
                url,
                method="DELETE",
                body=json.dumps({"remove": True}),
                allow_nonstandard_methods=True,  # a DELETE with a body
                headers={"Authorization": f"token {self.gpupool_root.service_token}"},
                request_timeout=30,
            )
            self.log.info("removed %s: refused at its first start", self.server_label)
        except (HTTPClientError, OSError) as err:
            self.log.warning("could not remove refused %s: %s", self.server_label, err)

    async def reserve_share(self) -> Allocation | None:
        """The share this start needs (subclasses may take it from a profile)."""
        return self.reserve_gpus()

    async def end_orphans(self) -> None:
        """Stop server processes of this workspace the hub does not know (local spawners)."""

    async def end_workload(self, exit_status: int | None = None) -> bool:
        """End whatever of this workspace still runs once its server is gone (local spawners: its
        cgroup); True when nothing does, so its GPU share may go to someone else.
        `exit_status`: the server exited without a stop, with this status (poll's: -9, SIGKILL,
        is how the kernel's OOM killer ends it); None: it was stopped."""
        await self.end_orphans()
        return True

    def server_pid(self) -> int | None:
        """The pid the culler follows for this workspace (None where there is none)."""
        return None

    def culler_profile(self) -> str:
        """The profile this workspace runs with, one this spawner offered ("" for none): the culler's
        profile_overrides key. Spawners without profiles (the local ones) have none, whatever a
        user put in their spawn options."""
        return ""

    def pod_uid(self) -> str:
        """The pod the culler follows through the node agents (Kubernetes; "" elsewhere)."""
        return ""

    async def reserve_waiting(self) -> Allocation | None:
        """The share; when train jobs that borrowed GPUs are being stopped to make room for it
        (build first), or idle notebooks are being moved out of its way (gpupool.parking.mover), wait
        for that instead of refusing, as long as the hub's start timeout allows; the spawn page
        says what it waits for (`progress`)."""
        import asyncio
        import time

        deadline = time.monotonic() + max(0.0, float(self.start_timeout) - 15)
        key = (self.user.name, self.name)
        try:
            while True:
                try:
                    return await self.reserve_share()
                except RoomBeingFreed as err:
                    if time.monotonic() >= deadline:
                        raise self.refused(err) from None
                    if self.gpupool_waiting != str(err):
                        self.log.info("%s waits: %s", self.server_label, err)
                    self.gpupool_waiting = str(err)
                    self.pool.spawns_waiting.add(
                        key
                    )  # room made by moves is held only for a spawn that waits
                    await asyncio.sleep(1)
        finally:
            self.pool.spawns_waiting.discard(key)
            self.gpupool_waiting = None

    gpupool_waiting: str | None = None  # what the spawn waits for (the spawn page's progress)

    async def progress(self):
        """The spawn page's progress: what a start waits for before its server can start (room
        being made), then the spawner's own events."""
        import asyncio

        said = ""
        while self.pending == "spawn" and self.gpupool_allocation is None and not self._gpupool_past_reserve:
            if self.gpupool_waiting and self.gpupool_waiting != said:
                said = self.gpupool_waiting
                yield {"message": said}
            await asyncio.sleep(0.5)
        async for event in super().progress():
            yield event

    _gpupool_past_reserve = False

    async def start(self):
        self._gpupool_past_reserve = False
        try:
            await self.reserve_waiting()
        finally:
            self._gpupool_past_reserve = True
        failpoints.reach("spawn.reserved")
        try:
            url = await super().start()
        except asyncio.CancelledError:
            # the hub is going down mid-spawn (its pod deleted, SIGTERM): what the spawn made may
            # outlive it (a pod does) and be adopted by the restarted hub, which then counts this
            # persisted share again; one it does not adopt, its start-up reconcile releases
            self.log.warning("the spawn of %s was interrupted: its GPU share is kept", self.server_label)
            raise
        except BaseException:
            self.release_gpus("start failed")
            raise
        failpoints.reach("spawn.started")
        self._gpupool_ran = True
        if self.gpupool_allocation is not None:
            self.pool.mark_running(self.workload, self.server_pid())
        return url

    async def stop(self, now: bool = False) -> None:
        """Stop the server; its share goes back only once the server is gone. A stop that
        failed while the process still runs keeps the share: the process still uses the GPU,
        and releasing it would let a second user onto the same memory."""
        try:
            await super().stop(now=now)
        except BaseException:
            if await self._still_running():
                self.log.error(
                    "stopping %s failed and it still runs: its GPU share is kept", self.server_label
                )
                raise
            if await self.end_workload():
                self.release_gpus("stopped (the stop reported an error, but the server is gone)")
            raise
        failpoints.reach("stop.stopped")
        if not await self.end_workload():
            self.log.error("processes of %s survive the stop: its GPU share is kept", self.server_label)
            raise web.HTTPError(500, f"processes of {self.server_label} did not end; its GPU share is kept")
        self.release_gpus("stopped")

    async def _still_running(self) -> bool:
        try:
            return await super().poll() is None
        except Exception:  # noqa: BLE001 - cannot tell: assume it runs, the safe side for a GPU
            return True

    async def poll(self) -> int | None:
        status = await super().poll()
        if status is not None and self.pending != "spawn":
            # the server the hub knew is gone, but what it started may not be (a hub that died
            # mid-spawn never learned the pid of the one it started): all must end before its GPU
            # is handed on
            if await self.end_workload(exit_status=status):
                self.release_gpus(f"server ended (status {status})")
            else:
                self.log.error("processes of %s survive its server: its GPU share is kept", self.server_label)
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
        cfg = self.gpupool_root.settings
        env = gpu_env(
            self.allocated_gpus(), alloc.gpu_milli, cfg.mps_pipe_directory, pythonpath, cfg.gpu_context_mib
        )
        env["GPUPOOL_API_URL"] = cfg.api_url_for_servers(self.hub.base_url)
        return env

    def release_gpus(self, reason: str) -> None:
        if self.pool.release(self.workload, reason=reason):
            self.log.info("released GPU share of %s (%s)", self.server_label, reason)
        self.gpupool_allocation = None
