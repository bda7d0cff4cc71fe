"""A sweep over REST: its runs, the parameters each got, and each run's final printed metrics."""

from __future__ import annotations

from sqlalchemy import select
from tornado import web

from gpupool.api.auth import APIHandler
from gpupool.store import TrainJob
from gpupool.train.sweep import final_metrics
from gpupool.vocab.job_wire import SweepRun, SweepView

METRIC_LINES = 200  # the log lines read back for a run's final metrics


class SweepHandler(APIHandler):
    @web.authenticated
    async def get(self, sweep_id: str) -> None:
        training = self.services.training
        if training is None:
            raise web.HTTPError(503, "the training pool is not running on this hub")
        with self.pool.store.session() as s:  # a run is a job row with the sweep's id
            rows = list(s.scalars(select(TrainJob).filter_by(sweep_id=sweep_id[:32]).order_by(TrainJob.id)))
        if not rows or not (self.caller.admin or rows[0].owner == self.caller.name):
            raise web.HTTPError(404, f"no sweep {sweep_id!r} of yours")
        out: list[SweepRun] = []
        for row in rows:
            logs = await training.logs(row, METRIC_LINES)
            out.append(
                {
                    "job": {**row.to_json(), "queue_position": training.queue_position(row.id)},
                    "parameters": row.sweep_parameters or {},
                    "metrics": final_metrics(logs["lines"]),
                }
            )
        out.sort(key=lambda r: r["job"]["submitted"])
        keys = sorted({k for r in out for k in r["parameters"]})
        answer: SweepView = {"sweep": sweep_id, "parameters": keys, "runs": out}
        self.write_json(answer)
