"""The training loop in the hub process: each tick observes the runs, asks the pure scheduler
for a plan, and carries it out through the PoolManager (so build and train never double-book
a GPU) and the runner. `tick(now)` takes the time, so tests travel instead of sleeping.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
import random
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from sqlalchemy import select

from gpupool.alloc.manager import PoolManager, Workload
from gpupool.contain import Limits, WorkloadCgroups
from gpupool.host.accounts import AccountError, SystemAccounts, made_by_gpupool
from gpupool.hub import failpoints
from gpupool.pool import GPU, Request, get_policy
from gpupool.pool.actions import reclaimable
from gpupool.pool.actions.victims import cheapest_victims
from gpupool.pool.errors import DiskReserve
from gpupool.pool.pool_quotas import split_by_pool
from gpupool.pool.pools import within
from gpupool.pool.request import Placement
from gpupool.pool.training import Job, in_quota_split, schedule
from gpupool.runners.local import Account, LocalRunner, account_of, find_run, give_to, is_run, owner_ids
from gpupool.runners.safe_files import open_file
from gpupool.store import Allocation, Event, TrainJob
from gpupool.store.db import bounded
from gpupool.train.book import JobBook, make_job_folders
from gpupool.train.config import TrainPool
from gpupool.train.folders import folder_bytes, remove_folder, user_jobs_folder
from gpupool.train.idle import IdleClock
from gpupool.train.request import JobRequest
from gpupool.vocab.kinds import WorkloadKind
from gpupool.vocab.states import FINISHED, HAS_RUN, Intent, JobEvent, JobState, PreemptCause

log = logging.getLogger("gpupool.train")
NEVER_BEGAN = "the hub stopped before its run began"


class TrainingService(JobBook):
    """The embedded back-end: gpupool's own scheduler, jobs as local processes."""

    def __init__(
        self,
        pool: PoolManager,
        cfg: TrainPool,
        runner: LocalRunner | None = None,
        cgroups: WorkloadCgroups | None = None,
        idle_util_pct: float | None = None,
        gpu_use: Callable[[list[TrainJob]], dict[str, float | None]] | None = None,
        holds: Callable[[list[TrainJob]], dict[str, str]] | None = None,
        groups_of: Callable[[str], tuple[str, ...]] | None = None,
    ) -> None:
        super().__init__(pool, cfg, holds)
        # the owner's hub groups when a run starts (their c.Containment.group_limits apply)
        self.groups_of = groups_of or (lambda owner: ())
        self.runner = runner or LocalRunner(
            cfg.grace_s, cfg.python, cgroups, log_limit=cfg.max_log_mib * 1024 * 1024, path=cfg.job_path
        )
        self.policy = get_policy(cfg.placement_policy)
        self.rng = random.Random(0)
        self.pins: dict[str, Placement] = {}  # planned spots from a consolidation
        # GPUs freed for a build workspace are held for it, not handed back to train jobs
        self.build_holds: dict[tuple[str, str], tuple[Request, float]] = {}
        # the jobs preempted for each waiting workspace, named on its spawn page
        self.build_victims: dict[tuple[str, str], list[str]] = {}
        # idle train jobs: the idle culler's sampler, from the hub's set-up (GPU utilization per
        # job id, None when unknown) for projects with idle_gpu_s
        self.gpu_use = gpu_use
        self.idle_rules = cfg.idle_rules(idle_util_pct)  # the idle culler's threshold (set-up)
        self.idle = IdleClock()
        empty = sorted(n for n, p in self.pools.items() if not (p.models or p.nodes or p.gpus))
        if empty:  # a pool by node label exists on Kubernetes only; here it would be every GPU
            raise ValueError(
                f"TrainPool.node_pools {empty}: on one machine a pool needs models, nodes or gpus"
            )

    @property
    def shares_build_gpus(self) -> bool:
        """One pool shared with build workspaces, which come first: the pool asks this engine to
        make room for them (gpupool.alloc.hooks)."""
        return not self.cfg.train_gpus

    def account(self, owner: str, system: SystemAccounts | None = None) -> Account | None:
        """`system`: the accounts' settings, made once for many look-ups (a tick's)."""
        if self.cfg.run_as == "hub":
            return None
        try:
            account = account_of(owner, system or SystemAccounts(config=self.cfg.config))
        except AccountError as err:  # never falls back to the hub's account: that may be root
            raise PermissionError(str(err)) from None
        if account is None and self.cfg.run_as == "owner":
            raise PermissionError(f"user {owner} has no Unix account on this machine to run jobs as")
        return account

    def file_owner(self, owner: str) -> int:
        try:
            return owner_ids(self.account(owner))[0]
        except PermissionError:
            return owner_ids(None)[0]

    # --- changes from the API -------------------------------------------------
    def submit(self, job: JobRequest, now: float | None = None) -> TrainJob:
        """Record `job` as a new queued job, its code run by the hub's TrainPool.python (the
        jobs' accounts can run it), a notebook executed beside its input. An elastic job
        (`job.min_gpus`) runs on min_gpus to num_gpu whole GPUs; `job.pools` were checked by
        the caller."""
        if why := self.pool.disk_refusal():  # before its folder takes any of the reserve
            raise DiskReserve(why)
        account = self.account(job.owner)  # refused before anything is written
        if account is not None:
            self._show_jobs_to(job.owner, account)
        return self._record_new(
            job,
            job.code.command_line(self.cfg.python or sys.executable),
            now,
            prepare=(lambda folder: give_to(folder, account)) if account is not None else None,
        )

    def _show_jobs_to(self, owner: str, account: Account) -> None:
        """A user's own jobs folder (hub-owned, so the hub never works in a folder the user may
        change) is listable by the user's group only, and linked from their home as
        ~/gpupool-jobs, so JupyterLab opens the executed notebooks."""
        if "{username}" not in self.cfg.jobs_root or os.geteuid() != 0:
            return  # a folder shared by every user stays the hub's alone
        parent = user_jobs_folder(self.cfg.jobs_root, owner)
        make_job_folders(parent)
        st = parent.lstat()
        if st.st_uid == os.geteuid() and (st.st_gid, st.st_mode & 0o777) != (account.gid, 0o750):
            os.chown(parent, -1, account.gid, follow_symlinks=False)
            parent.chmod(0o750)  # the owner's group reads it; nobody but the hub writes it
        if not made_by_gpupool(account.name):
            return  # an admin's or a system account's home is left as it is
        try:
            home = os.open(account.home, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            return
        try:
            if os.fstat(home).st_uid != account.uid:
                return
            os.symlink(str(parent), "gpupool-jobs", dir_fd=home)  # never replaces what the user has there
            os.chown("gpupool-jobs", account.uid, account.gid, dir_fd=home, follow_symlinks=False)
        except FileExistsError:
            pass
        finally:
            os.close(home)

    def cancel(self, job_id: str, now: float | None = None, by: str = "") -> TrainJob:
        """The intent is written first; the signal follows (and is sent again by a restarted
        hub), so a cancelled job never comes back. `by`: who cancelled it (an admin, or its
        owner), said in its message and its log, so an owner learns why it ended."""
        now = now if now is not None else time.time()
        placement = None
        with self.pool.store.session() as s:
            row = s.get_one(TrainJob, job_id)
            who = cancelled_by(by, row.owner, now)
            if row.state == JobState.QUEUED:
                row.state, row.finished, row.message = JobState.CANCELLED, now, bounded(f"{who} while queued")
                # GPUs a crash left reserved for it go back with the cancel
                placement = self.pool.release_in(
                    s, Workload(WorkloadKind.TRAIN, row.owner, row.id), "cancelled while queued"
                )
            elif row.state in HAS_RUN:
                row.intent, row.state, row.message = (
                    Intent.CANCEL,
                    JobState.PREEMPTING,
                    bounded(f"cancelling: {who}"),
                )
                row.term_sent = row.term_sent or now
            # `who` is read back from here when the run has stopped (_settle)
            s.add(
                Event(
                    kind=JobEvent.CANCEL,
                    message=bounded(f"job {job_id} of {row.project} {who}"),
                    owner=row.owner,
                    name=job_id,
                    data={"by": by, "who": who},
                )
            )
            pid, workdir, sent, state = row.pid, row.workdir, row.term_sent, row.state
            log_row = TrainJob(id=row.id, owner=row.owner, workdir=row.workdir)
        if placement is not None:
            self.pool.state.release(placement)
        failpoints.reach("train.cancel.persisted")
        if state == JobState.PREEMPTING:
            self._log_line(log_row, f"--- gpupool: {who}: this run stops and the job ends ---")
        if pid and sent is not None:
            self.runner.preempt(pid, now, workdir, sent=sent, job_id=job_id)
        return self.known_job(job_id)

    # --- the loop ------------------------------------------------------------
    def tick(self, now: float | None = None) -> dict[str, object]:
        now = now if now is not None else time.time()
        self.runner.enforce(now)
        rows = self.jobs()
        changed = self._observe(now, rows)
        if self.pool.stopping or self.pool.disk_refusal():  # nothing new starts; ended runs are settled
            return {"admitted": [], "preempted": [], "moved": [], "resized": []}
        changed = self._stop_idle(now) or changed
        # the rows as read above where no run ended nor was told to stop: one read a tick fewer
        plan = self._plan(now, None if changed else rows)
        for p in plan.preempt:
            self._preempt(p.job, p.reason, now, p.cause, p.for_project)
        for m in plan.move:
            self.pins[m.job], self.pins[m.for_job] = m.to, m.target
            self._preempt(
                m.job,
                f"moved to {m.to.node} so that job {m.for_job} fits (consolidation)",
                now,
                PreemptCause.CONSOLIDATION,
            )
        for z in plan.resize:  # an elastic job restarts from its checkpoint at another size
            self.pins[z.job] = z.to
            self._preempt(z.job, z.reason, now, PreemptCause.RESIZE)
        for r in plan.reserve:
            if self.pins.get(r.job) != r.placement:
                self._reserved(r, now)
            self.pins[r.job] = r.placement
        for a in plan.admit:
            self.pins.pop(a.job, None)
            self._start(a.job, a.placement, now)
        return {
            "admitted": [a.job for a in plan.admit],
            "preempted": [p.job for p in plan.preempt],
            "moved": [m.job for m in plan.move],
            "resized": [z.job for z in plan.resize],
        }

    def _observe(self, now: float, rows: list[TrainJob]) -> bool:
        """Settle the runs of `rows` (all jobs) that ended, stop those past their max runtime;
        True when a job's row was written."""
        changed = False
        account_of_owner = self._accounts()
        for row in rows:
            if row.state not in HAS_RUN:
                continue
            ended: tuple[int, str] | None  # (exit code, reason) once the run is over
            if row.pid is None:  # the hub died between recording the run and starting it
                if not self.runner.clear(row.id):
                    continue  # what it started is being killed: settled once its cgroup is empty
                ended = (-9, NEVER_BEGAN)
            else:
                ended = self.runner.ended(row.pid, row.workdir, account_of_owner(row.owner), row.id)
                if ended is None:
                    if (
                        row.max_runtime_s
                        and row.state == JobState.RUNNING
                        and now - (row.started or now) >= row.max_runtime_s
                    ):
                        self._set(
                            row.id,
                            state=JobState.PREEMPTING,
                            intent=Intent.MAX_RUNTIME,
                            term_sent=now,
                            message="reached its max runtime",
                        )
                        self.runner.preempt(row.pid, now, row.workdir, job_id=row.id)
                        changed = True
                    continue
            self._settle(row.id, *ended, now=now)
            changed = True
        return changed

    def _accounts(self) -> Callable[[str], Account | None]:
        """Each owner's account (None where none), looked up once however many of their jobs
        run: a user database read and a settings object each made half of a tick's time at
        sixty running jobs. For one tick: an account may be made or removed between two."""
        system = SystemAccounts(config=self.cfg.config) if self.cfg.run_as != "hub" else None
        known: dict[str, Account | None] = {}

        def of(owner: str) -> Account | None:
            if owner not in known:
                known[owner] = self._account_or_none(owner, system)
            return known[owner]

        return of

    def _settle(self, job_id: str, code: int, reason: str, now: float) -> None:
        """A run ended: its GPUs go back and the job's next state is written in one transaction."""
        with self.pool.store.session() as s:
            row = s.get_one(TrainJob, job_id)
            placement = self.pool.release_in(
                s, Workload(WorkloadKind.TRAIN, row.owner, row.id), f"run ended ({code})"
            )
            row.pid, row.exit_code, row.term_sent = None, code, None
            if row.intent == Intent.CANCEL:
                row.state, row.finished, row.message = JobState.CANCELLED, now, _cancelled_by(s, row.id)
            elif row.intent == Intent.MAX_RUNTIME:
                row.state, row.finished, row.message = JobState.FAILED, now, "stopped at its max runtime"
            elif row.intent == Intent.IDLE:
                row.state, row.finished, row.message = JobState.FAILED, now, "idle GPU"
            elif row.intent == Intent.DISK_LIMIT:
                row.state, row.finished = JobState.FAILED, now
                row.message = (
                    f"stopped: its folder grew over {self.cfg.max_job_folder_mib} MiB"
                    " (c.TrainPool.max_job_folder_mib)"
                )
            elif row.state == JobState.PREEMPTING or reason == NEVER_BEGAN:
                # back in the queue with its original submit time: it keeps its place
                row.state = JobState.QUEUED
                row.message = "preempted; will resume" if reason != NEVER_BEGAN else f"requeued: {reason}"
                s.add(
                    Event(
                        kind=JobEvent.REQUEUE,
                        message=f"job {row.id} requeued after preemption",
                        owner=row.owner,
                        name=row.id,
                        data={},
                    )
                )
            else:
                row.state, row.finished = (JobState.SUCCEEDED if code == 0 else JobState.FAILED), now
                row.message = "" if code == 0 else bounded(reason or f"exit code {code}")
            row.intent = Intent.NONE
        if placement is not None:
            self.pool.state.release(placement)

    def at_stop(self, end_jobs: bool, now: float | None = None, reason: str = "the hub stopped") -> list[str]:
        """The hub stops (the pool refuses new work already): its running jobs end, back to the
        queue (`end_jobs`), or keep running for the next start to adopt. Lines for the log. Also
        `gpupool stop-jobs` (gpupool.wiring.stop_jobs), for the runs a stopped hub left: each
        job's preemption is written before its signal, so one interrupted is finished later."""
        now = now if now is not None else time.time()
        rows = [r for r in self.jobs() if r.state in HAS_RUN]
        if not rows:
            return ["no train job runs"]
        if end_jobs:
            for r in rows:
                if r.state == JobState.RUNNING:
                    self._preempt(r.id, reason, now, PreemptCause.HUB_STOP)
            return [
                f"{len(rows)} train job(s) told to stop (c.TrainPool.stop_jobs_at_stop): they go back to"
                " the queue and resume from their checkpoints at the next start"
            ]
        accounts = sorted({a.name if (a := self._account_or_none(r.owner)) else r.owner for r in rows})
        return [
            f"{len(rows)} train job(s) keep running as {', '.join(accounts[:10])}"
            f"{' ...' if len(accounts) > 10 else ''} ({', '.join(r.id for r in rows[:10])}): they are"
            " adopted at the next start; `gpupool stop-jobs` ends them now (they go back to the queue),"
            " `gpupool up --stop-jobs` (c.TrainPool.stop_jobs_at_stop) at every stop"
        ]

    def _account_or_none(self, owner: str, system: SystemAccounts | None = None) -> Account | None:
        try:
            return self.account(owner, system)
        except PermissionError:
            return None

    def _stop_idle(self, now: float) -> bool:
        """Warn, then stop, runs whose GPUs stay idle past their project's idle_gpu_s; True when
        a job's row was written."""
        if self.gpu_use is None or not self.idle_rules:
            return False
        changed = False
        rows = [r for r in self.jobs(state=JobState.RUNNING) if r.project in self.idle_rules]
        util = self.gpu_use(rows) if rows else {}
        by_id = {r.id: r for r in rows}
        for job_id, verdict, idle in self.idle.step(
            {(r.id, r.runs): self.idle_rules[r.project] for r in rows}, util, now
        ):
            row = by_id[job_id]
            rule = self.idle_rules[row.project]
            if verdict == "warn":
                msg = (
                    f"its GPUs have been idle for {idle / 60:.0f} min: it will be stopped in"
                    f" {(rule.idle_s - idle) / 60:.0f} min unless it uses them"
                )
                self._log_line(row, f"--- gpupool: {msg} ---")
                self._set(job_id, message=f"warning: {msg}")
                self.pool.store.record(
                    JobEvent.IDLE_WARNING, f"job {job_id}: {msg}", owner=row.owner, name=job_id
                )
                changed = True
                continue
            self._log_line(
                row, f"--- gpupool: its GPUs were idle for {idle / 60:.0f} min: stopped (idle GPU) ---"
            )
            # the intent is written before the signal, so a hub restart in between still ends it "idle GPU"
            self._set(
                job_id,
                state=JobState.PREEMPTING,
                intent=Intent.IDLE,
                term_sent=now,
                message="stopping: idle GPU",
            )
            if row.pid is not None:  # else its run never began: _observe clears what is left of it
                self.runner.preempt(row.pid, now, row.workdir, job_id=row.id)
            self.pool.store.record(
                JobEvent.IDLE_STOP,
                f"job {job_id} of {row.project} stopped: idle GPU for {idle / 60:.0f} min",
                owner=row.owner,
                name=job_id,
            )
            changed = True
        return changed

    @staticmethod
    def _log_line(row: TrainJob, line: str) -> None:
        """Append to the job's log as the runner opens it (gpupool.runners.safe_files): no link
        followed, never blocking (a FIFO its owner put there would hold the hub's loop until
        someone read it), only a regular file of the folder's owner. A line that cannot be written
        (the jobs' disk full, which the database's need not be) is only logged: the cancel or stop
        it announces goes on, and the job ends as recorded."""
        try:
            dir_fd = os.open(row.workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                fd = open_file(dir_fd, "job.log", os.O_WRONLY | os.O_APPEND, os.fstat(dir_fd).st_uid)
            finally:
                os.close(dir_fd)
            with os.fdopen(fd, "a") as f:
                f.write(line + "\n")
        except OSError as err:
            log.warning("cannot write to the log of job %s: %s", row.id, err)

    def scheduler_inputs(self, rows: list[TrainJob]) -> tuple[list[Job], list[Job], list[Job]]:
        """(pending, running, stopping) as the scheduler sees `rows`; queued jobs held by a
        GPU-hour budget (`holds`) are not pending."""
        elastic = {r.id: (r.min_gpus, r.max_gpus) for r in rows if r.min_gpus}
        chosen = {r.id: tuple(r.pools) for r in rows if r.pools}
        held = self.holds(rows) if self.holds is not None else {}
        # every train allocation in one read: one query per job made a tick over sixty jobs
        # hold the hub's event loop ~80 ms, every tick (benchmarks.neighbours' sweep flood)
        allocs = self.train_allocations()
        pending = [
            replace(
                self.scheduler_job(r, self.pins.get(r.id), elastic.get(r.id), allocs),
                pools=chosen.get(r.id, ()),
            )
            for r in rows
            if r.state == JobState.QUEUED and r.project in self.projects and r.id not in held
        ]
        running = [
            replace(self.scheduler_job(r, None, elastic.get(r.id), allocs), pools=chosen.get(r.id, ()))
            for r in rows
            if r.state == JobState.RUNNING
        ]
        stopping = [self.scheduler_job(r, allocs=allocs) for r in rows if r.state == JobState.PREEMPTING]
        return pending, running, stopping

    def train_allocations(self) -> dict[tuple[str, str], Allocation]:
        """(owner, job id) -> the job's allocation, for every train job holding one."""
        return {(a.owner, a.name): a for a in self.pool.store.allocations(kind=WorkloadKind.TRAIN)}

    def _plan(self, now: float, rows: list[TrainJob] | None = None):
        """`rows`: every job's row as now (else read)."""
        self.build_holds = {k: v for k, v in self.build_holds.items() if v[1] > now}
        self.build_victims = {k: v for k, v in self.build_victims.items() if k in self.build_holds}
        pending, running, stopping = self.scheduler_inputs(self.jobs() if rows is None else rows)
        return schedule(
            self.train_view(),
            self.projects,
            pending,
            running,
            now,
            self.policy,
            self.rng,
            stopping=stopping,
            departments=self.departments,
            reserve_after_s=self.cfg.reserve_after_s if self.cfg.reserve_after_s >= 0 else None,
            pools=self.pools,
        )

    def _reserved(self, r, now: float) -> None:
        """Tell the job's owner where it will start, and from when at the latest (if known)."""
        row = self.known_job(r.job)
        by = (
            "when the jobs there end"
            if r.start_by == float("inf")
            else f"in about {(r.start_by - now) / 60:.0f} min"
        )
        msg = f"waited long: GPUs {list(r.placement.gpus)} on {r.placement.node} are reserved for it; starts {by}"
        self._set(r.job, message=msg)
        self.pool.store.record(
            JobEvent.RESERVE, f"job {r.job} of {row.project}: {msg}", owner=row.owner, name=r.job
        )

    def wait_reason(self, row: TrainJob) -> str:
        """Why queued job `row` waits, from this scheduler's own view of the pool."""
        from gpupool.train.waiting import explain_here

        return explain_here(self, row)

    def train_view(self):
        """The pool as train jobs may see it: every allocation counts, excluded GPUs look full,
        room is kept for parked workspaces asking for their GPU back (gpupool.pool.parking)."""
        view = self.pool.newcomer_view().copy()
        for request, _ in self.build_holds.values():
            spot = self.policy.choose(view, request, self.rng)
            if spot is not None:
                view.apply(spot)  # room a build workspace is about to take
        if self.cfg.train_gpus:
            for g in range(view.gpu_free.shape[1]):
                if g not in self.cfg.train_gpus:
                    view.gpu_free[:, g] = -1
        return view

    def scheduler_job(
        self,
        row: TrainJob,
        pin: Placement | None = None,
        elastic: tuple[int, int] | None = None,
        allocs: Mapping[tuple[str, str], Allocation] | None = None,
    ) -> Job:
        """The scheduler's view of a row; an elastic job (min, max GPUs) asks for its minimum
        while queued, and runs at its current size (num_gpu). `allocs`: the train allocations
        read once for many rows (`train_allocations`); None: this row's is read now."""
        alloc = (
            self.pool.allocation(Workload(WorkloadKind.TRAIN, row.owner, row.id))
            if allocs is None
            else allocs.get((row.owner, row.id))
        )
        placement = pin
        if alloc is not None:
            placement = Placement(
                alloc.node, tuple(alloc.gpus), alloc.gpu_milli, alloc.cpu_milli, alloc.memory_mib
            )
        request = Request(row.num_gpu, row.gpu_milli)
        if elastic is not None:
            request = Request(row.num_gpu if row.state != JobState.QUEUED else elastic[0])
        return Job(
            id=row.id,
            project=row.project,
            request=request,
            min_gpus=elastic[0] if elastic else 0,
            max_gpus=elastic[1] if elastic else 0,
            submitted=row.submitted,
            priority=row.priority,
            min_runtime_s=row.min_runtime_s,
            started=row.started,
            placement=placement,
            max_runtime_s=row.max_runtime_s or 0.0,
        )

    def _start(self, job_id: str, placement: Placement, now: float) -> None:
        """Reserve, record the run, start the process, record its pid. A crash between any
        two steps is repaired by `adopt_after_restart`; a start that fails ends the job
        `failed` with the reason, its GPUs returned in the same transaction."""
        row = self.known_job(job_id)
        w = Workload(WorkloadKind.TRAIN, row.owner, row.id)
        self.pool.reserve_at(w, placement)
        if row.runs == 0:  # an admission the placement policy learns from; a resume is the same job
            self.policy.learn(Request(row.num_gpu, row.gpu_milli))
        failpoints.reach("train.start.reserved")
        resumed = row.runs > 0
        self._set(
            job_id,
            state=JobState.RUNNING,
            started=now,
            pid=None,
            runs=row.runs + 1,
            intent=Intent.NONE,
            term_sent=None,
            message="resumed from its checkpoint" if resumed else "",
        )
        failpoints.reach("train.resume.recorded" if resumed else "train.start.recorded")
        node = self.pool.inventory.node(placement.node)
        gpus = [node.gpus[i] for i in placement.gpus]
        env = {
            "CUDA_VISIBLE_DEVICES": ",".join(str(g.index) if g.virtual else g.uuid for g in gpus),
            "GPUPOOL_GPU_FRACTION": str(placement.total_milli / 1000),
            "GPUPOOL_GPUS": str(len(gpus)),
        }  # this run's size (an elastic job's changes between runs)
        if len(gpus) != row.num_gpu and placement.gpu_milli == 1000:
            self._set(job_id, num_gpu=len(gpus))  # an elastic job runs at another size now
        try:
            pid = self.runner.start(
                row.id,
                row.command,
                row.workdir,
                env,
                row.runs + 1,
                self.account(row.owner),
                limits=self.run_limits(gpus, row.owner),
            )
        except (OSError, ValueError) as err:  # PermissionError (no account) is an OSError
            log.warning("job %s could not start: %s", job_id, err)
            self._fail_start(job_id, f"could not start: {err}", now)
            return
        failpoints.reach("train.start.spawned")
        with self.pool.store.session() as s:
            r = s.get_one(TrainJob, job_id)
            r.pid = pid
            alloc = s.scalar(_alloc_query(w))
            if alloc is not None:
                alloc.state, alloc.pid = "running", pid
            s.add(
                Event(
                    kind=JobEvent.RESUME if resumed else JobEvent.START,
                    owner=row.owner,
                    name=job_id,
                    data={},
                    message=f"job {job_id} {'resumed' if resumed else 'started'}"
                    f" on {placement.node} GPU {list(placement.gpus)}",
                )
            )

    def run_limits(self, gpus: list[GPU], owner: str = "") -> Limits:
        """A run's cgroup limits: its GPUs' device nodes; memory, processes and CPU as its owner's
        groups have them now (the same rule as a workspace's, without a profile)."""
        cgroups = self.runner.cgroups
        minors = [g.device_minor for g in gpus]
        if cgroups is None:
            return Limits(frozenset(minors))
        return cgroups.limits(minors, self.groups_of(owner) if owner else ())

    def _fail_start(self, job_id: str, reason: str, now: float) -> None:
        with self.pool.store.session() as s:
            row = s.get_one(TrainJob, job_id)
            placement = self.pool.release_in(
                s, Workload(WorkloadKind.TRAIN, row.owner, row.id), "its start failed"
            )
            row.state, row.finished, row.pid, row.message = JobState.FAILED, now, None, bounded(reason)
            s.add(
                Event(
                    kind=JobEvent.FAIL,
                    message=bounded(f"job {job_id} failed to start: {reason}"),
                    owner=row.owner,
                    name=job_id,
                    data={},
                )
            )
        if placement is not None:
            self.pool.state.release(placement)

    def room_for_build(
        self, request: Request, now: float | None = None, pools: tuple[str, ...] = ()
    ) -> list[str] | None:
        """The train jobs a build workspace of `request` would preempt to fit (within its node
        `pools`, if any): [] when it fits once the jobs already stopping are gone, None when not
        even every over-quota job makes room. Changes nothing: the spawn form asks it to offer
        what build-first can free, and says so."""
        now = now if now is not None else time.time()
        rows = self.jobs()
        allocs = self.train_allocations()
        running = [self.scheduler_job(r, allocs=allocs) for r in rows if r.state == JobState.RUNNING]
        stopping = [self.scheduler_job(r, allocs=allocs) for r in rows if r.state == JobState.PREEMPTING]
        # per-pool guarantees: who is over quota is decided within each pool
        projects, _, running, stopping = split_by_pool(
            self.projects, self.pools, self.pool.inventory, [], running, stopping
        )
        _, over = in_quota_split(projects, running)
        trial = self.pool.state.copy()
        if pools:  # only the GPUs of the workspace's node pools count
            trial = within(trial, [self.pool.node_pools[p] for p in pools if p in self.pool.node_pools])
        for s in stopping:
            if s.placement is not None:
                trial.release(s.placement)
        if self.policy.choose(trial, request, self.rng) is not None:
            return []  # GPUs already on their way back

        def frees(victims) -> bool:
            room = trial.copy()
            for v in victims:
                room.release(v.placed)
            return self.policy.choose(room, request, self.rng) is not None

        # the same choice as a reclaim: the fewest GPU-seconds lost within the lowest priorities
        chosen = cheapest_victims(
            reclaimable(running, over, projects, now),
            frees,
            now,
            tier=lambda j: (projects[j.project].priority, j.priority),
        )
        return None if chosen is None else [j.id for j in chosen]

    def make_room_for_build(
        self, w: Workload, request: Request, now: float | None = None, pools: tuple[str, ...] = ()
    ) -> str:
        """Preempt over-quota train jobs (youngest, lowest priority first, past min runtime) until
        `request` fits (within the workspace's node `pools`, if any); "" when even that would
        not make room, else what is being done, for the spawn page ("preempting job X of project
        P, ~20 s"). Build workspaces are never preempted; in-quota train jobs neither."""
        now = now if now is not None else time.time()
        victims = self.room_for_build(request, now, pools)
        if victims is None:
            return ""
        for job_id in victims:
            self._preempt(job_id, "a build workspace needs its GPU", now, PreemptCause.BUILD)
        key = (w.owner, w.name)
        if victims:  # a retry of the same start finds them stopping ([]): still the ones it waits for
            self.build_victims[key] = victims
        # hold the room until the workspace starts, or for a while after the grace period
        self.build_holds[key] = (request, now + self.cfg.grace_s + 300)
        return self.making_room(self.build_victims.get(key, []), now)

    def making_room(self, job_ids: list[str], now: float) -> str:
        """What a workspace waiting for a reclaim waits for: each job still stopping, and about
        how long until its grace period ends (it is killed then, at the latest)."""
        said = []
        for job_id in job_ids:
            row = self.job(job_id)
            if row is None or row.state != JobState.PREEMPTING:
                continue
            left = max(1, math.ceil((row.term_sent or now) + self.cfg.grace_s - now))
            said.append(f"job {job_id} of project {row.project}, ~{left} s")
        if not said:
            return "the GPUs of train jobs that borrowed them are coming back"
        return "preempting " + "; ".join(said)

    def _preempt(
        self, job_id: str, reason: str, now: float, cause: PreemptCause, for_project: str = ""
    ) -> None:
        """Stop the run; it goes back to the queue. Its event says why as fields (`cause`,
        `for_project`, `reason`), which the job monitor's line is made from (waiting.last_preemption)."""
        with self.pool.store.session() as s:
            row = s.get_one(TrainJob, job_id)
            row.state, row.preemptions = JobState.PREEMPTING, row.preemptions + 1
            row.message, row.term_sent = bounded(f"preempted: {reason}"), row.term_sent or now
            s.add(
                Event(
                    kind=JobEvent.PREEMPT,
                    message=bounded(f"job {job_id} of {row.project} preempted: {reason}"),
                    owner=row.owner,
                    name=job_id,
                    data={"cause": cause, "for_project": for_project, "reason": bounded(reason, 500)},
                )
            )
            pid, workdir, sent = row.pid, row.workdir, row.term_sent
            log_row = TrainJob(id=row.id, owner=row.owner, workdir=row.workdir)
        failpoints.reach("train.preempt.persisted")
        if pid:
            self._log_line(
                log_row,
                f"--- gpupool: preempted at {clock(now)}: {reason}; the job goes back to the"
                " queue and resumes from its checkpoint ---",
            )
            self.runner.preempt(pid, now, workdir, sent=sent, job_id=job_id)

    def adopt_after_restart(self, now: float | None = None) -> None:
        """After a hub restart: runs still alive keep going (the runner reads their exit file
        when they end), with their persisted SIGTERM/SIGKILL deadlines; a run started just
        before the crash is found by its folder; GPUs held for a job that is not running go
        back. Runs that died with the hub are settled by the next tick, never run twice."""
        now = now if now is not None else time.time()
        for row in self.jobs():
            if row.state not in HAS_RUN:
                if self.pool.release(
                    Workload(WorkloadKind.TRAIN, row.owner, row.id), reason="not running (reconciled)"
                ):
                    log.warning("released the GPUs of job %s, which is %s", row.id, row.state)
                continue
            if row.pid is None:
                pid = self._find_run(row)
                if pid is None:
                    continue  # the next tick settles it: requeued, cancelled or failed by its intent
                self._set(row.id, pid=pid)
                self.pool.mark_running(Workload(WorkloadKind.TRAIN, row.owner, row.id), pid)
                row.pid = pid
            if self.runner.ended(row.pid, row.workdir, self._account_or_none(row.owner), row.id) is None:
                log.info("re-adopted job %s (pid %s)", row.id, row.pid)
                self.pool.seen_running(Workload(WorkloadKind.TRAIN, row.owner, row.id))
                if row.state == JobState.PREEMPTING:  # the signal may not have gone out before the crash
                    self.runner.preempt(row.pid, now, row.workdir, sent=row.term_sent or now, job_id=row.id)

    # --- job folders (called off the event loop where they walk folders: gpupool.wiring.setup) -------
    def measure_folders(self) -> dict[str, int]:
        """Bytes used by each running job's folder (stops counting past the limit)."""
        limit = self.cfg.max_job_folder_mib * 1024 * 1024
        if not limit:
            return {}
        return {r.id: folder_bytes(r.workdir, stop_over=limit) for r in self.jobs(state=JobState.RUNNING)}

    def stop_over_folder_limit(self, sizes: dict[str, int], now: float) -> list[str]:
        """Stop the running jobs whose folder is over c.TrainPool.max_job_folder_mib: they fail with
        the reason (the intent is written before the signal, as for a cancel)."""
        limit = self.cfg.max_job_folder_mib * 1024 * 1024
        stopped = []
        for job_id, size in sizes.items():
            row = self.job(job_id)
            if not limit or size <= limit or row is None or row.state != JobState.RUNNING or not row.pid:
                continue
            msg = f"its folder holds {size // (1024 * 1024)} MiB, over the limit of {self.cfg.max_job_folder_mib} MiB"
            self._log_line(row, f"--- gpupool: {msg}: stopped ---")
            self._set(
                job_id,
                state=JobState.PREEMPTING,
                intent=Intent.DISK_LIMIT,
                term_sent=now,
                message=f"stopping: {msg}",
            )
            self.runner.preempt(row.pid, now, row.workdir, job_id=row.id)
            self.pool.store.record(
                JobEvent.DISK_LIMIT, f"job {job_id} stopped: {msg}", owner=row.owner, name=job_id
            )
            stopped.append(job_id)
        return stopped

    def remove_old_folders(self, now: float) -> list[str]:
        """Remove the folders of jobs finished more than c.TrainPool.keep_finished_days ago; their
        records stay, saying so."""
        keep_s = self.cfg.keep_finished_days * 86400
        if not keep_s:
            return []
        removed = []
        for row in self.jobs():
            if row.state not in FINISHED or not row.finished or now - row.finished < keep_s:
                continue
            if not os.path.lexists(row.workdir):
                continue
            if remove_folder(row.workdir):
                removed.append(row.id)
                self.pool.store.record(
                    JobEvent.FOLDER_REMOVED,
                    f"the folder of job {row.id} was removed"
                    f" {self.cfg.keep_finished_days:g} days after it ended",
                    owner=row.owner,
                    name=row.id,
                )
            else:
                log.warning("could not remove the folder of job %s: %s", row.id, row.workdir)
        return removed

    def _find_run(self, row: TrainJob) -> int | None:
        """The wrapper of a run started just before a crash: in the job's cgroup, else by its folder."""
        runner = self.runner
        if runner.contained:
            cg = runner.contained_cgroups
            found = [p for p in cg.tree.pids(cg.job(row.id)) if is_run(p, row.workdir)]
            if found:
                return found[0]
        return find_run(row.workdir)


def _alloc_query(w: Workload):
    from sqlalchemy import select

    return select(Allocation).filter_by(kind=w.kind, owner=w.owner, name=w.name)


def _cancelled_by(s, job_id: str) -> str:
    """Who cancelled the job and when ("cancelled by its owner at 14:02"), from its last cancel
    event's fields; "cancelled" when there is none."""
    event = s.scalar(
        select(Event).filter_by(kind=JobEvent.CANCEL, name=job_id).order_by(Event.id.desc()).limit(1)
    )
    data = (event.data or {}) if event is not None else {}
    if data.get("who"):
        return data["who"]
    if event is not None and "by" in data:  # recorded before "who" was: the same words from its time
        return cancelled_by(data["by"], event.owner, event.time.replace(tzinfo=dt.UTC).timestamp())
    return "cancelled"


def clock(epoch: float) -> str:
    return time.strftime("%H:%M", time.localtime(epoch))


def cancelled_by(by: str, owner: str, now: float) -> str:
    """ "cancelled by its owner at 14:02" / "cancelled by admin at 14:02": what the job's owner reads."""
    who = "its owner" if not by or by == owner else by
    return f"cancelled by {who} at {clock(now)}"
