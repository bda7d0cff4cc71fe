"""The culling replay's world "culling with hibernation": every cull saves the kernels first
(gpupool.gpu.hibernate), so a user who comes back gets their variables after a wake instead
of an empty kernel. The GPU time held is the same as culling's with the same rules (a hibernated
session holds nothing; the wake's seconds are left out: 7,455 wakes of 10 s are 21 GPU-h of
~60,000); what changes is which culls lose a kernel state: only those whose state is over the
session's cap (c.IdleCuller.hibernate_max_gib)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from benchmarks.cluster.notebooks import replay_alone
from benchmarks.culling.sessions import Session
from benchmarks.hibernate.measured import STATE_GIB, WAKE_S
from gpupool.idle_culler.policy import Limits


@dataclass
class World:
    label: str
    used_pct: float
    culls: int
    came_back: int  # culls the user came back from: lost kernel states without hibernation
    lost: int  # ... and with it: states over the cap


def hibernation_world(sessions: list[Session], label: str, limits: Limits) -> World:
    limits = replace(limits, hibernate=True, park_after_s=0.0)
    run = replay_alone(sessions, limits)
    over_cap = limits.hibernate_max_gib < STATE_GIB  # the model: every session holds STATE_GIB
    return World(label, run.used_pct, run.culls, run.lost_states, run.lost_states if over_cap else 0)


def wake_p95_1gib() -> float:
    return WAKE_S[1 << 30][1]
