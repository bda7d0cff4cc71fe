"""The words each screen uses for why a session ends: one table, so a reason added to the
policy is worded everywhere it shows, and the status bar, the culler's messages and the home
page never describe the same limit differently.

Each reason is said three ways, by when the user reads it:
- `upcoming`: before it acts, in the status bar's "stops at 18:00 …" (widgets/summary.py)
- `present`: the culler's warning and its own stop message (idle_culler/policy.py)
- `stopped`: after the stop, on the home page and the "Server not running" page (api/warnings.py)
A form left empty is not shown on that screen (a memory stop is never announced ahead in the
status bar's time line: the memory warning has its own message).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.vocab.culling import CullReason


@dataclass(frozen=True)
class ReasonWords:
    upcoming: str = ""
    present: str = ""
    stopped: str = ""


WORDS: dict[CullReason, ReasonWords] = {
    CullReason.IDLE_GPU: ReasonWords(
        upcoming="if its GPU stays idle",
        present="its GPU has been idle",
        stopped="its GPU had been idle while nobody used it",
    ),
    CullReason.IDLE_GPU_LONG: ReasonWords(
        upcoming="if its GPU stays idle, even while you type",
        present="its GPU has been idle for hours",
        stopped="its GPU had been idle for hours",
    ),
    CullReason.IDLE_JUPYTER: ReasonWords(
        upcoming="if nobody uses it",
        present="nobody has used it",
        stopped="nobody had used it",
    ),
    CullReason.PARKED_IDLE: ReasonWords(
        present="nobody has used it since its GPU was parked",
        stopped="nobody had used it since its GPU was parked",
    ),
    CullReason.MAX_AGE: ReasonWords(
        upcoming="at the end of the longest session allowed",
        present="it reached the maximum session length",
        stopped="it reached the longest session allowed",
    ),
    CullReason.WORKDAY_END: ReasonWords(
        upcoming="at the end of the workday",
        present="the workday ends",
        stopped="end of the workday",
    ),
    CullReason.MEMORY: ReasonWords(
        upcoming="because it uses more GPU memory than its share",
        stopped="it used more GPU memory than its share",
    ),
    CullReason.BUDGET: ReasonWords(stopped="the GPU-hour budget was used up and its GPU was idle"),
}


def _form(name: str) -> dict[CullReason, str]:
    return {reason: getattr(words, name) for reason, words in WORDS.items() if getattr(words, name)}


UPCOMING = _form("upcoming")
PRESENT = _form("present")
STOPPED = _form("stopped")
