"""The one pool set-up tests share: a PoolManager on a fresh SQLite file, and the embedded
training service on top of it, with the usual small quotas. Each test passes what it is about
(how many GPUs, which limits, which TrainPool settings) and nothing else.

    pool = make_pool(tmp_path, 2)
    svc = make_training(tmp_path, 1, projects={"lab": {"guarantee": 1}}, grace_s=1)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from traitlets.config import Config

from gpupool.alloc.hooks import PoolHooks, ServiceHooks, Services
from gpupool.alloc.manager import PoolManager
from gpupool.pool import BuildLimits, BuildQuotaPolicy, Inventory, get_policy, virtual_inventory
from gpupool.pool.placement import Policy
from gpupool.store import Store
from gpupool.train.config import TrainPool
from gpupool.train.service import TrainingService
from tests.support.wait import TIMEOUT_S, until

# one GPU per user, a quarter or a whole one per workspace, two workspaces
LIMITS = BuildLimits(1000, (250, 1000), 1000, 2)


def make_pool(
    tmp_path: Path,
    gpus: int | Inventory = 1,
    *,
    limits: BuildLimits | BuildQuotaPolicy = LIMITS,
    placement: str | Policy = "best-fit",
    db: str = "pool.sqlite",
    cls: type[PoolManager] = PoolManager,
    hooks: PoolHooks | None = None,
) -> PoolManager:
    """A pool manager with `gpus` virtual GPUs on one node (or the Inventory given), `limits` for
    every user (or a whole BuildQuotaPolicy), a placement policy by name or object, and its
    database `tmp_path/db` (a second manager on the same file is a restarted hub); `hooks`: what
    it asks of services (gpupool.alloc.hooks; none by default). `db` may also be a whole URL
    (the `store_url` fixture's PostgreSQL database)."""
    inventory = virtual_inventory(gpus) if isinstance(gpus, int) else gpus
    quotas = limits if isinstance(limits, BuildQuotaPolicy) else BuildQuotaPolicy(limits)
    policy = get_policy(placement) if isinstance(placement, str) else placement
    url = db if "://" in db else f"sqlite:///{tmp_path / db}"  # a URL: another database (PostgreSQL)
    return cls(inventory, Store(url), quotas, policy, hooks=hooks)


def train_config(tmp_path: Path, **settings: object) -> Config:
    """TrainPool config: jobs under `tmp_path/jobs/<user>` (kept Kubernetes logs in `tmp_path/train-logs`) unless `jobs_root` is given, then `settings`."""
    c = Config()
    c.TrainPool.jobs_root = str(tmp_path / "jobs" / "{username}")
    c.TrainPool.kube_logs_dir = str(tmp_path / "train-logs")  # on Kubernetes: the hub's kept job logs
    for name, value in settings.items():
        setattr(c.TrainPool, name, value)
    return c


def make_training(
    tmp_path: Path,
    gpus: int | Inventory = 1,
    *,
    limits: BuildLimits | BuildQuotaPolicy = LIMITS,
    placement: str | Policy = "best-fit",
    db: str = "pool.sqlite",
    **settings: object,
) -> TrainingService:
    """The embedded training service on `make_pool(tmp_path, gpus, ..., db=db)`; `settings` are TrainPool's.
    The pool asks it to make room for build workspaces, as in the hub (gpupool.wiring.root.services)."""
    svc: TrainingService | None = None
    pool = make_pool(
        tmp_path, gpus, limits=limits, placement=placement, db=db, hooks=ServiceHooks(lambda: services(svc))
    )
    svc = TrainingService(pool, TrainPool(config=train_config(tmp_path, **settings)))
    return svc


def services(training: TrainingService | None = None, **others: Any) -> Services:
    """What a test's pool asks (gpupool.alloc.hooks.Services): the training engine where it shares
    the build workspaces' GPUs, as the hub's root hands it, and any other service given."""
    shares = training is not None and training.shares_build_gpus
    return Services(training=training if shares else None, **others)


def run_until(
    svc: TrainingService,
    cond: Callable[[], object],
    what: str = "the jobs to get there",
    *,
    now: float | Callable[[], float] | None = None,
    timeout: float = TIMEOUT_S,
) -> None:
    """Tick `svc` until `cond()` holds while its jobs run as real processes. The scheduler sees
    `now` (a fixed time: the test travels it; a callable; or None: the wall clock, for grace and
    runtime limits that real processes live through). On a timeout: every job's state."""

    def tick() -> None:
        svc.tick(time.time() if now is None else now() if callable(now) else now)

    until(
        cond, what, timeout=timeout, every=0.05, step=tick, detail=lambda: [j.to_json() for j in svc.jobs()]
    )
