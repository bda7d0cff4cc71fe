"""Checkpoints for train jobs: load on start, save on preemption (SIGTERM) — and resume.

    from gpupool.widgets.checkpoint import Checkpoint
    ckpt = Checkpoint()                    # files go to $GPUPOOL_CHECKPOINT_DIR
    state = ckpt.load(default={"step": 0})
    while state["step"] < 1000:
        train_one_step(state)
        state["step"] += 1
        if ckpt.preempted:                 # SIGTERM arrived: save and leave; the job resumes later
            ckpt.save(state)
            ckpt.exit()                    # exit code 75: "preempted, resume me"
    ckpt.save(state)

With PyTorch, keep tensors out of the JSON and save them beside it:
`torch.save(model.state_dict(), ckpt.path("model.pt"))` before `ckpt.save(...)`, and
`model.load_state_dict(torch.load(ckpt.path("model.pt")))` when `ckpt.load()` found a state.

Elastic jobs resume at another size: `int(os.environ["GPUPOOL_GPUS"])` is this run's number of
GPUs. Save what does not depend on it (unwrapped model weights, the optimizer state gathered
to one rank, the step, the samples seen) and derive the rest on start: world size, per-GPU
batch = global batch // GPUPOOL_GPUS, the sampler's position (docs/training.md).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from types import FrameType

from gpupool.vocab.exit_codes import PREEMPTED as PREEMPTED_EXIT_CODE


class Checkpoint:
    def __init__(
        self, name: str = "state.json", directory: str | None = None, handle_sigterm: bool = True
    ) -> None:
        self.dir = Path(directory or os.environ.get("GPUPOOL_CHECKPOINT_DIR") or ".")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.file = self.dir / name
        self.preempted = False
        if handle_sigterm:
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, _signum: int, _frame: FrameType | None) -> None:
        self.preempted = True  # finish the step at hand, then save: never a half-written state

    def path(self, name: str) -> Path:
        return self.dir / name

    def load(self, default: object = None) -> object:
        try:
            return json.loads(self.file.read_text())
        except FileNotFoundError:
            return default

    def save(self, state: object) -> None:
        tmp = self.file.with_suffix(self.file.suffix + ".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.file)  # atomic: a kill mid-save leaves the previous checkpoint

    def exit(self) -> None:
        """Leave after a preemption with PREEMPTED_EXIT_CODE: the job is resumed, not finished."""
        print("gpupool: preempted, checkpoint saved; the job resumes when GPUs are free", flush=True)
        sys.exit(PREEMPTED_EXIT_CODE)
