"""A sweep over REST: its runs, the parameters each got, and each run's final printed metrics."""

from __future__ import annotations

import secrets

from sqlalchemy import select
from tornado import web

from gpupool.api.auth import APIHandler
from gpupool.store import SweepRun
from gpupool.train.sweep import final_metrics

METRIC_LINES = 200  # the log lines read back for a run's final metrics


def record_sweep(store, owner: str, rows: list, parameters: list[dict]) -> str:
    sweep_id = secrets.token_hex(6)
    with store.session() as s:
        for row, params in zip(rows, parameters, strict=True):
            s.add(SweepRun(job_id=row.id, sweep_id=sweep_id, owner=owner, parameters=params))
    return sweep_id


class SweepHandler(APIHandler):
    @web.authenticated
    async def get(self, sweep_id: str) -> None:
        training = self.services.training
        if training is None:
            raise web.HTTPError(503, "the training pool is not running on this hub")
        with self.pool.store.session() as s:
            runs = list(
                s.scalars(select(SweepRun).filter_by(sweep_id=sweep_id[:32]).order_by(SweepRun.job_id))
            )
        if not runs or not (self.caller.admin or runs[0].owner == self.caller.name):
            raise web.HTTPError(404, f"no sweep {sweep_id!r} of yours")
        out = []
        for run in runs:
            row = training.job(run.job_id)
            if row is None:
                continue
            logs = await training.logs(row, METRIC_LINES)
            data = row.to_json()
            data["queue_position"] = training.queue_position(row.id)
            out.append({"job": data, "parameters": run.parameters, "metrics": final_metrics(logs["lines"])})
        out.sort(key=lambda r: r["job"]["submitted"])
        keys = sorted({k for r in out for k in r["parameters"]})
        self.write_json({"sweep": sweep_id, "parameters": keys, "runs": out})
