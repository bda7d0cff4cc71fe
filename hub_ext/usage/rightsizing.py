"""Right-sizing advice: pure. A user whose last N workspace sessions each peaked at no more
than half their share's GPU memory is offered the smallest allowed size that still holds that
peak with headroom; the admin page adds up what that would have freed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpupool.pool.units import format_gpus
from gpupool.usage.accounting import Held, Session
from gpupool.vocab.kinds import WorkloadKind

HEADROOM_PCT = 125  # the suggested size holds the peak plus a quarter


@dataclass(frozen=True)
class Advice:
    owner: str
    current_milli: int
    suggested_milli: int
    peak_memory_mib: int  # the highest peak of the sessions looked at
    share_memory_mib: int
    sessions: int

    def message(self) -> str:
        return (
            f"your last {self.sessions} sessions on {format_gpus(self.current_milli)} used at most"
            f" {self.peak_memory_mib:,} MiB of its {self.share_memory_mib:,} MiB:"
            f" {format_gpus(self.suggested_milli)} would do, and leaves GPUs for others"
        )


def advise(sessions: Sequence[Session], owner: str, sizes_milli: Sequence[int], n: int) -> Advice | None:
    """Advice from `owner`'s last `n` finished sessions, all of one size, each with a peak at
    or under half its share's memory; None without n such sessions or a smaller allowed size."""
    mine = sorted((s for s in sessions if s.owner == owner and s.end is not None), key=lambda s: s.start)[-n:]
    if n <= 0 or len(mine) < n:
        return None
    size = mine[-1].milli
    if any(s.milli != size or s.peak_memory_mib * 2 > s.share_memory_mib for s in mine):
        return None
    peak = max(s.peak_memory_mib for s in mine)
    share_mib = mine[-1].share_memory_mib
    per_milli = share_mib / size  # MiB a milli-GPU of this size gives
    fitting = [m for m in sizes_milli if m < size and m * per_milli * 100 >= peak * HEADROOM_PCT]
    if not fitting:
        return None
    return Advice(owner, size, min(fitting), peak, share_mib, len(mine))


def freed(advice: Advice, held: Sequence[Held], a: int, b: int, now: int) -> int:
    """Milli-GPU x seconds the suggested size would have freed over [a, b): the difference on
    every build session of the advised size."""
    saved = advice.current_milli - advice.suggested_milli
    return sum(
        saved * h.seconds_in(a, b, now)
        for h in held
        if h.kind == WorkloadKind.BUILD and h.owner == advice.owner and h.milli == advice.current_milli
    )
