"""A small trace in the openb CSV format, made by gpupool (not taken from any cluster), so the
documented `gpupool simulate` commands run from a clone:

    python -m gpupool.sim.sample docs/sample-trace     # writes nodes.csv and pods.csv (seeded)

24 nodes (8-GPU V100 and 4-GPU T4 servers, two CPU-only), 90 pods: a third GPU fractions
(0.1 to 0.5), a third one whole GPU, the rest 2-8 GPUs or CPU only, arriving over 4 hours.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

NODES = (
    [("v100", 96_000, 786_432, 8, "V100M32")] * 12
    + [("t4", 64_000, 262_144, 4, "T4")] * 10
    + [("cpu", 96_000, 393_216, 0, "")] * 2
)
PODS = 90
WINDOW_S = 4 * 3600


def write(folder: Path, seed: int = 1) -> None:
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["sn,cpu_milli,memory_mib,gpu,model"]
    lines += [
        f"{kind}-{i:02d},{cpu},{mem},{gpus},{model}" for i, (kind, cpu, mem, gpus, model) in enumerate(NODES)
    ]
    (folder / "nodes.csv").write_text("\n".join(lines) + "\n")
    pods = [
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
        "scheduled_time"
    ]
    for i in range(PODS):
        shape = rng.random()
        if shape < 0.35:
            num, milli = 1, rng.choice([100, 200, 250, 300, 500])
        elif shape < 0.7:
            num, milli = 1, 1000
        elif shape < 0.9:
            num, milli = rng.choice([2, 4, 8]), 1000
        else:
            num, milli = 0, 0
        cpu = rng.choice([2000, 4000, 8000, 16000]) * max(1, num)
        created = rng.randrange(WINDOW_S)
        deleted = created + int(rng.expovariate(1 / 10_800)) + 60
        spec = "V100M32" if num >= 8 else ""
        pods.append(
            f"pod-{i:04d},{cpu},{cpu * 2},{num},{milli},{spec},LS,Running,{created},{deleted},{created}"
        )
    (folder / "pods.csv").write_text("\n".join(pods) + "\n")


if __name__ == "__main__":
    write(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/sample-trace"))
