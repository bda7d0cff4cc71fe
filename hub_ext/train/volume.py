"""Limits on how much one user (or project) may submit: counts, rate and code size. Pure: each
check returns the refusal's message naming the limit (the option an admin changes), or "".
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from gpupool.vocab.states import UNFINISHED, JobState


def recent_submissions(store: Any, now: float, window_s: float = 60) -> dict[str, list[float]]:
    """When each user submitted the jobs of the last `window_s` seconds (wall clock), from the
    jobs table: what a restarted hub's rate limit starts from."""
    from sqlalchemy import select

    from gpupool.store import TrainJob

    with store.session() as s:
        rows = s.execute(
            select(TrainJob.owner, TrainJob.submitted).where(TrainJob.submitted > now - window_s).distinct()
        ).all()
    out: dict[str, list[float]] = {}
    for owner, at in rows:
        out.setdefault(owner, []).append(at)
    return out


class SubmitRate:
    """Submissions per user in any 60 seconds (a sliding window of their times)."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self.times: dict[str, deque[float]] = {}

    def seed(self, submitted: dict[str, list[float]], wall_now: float, now: float) -> None:
        """Count the submissions a restarted hub finds in its database (`recent_submissions`; wall
        clock times) in this window (monotonic `now`): a restart does not reset the limit. Only
        submissions that made a job are found (one refused for its shape was never stored)."""
        for user, times in submitted.items():
            seen = sorted(now - (wall_now - t) for t in times if wall_now - t < 60)[-self.per_minute :]
            self.times[user] = deque(sorted([*seen, *self.times.get(user, ())]))

    def refuse(self, user: str, now: float) -> str:
        """ "" and counts this submission, or why it is refused (and does not count it)."""
        times = self.times.setdefault(user, deque())
        while times and times[0] <= now - 60:
            times.popleft()
        if len(times) >= self.per_minute:
            wait = 60 - (now - times[0])
            return (
                f"you submitted {len(times)} jobs in the last minute, at most {self.per_minute}"
                f" (c.TrainPool.max_submissions_per_minute): try again in {wait:.0f} s"
            )
        times.append(now)
        if len(self.times) > 10_000:  # forget users idle for a minute: the table stays small
            self.times = {u: t for u, t in self.times.items() if t and t[-1] > now - 60}
        return ""


def count_refusal(jobs: Iterable[Any], user: str, project: str, adding: int, cfg: Any) -> str:
    """Jobs queued / queued and running per user and per project, with `adding` more."""
    queued = active = in_project = 0
    for j in jobs:
        if j.state not in UNFINISHED:
            continue
        if j.owner == user:
            active += 1
            queued += j.state == JobState.QUEUED
        in_project += j.project == project
    if adding > 1 and queued + adding > cfg.max_queued_per_user:  # a sweep: say what to change in it
        room = max(0, cfg.max_queued_per_user - queued)
        return (
            f"this sweep has {adding} runs and you have {queued} jobs waiting; one user may have at most"
            f" {cfg.max_queued_per_user} waiting (c.TrainPool.max_queued_per_user): submit at most"
            f" {room} runs now (fewer values), or cancel waiting jobs first"
        )
    if queued + adding > cfg.max_queued_per_user:
        return (
            f"you have {queued} jobs waiting, at most {cfg.max_queued_per_user}"
            " (c.TrainPool.max_queued_per_user): cancel one or wait"
        )
    if active + adding > cfg.max_active_per_user:
        return (
            f"you have {active} jobs queued or running, at most {cfg.max_active_per_user}"
            " (c.TrainPool.max_active_per_user): wait for some to end or cancel some"
        )
    if in_project + adding > cfg.max_active_per_project:
        return (
            f"project {project} has {in_project} jobs queued or running, at most {cfg.max_active_per_project}"
            " (c.TrainPool.max_active_per_project): wait for some to end"
        )
    return ""


def code_refusal(kind: str, value: object, max_bytes: int, max_cells: int) -> str:
    """A script, code or notebook over its size or cell count, judged on the parsed request before
    any notebook is built (the cheap measures: string lengths and list lengths)."""
    limit = f"{max_bytes // 1024} KiB (c.TrainPool.max_code_kib)"
    if kind in ("script", "code") and isinstance(value, str):
        if len(value.encode("utf-8", "surrogatepass")) > max_bytes:
            return f"{kind}: over {limit}"
        return ""
    if kind == "code" and isinstance(value, list):
        cells = value
    elif kind == "notebook" and isinstance(value, dict) and isinstance(value.get("cells"), list):
        cells = value["cells"]
    else:  # a notebook without a list of cells: the notebook check says what is wrong with it
        return ""
    if len(cells) > max_cells:
        return f"{kind}: {len(cells)} cells, at most {max_cells} (c.TrainPool.max_cells)"
    size = 0
    for cell in cells:
        source = cell if isinstance(cell, str) else cell.get("source", "") if isinstance(cell, dict) else ""
        parts = source if isinstance(source, list) else [source]
        size += sum(len(p) for p in parts if isinstance(p, str))
        if size > max_bytes:
            return f"{kind}: over {limit}"
    return ""
