"""python -m gpupool.idle_culler.node_agent --port 9402 --interval 10 [--proc /proc]"""

from __future__ import annotations

import argparse
import logging
import os
import threading
from pathlib import Path

from gpupool.nvml import NVML

from .server import Agent, serve


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpupool.idle_culler.node_agent",
                                 description="Per-pod GPU use from NVML, served at /pods and /metrics.")
    ap.add_argument("--port", type=int, default=9402, help="9402: beside dcgm-exporter's 9400")
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--interval", type=float, default=10.0, help="seconds between NVML samples")
    ap.add_argument("--proc", default=os.environ.get("GPUPOOL_PROC_ROOT", "/proc"),
                    help="the host's /proc (the DaemonSet runs with hostPID)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    nvml = NVML()
    nvml.open()
    agent = Agent(nvml, Path(args.proc))
    stop = threading.Event()
    threading.Thread(target=agent.sample_forever, args=(args.interval, stop), daemon=True).start()
    try:
        serve(agent, args.port, args.host).serve_forever()
    finally:
        stop.set()
        nvml.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
