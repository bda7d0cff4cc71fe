"""Admin settings of usage accounting, prices, budgets and right-sizing (traitlets)."""

from __future__ import annotations

from typing import Any

from traitlets import Dict, Enum, Float, Int, TraitError, Unicode, validate
from traitlets.config import Configurable

from gpupool.pool.units import UnitError, parse_gpus
from gpupool.usage.accounting import MILLI_S_PER_GPU_HOUR, Prices
from gpupool.usage.budgets import GROUP, USER, Rule

BUDGET_KEYS = {"gpu_hours", "window_days", "warn_at", "min_share", "shared"}
MAX_BUDGETS = 1000
MICRO = 1_000_000


class Usage(Configurable):
    """Where the GPU-hours go: accounting, prices, GPU-hour budgets and right-sizing advice."""

    retention_days = Float(
        90.0,
        config=True,
        help="""Days the event log and the GPU utilization
        samples are kept; older records are deleted every hour (usage reports reach back this
        far, and no budget window may be longer). Example::

            c.Usage.retention_days = 400
        """,
    )
    currency = Unicode(
        "",
        config=True,
        help="""What prices are in, shown next to costs (empty: no
        cost columns unless a price is set). Example::

            c.Usage.currency = "EUR"
        """,
    )
    prices = Dict(
        {},
        config=True,
        help="""Price of one GPU-hour (fraction-weighted: a 0.25 share
        for an hour costs a quarter), for the cost columns of usage reports. Keys: default, pools
        (per node pool of c.TrainPool.node_pools, which win) and models (per GPU model). Example::

            c.Usage.prices = {"default": 1.2, "pools": {"dgx": 3.5},
                              "models": {"NVIDIA RTX A2000": 0.4}}
        """,
    )
    budgets = Dict(
        {},
        config=True,
        help="""Optional GPU-hour budgets over a rolling window, counted
        fraction-weighted over build workspaces and train jobs. The key is a group name (each
        member has the budget; with "shared": true the members share it) or "user:NAME". Keys:
        gpu_hours, window_days (default 7), warn_at (share of the budget at which the user is
        warned, default 0.8), min_share (GPUs: over budget a workspace of at most this size
        still starts, default 0), shared. A user's own budget replaces their groups'; of several
        groups the most generous applies. Over budget, new spawns above min_share and new train
        jobs are refused with the reason and the time the budget frees, queued train jobs wait,
        running work is never stopped, and idle workspaces are parked (see over_budget).
        Admins exempt users or top their budgets up through the API (api/budgets). Example::

            c.Usage.budgets = {
                "students": {"gpu_hours": 40, "window_days": 7, "min_share": 0.1},
                "cs101": {"gpu_hours": 200, "window_days": 7, "shared": True},
                "user:ada": {"gpu_hours": 100, "window_days": 30},
            }
        """,
    )
    over_budget = Enum(
        ("park", "park-or-stop"),
        "park",
        config=True,
        help="""What the idle culler does
        with a workspace of a user over budget once its GPU has idled one culler window (a cell
        running on the GPU is never interrupted): park (where parking is on; else it keeps its
        GPU until its own idle limits) or park-or-stop (park where parking is on, else stop it).
        Example::

            c.Usage.over_budget = "park-or-stop"
        """,
    )
    rightsizing_sessions = Int(
        3,
        min=0,
        max=100,
        config=True,
        help="""Suggest a smaller GPU size on the
        spawn form and in %gpupool when a user's last this many workspace sessions each peaked at
        no more than half their share's GPU memory (0: never). Example::

            c.Usage.rightsizing_sessions = 5
        """,
    )
    sample_gap_s = Float(
        180.0,
        config=True,
        help="""Longest time one utilization sample of the culler
        stands for (a longer gap between samples counts as time without GPU data). Example::

            c.Usage.sample_gap_s = 300
        """,
    )
    metrics_window_s = Float(
        86400.0,
        config=True,
        help="""The window of the usage gauges on the hub's
        Prometheus endpoint (/hub/metrics). Example::

            c.Usage.metrics_window_s = 3600
        """,
    )

    @validate("retention_days")
    def _check_retention(self, proposal: dict[str, Any]) -> float:
        if not 1 <= proposal["value"] <= 3660:
            raise TraitError("Usage.retention_days must be between 1 and 3660")
        return proposal["value"]

    def price_table(self) -> Prices:
        def micro(value: object, where: str) -> int:
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1e6:
                raise TraitError(f"Usage.prices{where}: a price per GPU-hour from 0 to 1e6, got {value!r}")
            return round(value * MICRO)

        unknown = set(self.prices) - {"default", "pools", "models"}
        if unknown:
            raise TraitError(f"Usage.prices: unknown keys {sorted(unknown)}; use default, pools, models")
        tables = {}
        for key in ("pools", "models"):
            raw = self.prices.get(key, {})
            if not isinstance(raw, dict):
                raise TraitError(f"Usage.prices[{key!r}] must be a dict of names and prices")
            tables[key] = {str(k): micro(v, f"[{key!r}][{k!r}]") for k, v in raw.items()}
        return Prices(micro(self.prices.get("default", 0), "['default']"), tables["pools"], tables["models"])

    def budget_rules(self) -> list[Rule]:
        if len(self.budgets) > MAX_BUDGETS:
            raise TraitError(f"Usage.budgets: at most {MAX_BUDGETS} budgets")
        out = []
        for key, spec in self.budgets.items():
            where = f"Usage.budgets[{key!r}]"
            if not isinstance(key, str) or not key or len(key) > 260:
                raise TraitError(f"{where}: a group name or user:NAME")
            if not isinstance(spec, dict) or set(spec) - BUDGET_KEYS or "gpu_hours" not in spec:
                raise TraitError(f"{where} must be a dict with gpu_hours and some of {sorted(BUDGET_KEYS)}")
            hours, days = spec["gpu_hours"], spec.get("window_days", 7)
            warn, shared = spec.get("warn_at", 0.8), spec.get("shared", False)
            for name, value, lo, hi in (
                ("gpu_hours", hours, 0, 1e7),
                ("window_days", days, 1 / 24, self.retention_days),
                ("warn_at", warn, 0, 1),
            ):
                if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
                    raise TraitError(f"{where}: {name} must be a number from {lo:g} to {hi:g}, got {value!r}")
            if not isinstance(shared, bool):
                raise TraitError(f"{where}: shared must be true or false")
            try:
                min_share = parse_gpus(spec.get("min_share", 0))
            except UnitError as err:
                raise TraitError(f"{where}: min_share: {err}") from None
            is_user = key.startswith(USER)
            if is_user and shared:
                raise TraitError(f"{where}: a user's budget cannot be shared")
            target = key if is_user else GROUP + key
            out.append(
                Rule(
                    target,
                    round(hours * MILLI_S_PER_GPU_HOUR),
                    round(days * 86400),
                    round(warn * 100),
                    max(0, min_share),
                    bool(shared),
                )
            )
        return out
