"""`gpupool stop-jobs`: end the train jobs a stopped hub left running (they run on as their users'
accounts after a stop unless it was `gpupool up --stop-jobs`, and the next start adopts them).

It does what a stopping hub does with c.TrainPool.stop_jobs_at_stop, through the same code: the
hub's start-up adoption finds the runs (`TrainingService.adopt_after_restart`), `at_stop` writes
each job's preemption to the database before it signals the run, and the training cycle, which
admits nothing while the pool is stopping, sends SIGKILL after c.TrainPool.grace_s and puts each
ended job back in the queue with its GPUs released. A stop-jobs interrupted half way leaves rows
that say "preempting": the next `stop-jobs`, or the next start, finishes them.

Refused while a hub runs on the state folder: that hub owns its jobs (cancel them there). Both
hold the state folder's lock (`gpupool.host.state_lock`) while they run, so a hub started during a
stop-jobs refuses to start until it ends.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from traitlets.config import Config

WHY = "`gpupool stop-jobs` is ending the train jobs: nothing new starts"


class StopJobsError(Exception):
    """Nothing was stopped (or not all of it): the message says why."""


def hub_config(state: Path, config_file: str) -> Config:
    """What `gpupool up` would read about its databases, accounts, GPUs and jobs: the embedded
    hub's settings for `state`, then the admin's --config over them."""
    from gpupool.wiring.embedded import apply_demo, load_user_config, state_accounts, state_databases

    c = Config()
    state_databases(c, str(state))
    state_accounts(c, str(state))  # looked up only where they exist: a shared-account hub has none
    apply_demo(c)  # the virtual GPUs its allocations name, where NVML finds none
    load_user_config(c, config_file)
    c.SystemAccounts.create = False  # never make an account to stop a job
    return c


def stop_jobs(
    state: Path,
    config_file: str = "",
    proc_root: str = "/proc",
    clock: Callable[[], float] = time.time,
    pause: Callable[[float], None] = time.sleep,
) -> list[str]:
    """End the runs of `state`'s train jobs; they go back to the queue. Lines for the admin, one
    per job stopped."""
    from gpupool.host.backup import hub_processes
    from gpupool.host.state_lock import StateBusy, hold_state

    hubs = hub_processes(state, proc_root)
    if hubs:
        raise StopJobsError(
            f"a hub runs on {state} (pids {', '.join(map(str, hubs[:10]))}): its jobs are its own;"
            " cancel them from it, or stop it first (`gpupool up --stop-jobs` ends them at the stop)"
        )
    try:  # the kernel's answer while this runs: a hub started meanwhile refuses to start
        lock = hold_state(state, "`gpupool stop-jobs`")
    except StateBusy as err:
        raise StopJobsError(f"{err}: stop it first") from None
    except FileNotFoundError:
        return [f"no state folder at {state}: no train job to stop"]
    try:
        return _stop_jobs(state, config_file, clock, pause)
    finally:
        os.close(lock)


def _stop_jobs(
    state: Path, config_file: str, clock: Callable[[], float], pause: Callable[[float], None]
) -> list[str]:
    from gpupool.host.instance import LostState
    from gpupool.train.config import TrainPool
    from gpupool.train.service import TrainingService
    from gpupool.vocab.states import HAS_RUN
    from gpupool.wiring.root import GPUPoolHub, Unenforceable

    c = hub_config(state, config_file)
    root = GPUPoolHub(c)
    db = root.settings.db_url
    if db.startswith("sqlite:///") and not Path(db.removeprefix("sqlite:///")).is_file():
        return [f"no database at {db.removeprefix('sqlite:///')}: no train job to stop"]
    try:
        cgroups = root.cgroups  # the start-up check that the database is this hub's (host.instance)
    except (LostState, Unenforceable) as err:
        root.close()
        raise StopJobsError(str(err)) from None
    try:
        cfg = TrainPool(config=c)
        engine = TrainingService(root.pool, cfg, cgroups=cgroups)
        root.pool.stopping = WHY  # the cycles below settle runs and admit nothing
        engine.adopt_after_restart(clock())
        rows = [r for r in engine.jobs() if r.state in HAS_RUN]
        if not rows:
            return [f"no train job runs on {state}: nothing to stop"]
        engine.at_stop(True, clock(), reason="ended by `gpupool stop-jobs` after the hub stopped")
        deadline = clock() + cfg.grace_s + 30  # SIGKILL at grace_s, then the cgroup empties
        while left := [r.id for r in rows if (j := engine.job(r.id)) is not None and j.state in HAS_RUN]:
            if clock() > deadline:
                raise StopJobsError(
                    f"{len(left)} train job(s) still run {cfg.grace_s + 30:g} s after SIGTERM:"
                    f" {', '.join(left[:10])}; run `gpupool stop-jobs` again"
                )
            engine.tick(clock())
            pause(0.2)
        lines = []
        for r in rows:
            now = engine.job(r.id)
            state_now = now.state if now is not None else "gone"
            lines.append(f"stopped train job {r.id} ({r.name}) of {r.owner}: {state_now}")
        lines.append(
            f"{len(rows)} train job(s) stopped: they wait in the queue and resume from their"
            " checkpoints at the next start (cancel them then to drop them)"
        )
        return lines
    finally:
        root.close()
