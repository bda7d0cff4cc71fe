"""When will a queued job start, for the API, the job monitor and JupyterLab's status bar: the
inputs of the pure forward simulation (`gpupool.pool.eta`) gathered from the embedded training
service on the hub's event loop, the forecast itself computed in a thread (it takes up to
seconds of CPU), at most once per `ttl_s` for every queued job at once, never twice at a time.

On Kubernetes the cluster's scheduler (KAI) decides: `gpupool.train.kai_estimates` forecasts its order.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from gpupool.pool.eta import Estimate, Runtimes, expected_arrivals, forecast
from gpupool.pool.placement import detached
from gpupool.vocab.job_wire import JobEstimate
from gpupool.vocab.states import JobState

if TYPE_CHECKING:
    from gpupool.store import TrainJob
    from gpupool.train.service import TrainingService

HISTORY = 200  # finished runs per project that the expected run times come from


def run_history(rows: Iterable[TrainJob]) -> dict[str, list[float]]:
    """Per project, the run times (s) of its newest HISTORY succeeded jobs, newest first: what
    both forecasts (one machine's and KAI's) take the expected run times from."""
    history: dict[str, list[float]] = {}
    for r in sorted(rows, key=lambda r: r.finished or 0, reverse=True):
        if r.state == JobState.SUCCEEDED and r.started is not None and r.finished is not None:
            runs = history.setdefault(r.project, [])
            if len(runs) < HISTORY:
                runs.append(max(1.0, r.finished - r.started))
    return history


class Estimates:
    def __init__(
        self,
        training: TrainingService | None,
        ttl_s: float = 5.0,
        clock: Callable[[], float] = time.time,
        compute: Callable[..., dict[str, Estimate]] = forecast,
    ) -> None:
        """`training`: the embedded scheduler (a back-end's `local`); None: no estimates.
        `compute`: the pure forecast (`gpupool.pool.eta.forecast`; a test's own)."""
        self.training, self.ttl_s, self.clock, self.compute = training, ttl_s, clock, compute
        self._at = -1e18
        self._estimates: dict[str, Estimate] = {}
        self._runtimes = Runtimes()
        self._queued: set[str] = set()  # the queued jobs the last computation saw
        # each queued job's first estimate and its stated error: a later one that moved further says so
        self._first: dict[str, tuple[float, float]] = {}
        # the forecast being computed: one at a time, whoever asks meanwhile waits for it
        self._flight: asyncio.Future[None] | None = None

    @property
    def available(self) -> bool:
        return self.training is not None

    def _fresh(self, now: float, need: str) -> bool:
        return now - self._at < self.ttl_s and (not need or need in self._queued)

    async def refresh(self, now: float | None = None, need: str = "") -> dict[str, Estimate]:
        """Every queued job's estimate, no older than `ttl_s` and, with `need`, made after that
        queued job was seen. The forecast (up to seconds of CPU with many jobs expected) runs in
        a thread: every other request of the hub waits on its event loop. Never two at once."""
        now = self.clock() if now is None else now
        if self.training is None:
            return self._estimates
        for _ in range(2):  # one in flight may have begun before `need` was submitted: then ours
            if self._fresh(now, need):
                break
            if self._flight is None:
                self._flight = asyncio.ensure_future(self._compute(now))
                await asyncio.shield(self._flight)  # a request gone away leaves it for the others
                break
            await asyncio.shield(self._flight)
        return self._estimates

    async def _compute(self, now: float) -> None:
        try:
            queued, runtimes, run = self._inputs(now)
            estimates = await asyncio.to_thread(run)
            self._queued, self._runtimes, self._estimates, self._at = queued, runtimes, estimates, now
            self._first = {k: v for k, v in self._first.items() if k in queued}  # started: forgotten
        finally:
            self._flight = None

    def _inputs(self, now: float) -> tuple[set[str], Runtimes, Callable[[], dict[str, Estimate]]]:
        """On the loop, what the forecast reads of the hub's changing state: the job rows,
        the scheduler's inputs, a copy of the view and of the placement policy."""
        t = self.training
        assert t is not None
        rows = t.jobs()
        queued = {r.id for r in rows if r.state == JobState.QUEUED}
        pending, running, stopping = t.scheduler_inputs(rows)
        runtimes = Runtimes.of(run_history(rows))
        requeued = [r.id for r in rows if r.state == JobState.PREEMPTING and not r.intent]
        reserve = t.cfg.reserve_after_s if t.cfg.reserve_after_s >= 0 else None
        run = functools.partial(
            self.compute,
            t.train_view(),  # a copy already
            dict(t.projects),
            pending,
            running,
            now,
            detached(t.policy),
            runtimes,
            stopping=stopping,
            requeued=requeued,
            departments=dict(t.departments),
            pools=dict(t.pools),
            reserve_after_s=reserve,
            grace_s=t.cfg.grace_s,
            # the last hour's submissions expected again (#41: a project in a burst keeps
            # submitting); runs that already finished are not among them, so this undercounts
            arrivals=expected_arrivals([*pending, *running, *stopping], now),
        )
        return queued, runtimes, run

    async def for_job(self, row: TrainJob, now: float | None = None) -> JobEstimate | None:
        """{"start", "in_s", "after", "basis"} for a queued job; None when not queued or unknown."""
        if row.state != JobState.QUEUED or not self.available:
            return None
        now = self.clock() if now is None else now
        est = (await self.refresh(now, need=row.id)).get(row.id)  # submitted since: computed anew
        if est is None:
            return None  # held by a budget, or not schedulable here: its wait reason says why
        runs = self._runtimes.by_project.get(row.project, ())
        basis = (
            f"expected ends of the running jobs; run times from {len(runs)} finished job(s) of {row.project}"
            if runs
            else "expected ends of the running jobs; no finished job of this project yet (1 h each)"
        )
        if est.start is None:
            return {
                "start": None,
                "in_s": None,
                "after": "",
                "basis": basis,
                "text": "no start in sight within a week at the present load",
            }
        in_s = max(0.0, est.start - now)
        error_s = stated_error(in_s)
        text = eta_text(est.start, in_s, est.after, est.unknown)
        first = self._first.setdefault(row.id, (est.start, error_s))
        if not est.unknown and abs(est.start - first[0]) > first[1]:  # it moved more than it said it might
            later = "later" if est.start > first[0] else "earlier"
            text += (
                f"; {abs(est.start - first[0]) / 60:.0f} min {later} than first estimated"
                f" ({clock_text(first[0])}, give or take {first[1] / 60:.0f} min)"
            )
        return {
            "start": None if est.unknown else est.start,
            "in_s": None if est.unknown else in_s,
            "error_s": None if est.unknown else error_s,
            "after": est.after,
            "basis": basis,
            "text": text,
        }


def eta_text(start: float, in_s: float, after: str = "", unknown: str = "") -> str:
    """'starts around 14:20 (in 35 min), once job ab12 of vision is expected to end'; 'after job
    ab12 of vision ends (...)' where that end is a guess; never "now" for a job that waits for
    a run to end."""
    if unknown:
        return f"after {unknown} ends (no past run of this project lasted this long)"
    minutes = int(in_s // 60)
    waits = bool(after) and after != "now"
    soon = "any minute" if waits else "now"
    when = soon if minutes < 1 else (f"in {minutes} min" if minutes < 120 else f"in {minutes / 60:.1f} h")
    clock = time.strftime("%H:%M" if in_s < 86400 else "%a %H:%M", time.localtime(start))
    why = f", once {after}" if after and after != "now" else ""
    return f"starts around {clock} ({when}){why}"


def stated_error(in_s: float) -> float:
    """How far an estimate may move before it says so: a quarter of the wait, at least 5 min
    (run times vary that much; jobs not yet submitted are only expected from the last hour)."""
    return max(300.0, in_s / 4)


def clock_text(epoch: float) -> str:
    return time.strftime("%H:%M", time.localtime(epoch))
