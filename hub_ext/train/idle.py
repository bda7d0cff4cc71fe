"""Idle train jobs: a job whose GPUs stay idle past its project's threshold (a hung data
loader, a finished loop that never exits) is warned in its log, then stopped. Pure: the
samples and `now` come in, verdicts go out; the training service carries them out."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpupool.vocab.culling import IDLE_UTIL_PCT, gpu_idle


@dataclass(frozen=True)
class IdleRule:
    idle_s: float  # stop after this long idle (0: never)
    warn_s: float = 300.0  # warn this long before the stop
    util_pct: float = IDLE_UTIL_PCT  # below: idle, as for workspaces (gpu_idle)


@dataclass
class IdleClock:
    """Since when each run (job id, run number) has been idle, and whom it has warned."""

    since: dict[tuple[str, int], float] = field(default_factory=dict)
    warned: set[tuple[str, int]] = field(default_factory=set)

    def step(
        self, runs: dict[tuple[str, int], IdleRule], util: dict[str, float | None], now: float
    ) -> list[tuple[str, str, float]]:
        """`runs`: the running runs with their project's rule; `util`: GPU utilization of each
        job id (None or missing: no data, which never counts as idle). Returns (job id,
        "warn" | "stop", seconds idle)."""
        out = []
        for key in list(self.since):
            if key not in runs:  # ended, preempted or resumed as a new run: forget it
                self.since.pop(key)
                self.warned.discard(key)
        for key, rule in runs.items():
            job_id = key[0]
            pct = util.get(job_id)
            if rule.idle_s <= 0 or pct is None or not gpu_idle(pct, rule.util_pct):
                self.since.pop(key, None)
                self.warned.discard(key)
                continue
            idle = now - self.since.setdefault(key, now)
            if idle >= rule.idle_s:
                out.append((job_id, "stop", idle))
            elif idle >= rule.idle_s - rule.warn_s and key not in self.warned:
                self.warned.add(key)
                out.append((job_id, "warn", idle))
        return out
