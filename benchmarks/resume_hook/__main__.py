"""What the resume hook costs every cell: its status check against a real hub's gpupool API,
next to running the cell itself in IPython without the hook (the baseline), same run.

    python -m benchmarks.resume_hook [--cells 300]

A real hub (gpupool's embedded config, one virtual GPU) runs on 127.0.0.1 with one workspace;
an IPython shell in this process runs `x = 1` cells with and without the hook, alternating.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gpupool.gpu.env import STARTUP_DIR
from tests.hubtools import Hub

sys.path.insert(0, STARTUP_DIR)
from gpupool_resume import HubCalls, ResumeHook  # noqa: E402 - lives in the workspace start-up folder


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.resume_hook", description=__doc__)
    ap.add_argument("--cells", type=int, default=300)
    args = ap.parse_args(argv)
    from IPython.core.interactiveshell import InteractiveShell

    with tempfile.TemporaryDirectory() as tmp:
        hub = Hub(
            state=Path(tmp) / "hub", extra_config="c.GPUPool.virtual_gpus = 1\n", env={"GPUPOOL_CULLER": "0"}
        )
        try:
            hub.start()
            hub.spawn("bench", "1")
            token = hub.user_token("bench")
            api = f"http://127.0.0.1:{hub.api_port}/services/gpupool/"
            hooks = {  # a cell after a pause checks; cells in quick succession share one check
                "with the hook, a cell after a pause (one status GET)": ResumeHook(
                    HubCalls(api, token, timeout=2.0), "", recheck_s=0, watch_s=3600
                ),
                "with the hook, cells in quick succession": ResumeHook(
                    HubCalls(api, token, timeout=2.0), "", watch_s=3600
                ),
            }
            assert all(h() == "running" for h in hooks.values()), "the hub did not answer the hook"
            shell = InteractiveShell.instance()
            times: dict[str, list[float]] = {"without the hook (baseline)": [], **{k: [] for k in hooks}}
            for i in range(args.cells * len(times)):
                label = list(times)[i % len(times)]
                hook = hooks.get(label)
                if hook is not None:
                    shell.events.register("pre_run_cell", hook)
                t0 = time.perf_counter()
                shell.run_cell("x = 1", store_history=False)
                times[label].append(time.perf_counter() - t0)
                if hook is not None:
                    shell.events.unregister("pre_run_cell", hook)
            probe = []
            for _ in range(args.cells // 3):  # what any gpupool API call costs here (auth included)
                t0 = time.perf_counter()
                HubCalls(api, token)("GET", "api/me")
                probe.append(time.perf_counter() - t0)
        finally:
            hub.stop()
    print(
        f"{args.cells} cells each, alternating; a real hub on 127.0.0.1; 2-core machine shared with other work\n"
    )
    print("| cell `x = 1` | p50 (ms) | p99 (ms) |")
    print("|---|---|---|")
    for label, values in times.items():
        values.sort()
        print(
            f"| {label} | {statistics.median(values) * 1000:.2f} | {values[int(0.99 * len(values))] * 1000:.2f} |"
        )
    print(
        f"\nfor comparison, GET api/me (any gpupool API call, authentication included): p50"
        f" {statistics.median(probe) * 1000:.1f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
