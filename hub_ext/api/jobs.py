"""Train jobs over REST: submit (one job, or a sweep of them), list, get, cancel, logs.

Users see and cancel only their own jobs (another user's job is a 404: its existence is not
revealed); admins see all. Every bad input is a 4xx with a message, and changes nothing.
"""

from __future__ import annotations

import asyncio
import errno
import json
import secrets
import shlex
import time
from dataclasses import replace
from typing import Any

from tornado import web

from gpupool.api.auth import APIHandler, noted
from gpupool.api.sweeps import SweepHandler
from gpupool.pool import InvalidRequest, PoolError
from gpupool.store.jobs import STATES, TrainJob
from gpupool.train.backend import TrainingBackend, submit_whole
from gpupool.train.code import JobCode
from gpupool.train.job_form import JobRefused, parse_job
from gpupool.train.volume import SubmitRate, count_refusal, recent_submissions
from gpupool.train.waiting import explain, last_preemption
from gpupool.vocab.job_wire import JobList, JobView
from gpupool.vocab.kinds import WorkloadKind
from gpupool.vocab.states import HAS_RUN, UNFINISHED, JobState

MAX_BODY = 2 * 1024 * 1024  # a notebook snapshot fits; a data set does not
LOG_TAIL_MAX = 10_000
MAX_ARGS, MAX_ARG_CHARS = 1000, 16 * 1024  # a command line, not a data set


class JobsBase(APIHandler):
    @property
    def training(self) -> TrainingBackend:
        service = self.services.training
        if service is None:
            raise web.HTTPError(503, "the training pool is not running on this hub")
        return service

    @property
    def estimates(self):
        from gpupool.train.kai_estimates import start_estimates

        if self.services.estimates is None:  # made with the training service (ApiServices)
            self.services.estimates = start_estimates(self.training)
        return self.services.estimates

    def visible_job(self, job_id: str):
        row = self.training.job(job_id) if len(job_id) <= 32 else None
        if row is None or not (self.caller.admin or row.owner == self.caller.name):
            raise web.HTTPError(404, f"no job {job_id!r} of yours")
        return row

    async def job_json(self, row: TrainJob, queue: list[str] | None = None) -> JobView:
        """A job as the API shows it; `queue`: the queued jobs' ids in order, when many are shown."""
        if queue is None:
            position = self.training.queue_position(row.id)
        else:
            position = queue.index(row.id) + 1 if row.id in queue else None
        why = explain(self.training, row)  # plain words; "" unless queued
        held = self.training.holds([row]) if self.training.holds is not None else {}
        alloc = self.pool.store.allocations(kind=WorkloadKind.TRAIN, owner=row.owner, name=row.id)
        return {
            **row.to_json(),
            "queue_position": position,
            # a GPU-hour budget used up: it waits whatever the GPUs (gpupool.usage)
            "wait_reason": held.get(row.id, why),
            # when it should start, and why then; None unless queued (the forecast runs off the loop)
            "eta": await self.estimates.for_job(row),
            "preemption": last_preemption(self.pool, row),  # one line; "" if never preempted
            "gpu": [{"node": a.node, "gpus": a.gpus, "milli": a.gpu_milli} for a in alloc],
        }


class JobsHandler(JobsBase):
    max_body = MAX_BODY

    @web.authenticated
    async def get(self) -> None:
        caller = self.caller
        rows = (
            self.training.jobs()
            if caller.admin and self.get_argument("all", "")
            else self.training.jobs(owner=caller.name)
        )
        state = self.get_argument("state", "")  # e.g. "queued": the status bar's poll reads only those
        if state:
            if state not in STATES:
                raise web.HTTPError(400, f"state must be one of {', '.join(STATES)}")
            rows = [r for r in rows if r.state == state]
        queue = [j.id for j in self.training.jobs(state=JobState.QUEUED)]  # once, not once per job
        answer: JobList = {"jobs": [await self.job_json(r, queue) for r in rows]}
        self.write_json(answer)

    @web.authenticated
    async def post(self) -> None:
        caller = self.caller
        if caller.kind != "user":
            raise web.HTTPError(403, "jobs are submitted by users")
        svc = self.training
        rate = self.services.submit_rate
        if rate is None:  # the first submission since the hub started: the last minute's, from the database
            rate = SubmitRate(svc.cfg.max_submissions_per_minute)
            wall = time.time()
            rate.seed(
                await asyncio.to_thread(recent_submissions, svc.pool.store, wall), wall, time.monotonic()
            )
            if self.services.submit_rate is None:  # another request seeded it meanwhile: keep that one
                self.services.submit_rate = rate
            rate = self.services.submit_rate
        if why := rate.refuse(caller.name, time.monotonic()):
            raise web.HTTPError(429, why)
        # parsing, snapshotting and writing run off the hub's event loop: every user's request
        # waits on that loop, and a 2 MiB notebook takes a while
        body = await asyncio.to_thread(self.json_body, MAX_BODY)
        try:  # every field bounded and checked, before the database is read or anything written
            form = parse_job(
                body,
                caller.name,
                caller.groups,
                caller.admin,
                svc.cfg,
                svc.projects,
                svc.pools,
                self.pool.inventory.max_gpus_per_node,
            )
        except JobRefused as err:
            raise web.HTTPError(err.status, str(err)) from None
        if self.services.usage is not None:  # a GPU-hour budget used up refuses new jobs
            try:
                self.services.usage.check(
                    caller.name, caller.groups, form.request.total_milli, WorkloadKind.TRAIN
                )
            except PoolError as err:
                raise web.HTTPError(err.status, str(err)) from None
        runs = form.runs
        active = [j for state in UNFINISHED for j in svc.jobs(state=state)]  # not history
        if why := count_refusal(active, caller.name, form.project, len(runs), svc.cfg):
            raise web.HTTPError(429, why)
        codes = await asyncio.to_thread(
            lambda: [
                self.job_code(body if params is None else {**body, "parameters": params})
                for _, params in runs
            ]
        )
        job = form.job(caller.name, codes[0])
        # a sweep's runs carry its id and their parameters in their own rows, written with them
        sweep_id = secrets.token_hex(6) if "sweep" in body else ""
        try:
            # a sweep's runs differ in their names, code and parameters only; queued whole or not at all
            rows = await submit_whole(
                svc,
                [
                    replace(job, name=run_name, code=code, sweep_id=sweep_id, sweep_parameters=params)
                    for (run_name, params), code in zip(runs, codes, strict=True)
                ],
            )
        except PermissionError as err:
            raise web.HTTPError(403, noted(err)) from None
        except InvalidRequest as err:  # e.g. no queue for its pools (Kubernetes, a guarantee per pool)
            raise web.HTTPError(400, noted(err)) from None
        except PoolError as err:  # the databases' disk down to its reserve (507)
            raise web.HTTPError(err.status, noted(err)) from None
        except OSError as err:
            if err.errno == errno.ENOSPC:
                raise  # a full disk: 507, said as such (APIHandler.write_error)
            # e.g. the folder for the user's jobs is writable by others
            raise web.HTTPError(409, f"cannot make the job's folder: {noted(err)}") from None
        if not sweep_id:
            self.write_json(await self.job_json(rows[0]), status=201)
            return
        queue = [j.id for j in svc.jobs(state=JobState.QUEUED)]
        self.write_json(
            {"sweep": sweep_id, "jobs": [await self.job_json(r, queue) for r in rows]}, status=201
        )

    def job_code(self, body: dict[str, Any]) -> JobCode:
        """A command, a script, a cell's code or a notebook, as data: its files (snapshotted into
        the job folder) and how it is entered; the back-end says how it runs there."""
        given = [k for k in ("command", "script", "code", "notebook") if k in body]
        if len(given) != 1:
            raise web.HTTPError(400, "give exactly one of: command, script, code, notebook")
        kind, value = given[0], body[given[0]]
        if kind == "command":
            if isinstance(value, str):
                try:
                    value = shlex.split(value)
                except ValueError as err:  # unbalanced quotes
                    raise web.HTTPError(400, f"command: {err}") from None
            if (
                not isinstance(value, list)
                or not value
                or len(value) > MAX_ARGS
                or not all(isinstance(v, str) and len(v) <= MAX_ARG_CHARS and "\0" not in v for v in value)
            ):
                raise web.HTTPError(
                    400,
                    f"command must be a list of at most {MAX_ARGS} strings (or a shell-like"
                    ' string), e.g. ["python", "train.py"]',
                )
            return JobCode.command(value)
        if kind == "script":
            if not isinstance(value, str) or not value.strip():
                raise web.HTTPError(400, "script must be Python source")
            return JobCode.script(value.encode())
        if kind == "code" and not (
            isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))
        ):
            raise web.HTTPError(400, "code must be Python source: a string, or a list of cells' sources")
        if kind == "notebook" and not isinstance(value, dict):
            raise web.HTTPError(
                400, "notebook must be a notebook document (a JSON object, as in a .ipynb file)"
            )
        parameters = body.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise web.HTTPError(400, "parameters must be an object of names and values")
        import nbformat

        from gpupool.train.snapshot import SnapshotError, from_code, with_parameters

        try:
            nb = from_code(value) if kind == "code" else nbformat.reads(json.dumps(value), as_version=4)
            nb = with_parameters(nb, parameters)
            text = nbformat.writes(nb)
        except SnapshotError as err:
            raise web.HTTPError(400, f"{kind}: {err}") from None
        except Exception as err:  # noqa: BLE001 - nbformat rejects a malformed document in many ways
            raise web.HTTPError(400, f"{kind}: not a valid notebook: {type(err).__name__}: {err}") from None
        return JobCode.notebook(text.encode())


class JobHandler(JobsBase):
    @web.authenticated
    async def get(self, job_id: str) -> None:
        self.write_json(await self.job_json(self.visible_job(job_id)))

    @web.authenticated
    async def delete(self, job_id: str) -> None:
        row = self.visible_job(job_id)
        if row.state not in UNFINISHED:
            raise web.HTTPError(409, f"job {job_id} already {row.state}")
        row = await self.training.cancel(job_id, by=self.caller.name)
        self.write_json(await self.job_json(row))


class LogsHandler(JobsBase):
    @web.authenticated
    async def get(self, job_id: str) -> None:
        row = self.visible_job(job_id)
        lines = _whole(self.get_argument("tail", "200"), "tail", 1, LOG_TAIL_MAX)
        before = self.get_argument("before", None)
        more = {} if before is None else {"before": _whole(before, "before", 0, 2**62)}
        self.write_json({"id": job_id, "state": row.state, **await self.training.logs(row, lines, **more)})


def _whole(text: str, key: str, lo: int, hi: int) -> int:
    """A whole number from the query string, its length bounded before it is converted."""
    if not (text.isascii() and text.isdigit()) or len(text) > len(str(hi)) or not lo <= int(text) <= hi:
        raise web.HTTPError(400, f"{key} must be a whole number between {lo} and {hi}")
    return int(text)


class ProjectsHandler(JobsBase):
    @web.authenticated
    def get(self) -> None:
        svc = self.training
        running = [j for j in svc.jobs() if j.state in HAS_RUN]
        queued = [j for j in svc.jobs() if j.state == JobState.QUEUED]
        out: list[dict[str, Any]] = []
        caller = self.caller
        by_pool = self.used_by_pool(running)
        for p in svc.projects.values():
            out.append(
                {
                    "name": p.name,
                    "department": p.department,
                    "guarantee_milli": p.guarantee_milli,
                    "may_submit": svc.cfg.may_submit(p.name, caller.name, caller.groups, caller.admin),
                    "limit_milli": p.limit_milli,
                    "weight": p.weight,
                    "priority": p.priority,
                    "pools": list(p.pools),
                    "used_milli": sum(j.total_milli for j in running if j.project == p.name),
                    "queued": sum(1 for j in queued if j.project == p.name),
                }
            )
            if p.pool_guarantees:  # a guarantee per node pool, and what runs there (embedded: known)
                out[-1]["pool_guarantees"] = [
                    {
                        "pool": pool,
                        "guarantee_milli": g,
                        "used_milli": None if by_pool is None else by_pool.get((p.name, pool), 0),
                    }
                    for pool, g in p.pool_guarantees
                ]
        depts = [
            {
                "name": d.name,
                "guarantee_milli": d.guarantee_milli,
                "limit_milli": d.limit_milli,
                "projects": [p["name"] for p in out if p["department"] == d.name],
                "used_milli": sum(p["used_milli"] for p in out if p["department"] == d.name),
            }
            for d in svc.departments.values()
        ]
        pools = {
            n: {"models": sorted(p.models), "nodes": sorted(p.nodes), "gpus": sorted(p.gpus)}
            for n, p in svc.pools.items()
        }
        self.write_json({"projects": out, "departments": depts, "node_pools": pools})

    def used_by_pool(self, running: list[TrainJob]) -> dict[tuple[str, str], int] | None:
        """(project, pool) -> milli-GPU its running jobs use in that pool, for projects with a
        guarantee per pool; None where the hub does not place jobs itself (Kubernetes)."""
        from gpupool.pool.pool_quotas import in_pool

        svc = self.training.local
        if svc is None:
            return None
        out: dict[tuple[str, str], int] = {}
        for row in running:
            p = svc.projects.get(row.project)
            if p is None or not p.pool_guarantees:
                continue
            job = svc.scheduler_job(row)
            for pool, _ in p.pool_guarantees:
                if in_pool(svc.pools.get(pool), self.pool.inventory, job):
                    out[(p.name, pool)] = out.get((p.name, pool), 0) + job.milli
                    break
        return out


ROUTES: tuple[tuple[str, type[APIHandler]], ...] = (
    ("api/jobs", JobsHandler),
    (r"api/jobs/([^/]+)", JobHandler),
    (r"api/jobs/([^/]+)/logs", LogsHandler),
    ("api/projects", ProjectsHandler),
    (r"api/sweeps/([^/]+)", SweepHandler),
)
