"""The notebook sessions alone (benchmarks.culling's 2,000 Adobe sessions, no other load, so
a GPU is always free to come back to): how much of the GPU time held is used when idle
GPUs are parked instead of stopped, and how long a cell waits for its GPU."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from benchmarks.cluster.replay import POLL_S, restore_s
from benchmarks.culling.sessions import Session
from gpupool.gpu.parking import Delays
from gpupool.idle_culler.policy import IdleTracker, Limits, Workspace, decide

STEP = 60.0
EPOCH = 1_780_272_000.0


@dataclass
class Alone:
    reserved_s: float = 0.0
    used_s: float = 0.0
    parks: int = 0
    culls: int = 0
    lost_states: int = 0
    resume_waits: list[float] = field(default_factory=list)

    @property
    def used_pct(self) -> float:
        return 100 * self.used_s / self.reserved_s


def replay_alone(
    sessions: list[Session], limits: Limits, delays: Delays | None = None, seed: int = 1
) -> Alone:
    delays = delays or Delays()
    out = Alone()
    jitter = random.Random(seed)
    for s in sessions:
        base = EPOCH + s.start_tod
        tracker = IdleTracker(limits.window_s, limits.util_threshold_pct)
        held, culled, started, last = True, False, 0.0, 0.0
        cells, k, t = list(s.cells), 0, 0.0
        while t < s.lifetime_s:
            while k < len(cells) and cells[k][1] <= t:
                k += 1
            busy = k < len(cells) and cells[k][0] <= t
            came_back = any(t - STEP < a <= t for a, _ in cells[k : k + 2])
            if not held:
                if came_back:
                    held = True
                    if culled:  # a new session, with an empty kernel (as benchmarks.culling replays it)
                        started, last, culled = t, t, False
                    else:  # the hook's claim: nothing else competes for the GPU
                        out.resume_waits.append(
                            restore_s(min(s.gpus * 1000, 1000), delays) + jitter.uniform(0, POLL_S)
                        )
                    tracker = IdleTracker(limits.window_s, limits.util_threshold_pct)
                else:
                    t += STEP
                    continue
            if s.user_present(t):
                last = t
            tracker.add(t, 100.0 if busy else 0.0)
            d = decide(Workspace("u", "", base + started, base + last, tracker.idle_s), base + t, limits)
            if d.action == "park":
                held = False
                out.parks += 1
            elif d.action == "cull":
                out.culls += 1
                out.lost_states += any(a > t for a, _ in cells)
                held, culled = False, True
            else:
                out.reserved_s += STEP * s.gpus
                if busy:
                    out.used_s += STEP * s.gpus
            t += STEP
    return out
