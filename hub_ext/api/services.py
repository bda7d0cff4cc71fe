"""What the gpupool API's handlers, the admin pages and the home page's hooks work with: the running
services and the state they share between requests, in one typed object the wiring builds once
(gpupool.wiring.setup) and hands to the API app (`settings[gpupool.api.auth.SERVICES_KEY]`) and the
admin pages.

A handler reaches it through `BaseHandler.services` (gpupool.api.auth): no string look-ups of
services in tornado's settings, and no state created on first use by whichever request comes first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpupool.api.page import History
from gpupool.vocab.culling import CullerState, new_culler_state

if TYPE_CHECKING:
    from gpupool.alloc.manager import PoolManager
    from gpupool.api.auth import Directory
    from gpupool.api.culler import SessionEnd
    from gpupool.parking.service import ParkingService
    from gpupool.train.backend import TrainingBackend
    from gpupool.train.estimates import Estimates
    from gpupool.train.kai_estimates import KaiEstimates
    from gpupool.train.volume import SubmitRate
    from gpupool.usage.service import UsageService


@dataclass
class ApiServices:
    """The running parts the API serves (None: that part is off on this hub), its settings, and
    the state its handlers share."""

    pool: PoolManager
    directory: Directory
    training: TrainingBackend | None = None
    parking: ParkingService | None = None
    usage: UsageService | None = None
    session_end: SessionEnd | None = None  # the culler's time rules, where the culler runs
    hibernate_keep_days: float = 0.0  # c.IdleCuller.hibernate_keep_days where the culler runs
    # (groups, profile) -> whether c.IdleCuller's rules hibernate such a workspace; None: off for all
    hibernates: Callable[[Sequence[str], str], bool] | None = None
    demo_gpu_use: bool = False  # `gpupool up --demo-culling`: users say what their GPU does
    # shared between requests, made here once
    culler: CullerState = field(default_factory=new_culler_state)
    history: History = field(default_factory=History)
    # the training pool's start-time estimates (on Kubernetes, of KAI-Scheduler's order)
    estimates: Estimates | KaiEstimates | None = None
    # submissions per user in the last minute; seeded from the database at the first submission
    # (an async read, which the constructor cannot do)
    submit_rate: SubmitRate | None = None

    def __post_init__(self) -> None:
        if self.training is not None and self.estimates is None:
            from gpupool.train.kai_estimates import start_estimates

            self.estimates = start_estimates(self.training)
