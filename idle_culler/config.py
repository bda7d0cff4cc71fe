"""Admin settings of the culler (traitlets, in jupyterhub_config.py or the gpupool config file).

The hub hands this section to the culler service when it starts it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from traitlets import Bool, Enum, Float, Int, List, TraitError, Unicode, Union
from traitlets import Callable as CallableTrait
from traitlets.config import Configurable, LoggingConfigurable
from traitlets.utils.importstring import import_item

from gpupool.idle_culler.policy import CullerPolicy, Limits, session_end
from gpupool.idle_culler.traits import LIMIT_FIELDS, RESOLVERS, LimitOverrides, Seconds, TimeOfDay, TimeZone
from gpupool.vocab.culling import IDLE_UTIL_PCT

__all__ = ["LIMIT_FIELDS", "RESOLVERS", "IdleCuller", "config_classes"]


class IdleCuller(LoggingConfigurable):
    """GPU-aware idle culling and session time limits for build workspaces."""

    dry_run = Bool(
        False,
        config=True,
        help="""Only report: warn and record what would be culled, cull nothing.
        Example::

            c.IdleCuller.dry_run = True
        """,
    )
    interval_s = Seconds(
        30.0,
        positive=True,
        config=True,
        help="""Seconds between culler passes (GPU is
        sampled each pass).
        Example::

            c.IdleCuller.interval_s = 10
        """,
    )
    idle_limit_s = Seconds(
        900.0,
        config=True,
        help="""Cull a workspace whose GPU stayed idle this long
        while nobody used it in Jupyter for jupyter_idle_s. Without GPU data, Jupyter must be
        idle idle_limit_s + jupyter_idle_s. Example (two hours)::

            c.IdleCuller.idle_limit_s = 7200
        """,
    )
    jupyter_idle_s = Seconds(
        600.0,
        config=True,
        help="""Jupyter silence that, with an idle GPU, makes a
        workspace idle. Example::

            c.IdleCuller.jupyter_idle_s = 1800
        """,
    )
    gpu_idle_hard_s = Seconds(
        8 * 3600.0,
        config=True,
        help="""Cull a workspace whose GPU stayed idle this long
        even while its owner is active in Jupyter (0: never). Example::

            c.IdleCuller.gpu_idle_hard_s = 2 * 3600
        """,
    )
    max_age_s = Seconds(
        0.0,
        config=True,
        help="""Maximum session length, idle or not (0, the default: no
        maximum; measured, a maximum stops sessions whose users come back within minutes, or
        their running cells: docs/culling.md#defaults). Example::

            c.IdleCuller.max_age_s = 8 * 3600
        """,
    )
    busy_grace_s = Seconds(
        6 * 3600.0,
        config=True,
        help="""When max_age_s or workday_end is reached while
        the workspace's GPU is busy, wait for the GPU work to end — at most this long — instead of
        killing a running training cell; the user is warned meanwhile. Missing GPU data gets no
        grace. 0: stop at the limit. Example::

            c.IdleCuller.busy_grace_s = 2 * 3600
        """,
    )
    workday_end = TimeOfDay(
        "",
        config=True,
        help="""End sessions at this local time ("HH:MM"), aligned with
        the workday; empty for none. Example::

            c.IdleCuller.workday_end = "19:00"
        """,
    )
    timezone = TimeZone(
        "UTC",
        config=True,
        help="""Time zone of workday_end. Example::

            c.IdleCuller.timezone = "Europe/Berlin"
        """,
    )
    warn_before_s = Seconds(
        900.0,
        config=True,
        help="""Warn the user this long before a cull. Example::

            c.IdleCuller.warn_before_s = 1800
        """,
    )
    extension_s = Seconds(
        7200.0,
        config=True,
        help="""Extra time a user may ask for once per session.
        Example::

            c.IdleCuller.extension_s = 3600
        """,
    )
    util_threshold_pct = Float(
        IDLE_UTIL_PCT,
        min=0.0,
        max=100.0,
        config=True,
        help="""GPU utilization (%) strictly below which a
        reading counts as idle, for workspaces (a window is idle when
        every reading in it is) and for train jobs (projects with
        idle_gpu_s) alike; a reading at the threshold is use, and 0
        makes no GPU idle. Example::

            c.IdleCuller.util_threshold_pct = 5
        """,
    )
    window_s = Seconds(
        30.0,
        positive=True,
        config=True,
        help="""Length of an idleness window in seconds
        (Run:ai uses 30).
        Example::

            c.IdleCuller.window_s = 60
        """,
    )
    stale_after_s = Seconds(
        180.0,
        config=True,
        help="""GPU data older than this counts as missing: the
        workspace is then judged on Jupyter activity alone. Example::

            c.IdleCuller.stale_after_s = 300
        """,
    )
    memory_resolver = Enum(
        RESOLVERS,
        "warn",
        config=True,
        help="""What to do with a
        workspace using more GPU memory than its share for memory_grace_s: warn (only), restart-kernel
        (restart its kernels, freeing their GPU memory; the server and its files stay) or stop (the
        server). Example::

            c.IdleCuller.memory_resolver = "stop"
        """,
    )
    memory_grace_s = Seconds(
        300.0,
        config=True,
        help="""How long a workspace may stay over its GPU memory
        share before the memory_resolver acts. Example::

            c.IdleCuller.memory_grace_s = 600
        """,
    )
    park_after_s = Seconds(
        None,
        allow_none=True,
        config=True,
        help="""Park a workspace whose GPU stayed idle
        this long: its kernels' GPU memory moves to host memory (CUDA driver r570+, see
        c.GPUParking), its share goes back to the pool and the notebook stays open; the GPU comes
        back when the user runs a cell. Parking replaces the GPU-idle stop (idle_limit_s,
        gpu_idle_hard_s); the time limits still apply. 0: never park. Unset (the default): 10
        minutes where the hub can park (its own NVIDIA GPUs, a driver with process checkpoints,
        no MPS; not on Kubernetes), else never; the hub's log says which applies at start
        (docs/culling.md#defaults). Example (5 minutes)::

            c.IdleCuller.park_after_s = 300
        """,
    )
    parked_stop_s = Seconds(
        0.0,
        config=True,
        help="""Stop a parked workspace whose owner has not used
        Jupyter for this long (0: only max_age_s and workday_end end a parked session). Example::

            c.IdleCuller.parked_stop_s = 24 * 3600
        """,
    )
    hibernate = Bool(
        False,
        config=True,
        help="""Hibernate instead of losing the notebooks: before the culler stops a workspace
        (any rule but memory), the workspace's own Jupyter server saves each kernel's variables to
        the user's home (~/.gpupool/hibernate, as the user), and the next start of that notebook
        brings them back before its first cell runs, saying what came back and what could not
        (docs/culling.md#hibernation). Needs the culler to enter servers (access:servers). On per
        group or profile too. Example::

            c.IdleCuller.group_overrides = {"students": {"hibernate": True}}
        """,
    )
    hibernate_max_gib = Float(
        8.0,
        config=True,
        help="""A session whose saved state would be larger than this is stopped as before,
        its variables lost, and the reason says so. Example::

            c.IdleCuller.hibernate_max_gib = 16
        """,
    )
    hibernate_quota_gib = Float(
        32.0,
        config=True,
        help="""All hibernated states of one user together at most this (their home's disk);
        over it a session is stopped as before, with the reason. 0: no quota. Example::

            c.IdleCuller.hibernate_quota_gib = 64
        """,
    )
    hibernate_keep_days = Float(
        14.0,
        config=True,
        help="""A hibernated state not woken for this many days is deleted (at the user's next
        hibernation). 0: kept until woken. Example::

            c.IdleCuller.hibernate_keep_days = 30
        """,
    )
    group_overrides = LimitOverrides(
        config=True,
        help="""Per-group limits (keys as the options above).
        A user in several groups gets the most generous value of each limit: the longest time,
        0 ("never") for gpu_idle_hard_s, max_age_s, park_after_s and parked_stop_s, the gentlest
        memory_resolver, the lowest util_threshold_pct, no workday_end if one group has none (else
        the latest, with that group's timezone). Example::

            c.IdleCuller.group_overrides = {"researchers": {"idle_limit_s": 4 * 3600}}
        """,
    )
    profile_overrides = LimitOverrides(
        config=True,
        help="""Per-profile limits, for work with long CPU-only
        phases; a profile's limits beat its user's groups'.
        Example::

            c.IdleCuller.profile_overrides = {"data-prep": {"idle_limit_s": 3 * 3600}}
        """,
    )
    exempt_users = List(
        Unicode(),
        config=True,
        help="""Users never culled. Example::

            c.IdleCuller.exempt_users = ["instructor"]
        """,
    )
    exempt_admins = Bool(
        True,
        config=True,
        help="""Never cull admins' workspaces. Example::

            c.IdleCuller.exempt_admins = False
        """,
    )
    sampler = Unicode(
        "nvml",
        config=True,
        help="""Where GPU use comes from: nvml (this machine),
        node-agent (Kubernetes; sampler_arg = agent URLs, comma-separated), demo (no GPU needed:
        each user says whether their workspace's GPU is busy, `%gpupool gpu busy|idle`; what
        `gpupool up --demo-culling` uses) or file (a JSON file someone else writes, as the tests
        do). Example::

            c.IdleCuller.sampler = "node-agent"
        """,
    )
    sampler_arg = Unicode(
        "",
        config=True,
        help="""Argument of the sampler (see sampler). Example::

            c.IdleCuller.sampler_arg = "http://node-agent.gpupool:9402/pods"
        """,
    )
    node_agent_token_file = Unicode(
        "",
        config=True,
        help="""File holding the token the node agents
        require (sampler node-agent): the gpupool chart's Secret `gpupool-node-agent-token`, mounted in
        the hub pod (see helm/z2jh-values.yaml). Empty: requests carry none, and agents started with
        a token answer 401. Example::

            c.IdleCuller.node_agent_token_file = "/etc/gpupool-agent/token"
        """,
    )
    metrics_port = Int(
        0,
        config=True,
        help="""Serve Prometheus metrics on this port (0: off). Example::

            c.IdleCuller.metrics_port = 9401
        """,
    )
    concurrency = Int(
        10,
        min=1,
        max=100,
        config=True,
        help="""At most this many requests to the hub at once
        in a pass (jupyterhub-idle-culler's --concurrency): pages of the user list after the first,
        and the per-workspace stops, parks and kernel restarts. 1 does everything one after
        another; more finishes a pass that stops a whole class at the end of a workday sooner,
        at the price of more load on the hub at that moment. Example::

            c.IdleCuller.concurrency = 4
        """,
    )

    arbiter = Union(
        [CallableTrait(), Unicode()],
        default_value="",
        config=True,
        help="""A hook that may
        veto what a pass decided, as jupyterhub-idle-culler's cull_arbiter_hook: called with
        keyword arguments `action` ("cull", "park" or "resolve-memory"), `reason` (the limit
        reached: idle, gpu-hard, max-age, workday, memory, budget, ...) and `workspace` (owner,
        name, groups, admin, profile, gpu_idle_s, ...); it returns True to let the culler act, False
        to keep the workspace this pass (it is asked again next pass). A hook that raises is
        logged and the culler acts as decided. In jupyterhub_config.py give its import path (the
        culler runs in its own process); in the culler's own config file (`python -m
        gpupool.idle_culler --config=...`) a function will do. Example::

            c.IdleCuller.arbiter = "mylab.culling.keep_exam_takers"
            # mylab/culling.py:
            #     def keep_exam_takers(*, action, reason, workspace):
            #         return "exam" not in workspace["groups"]
        """,
    )

    def arbiter_hook(self) -> Callable[..., object] | None:
        """The arbiter as a function (an import path imported now), None when unset."""
        if callable(self.arbiter):
            return self.arbiter
        if not self.arbiter:
            return None
        try:
            hook = import_item(self.arbiter)
        except (ImportError, AttributeError, ValueError) as err:
            raise TraitError(f"IdleCuller.arbiter: cannot import {self.arbiter!r}: {err}") from None
        if not callable(hook):
            raise TraitError(f"IdleCuller.arbiter: {self.arbiter!r} is not a function")
        return hook

    def limits(self) -> Limits:
        values = {f: getattr(self, f) for f in LIMIT_FIELDS}
        values["park_after_s"] = values["park_after_s"] or 0.0  # unset: the hub resolves it (parking_support)
        return Limits(**values)

    def policy(self) -> CullerPolicy:
        """The limits per group and profile; every value was checked when the config was read."""
        return CullerPolicy(
            default=self.limits(),
            groups=dict(self.group_overrides),
            profiles=dict(self.profile_overrides),
            exempt_users=frozenset(self.exempt_users),
        )

    def exempt(self, owner: str, admin: bool) -> bool:
        """Never culled: a listed user, or an admin when exempt_admins is on."""
        return owner in self.exempt_users or (self.exempt_admins and admin)

    def session_end(self) -> Callable[[str, Sequence[str], bool, str, float, bool], tuple[str, float] | None]:
        """The culler's time rules as one function the hub calls before the culler's first pass:
        (owner, groups, admin, profile, started, extended) -> (reason, end) or None (exempt)."""
        policy = self.policy()

        def end(
            owner: str, groups: Sequence[str], admin: bool, profile: str, started: float, extended: bool
        ) -> tuple[str, float] | None:
            if self.exempt(owner, admin):
                return None
            return session_end(started, extended, policy.limits_for(list(groups), profile))

        return end

    def parks(self) -> bool:
        """Does any rule park GPUs (then the culler calls the gpupool parking API)?"""
        overrides = [*self.group_overrides.values(), *self.profile_overrides.values()]
        return any(
            float(o.get("park_after_s", 0) or 0) > 0
            for o in [{"park_after_s": self.park_after_s}, *overrides]
        )

    def hibernates(self) -> bool:
        """Does any rule hibernate (then the culler needs access to the servers)?"""
        overrides = [*self.group_overrides.values(), *self.profile_overrides.values()]
        return any(o.get("hibernate") for o in [{"hibernate": self.hibernate}, *overrides])

    def hibernates_for(self) -> Callable[[Sequence[str], str], bool]:
        """Whether the culler's rules hibernate a workspace of a user in these groups started with
        this profile: (groups, profile) -> bool. The hub asks it before a user's own "Hibernate
        now" (gpupool.api.hibernation): where hibernation is off, it is off for the user too."""
        policy = self.policy()

        def on(groups: Sequence[str], profile: str) -> bool:
            return bool(policy.limits_for(list(groups), profile).hibernate)

        return on

    def restarts_kernels(self) -> bool:
        """Does any rule restart kernels (then the culler needs access to the servers)?"""
        overrides = [*self.group_overrides.values(), *self.profile_overrides.values()]
        return "restart-kernel" in {self.memory_resolver, *(o.get("memory_resolver") for o in overrides)}

    def as_dict(self) -> dict[str, Any]:
        """The settings the culler service gets, as JSON: an arbiter
        function travels as its import path, which the culler's process imports."""
        out = {name: getattr(self, name) for name in self.class_own_traits(config=True)}
        if callable(out["arbiter"]):
            hook = out["arbiter"]
            path = f"{getattr(hook, '__module__', '')}.{getattr(hook, '__qualname__', '')}"
            if "<" in path or path.startswith(("__main__.", ".")):
                raise TraitError(
                    "IdleCuller.arbiter: the culler runs in its own process and cannot"
                    f" import {path!r}; give the import path of a function in a module"
                )
            out["arbiter"] = path
        return out


def config_classes() -> list[type[Configurable]]:
    return [IdleCuller]
