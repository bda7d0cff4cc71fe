"""python -m gpupool.idle_culler.node_agent --token-file /etc/gpupool-agent/token [--port 9402] [--interval 10]
[--virtual-gpus N]"""

from __future__ import annotations

import argparse
import logging
import os
import threading
from pathlib import Path

from gpupool.gpu.nvml import NVML, NVMLUnavailable, VirtualGPUs
from gpupool.idle_culler.node_agent.server import Agent, file_token, serve

log = logging.getLogger("gpupool.node_agent")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m gpupool.idle_culler.node_agent",
        description="Per-pod GPU use from NVML, served at /pods and /metrics.",
    )
    ap.add_argument("--port", type=int, default=9402, help="9402: beside dcgm-exporter's 9400")
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--interval", type=float, default=10.0, help="seconds between NVML samples")
    ap.add_argument(
        "--proc",
        default=os.environ.get("GPUPOOL_PROC_ROOT", "/proc"),
        help="the host's /proc (the DaemonSet runs with hostPID)",
    )
    ap.add_argument(
        "--token-file",
        default=os.environ.get("GPUPOOL_NODE_AGENT_TOKEN_FILE", ""),
        help="file holding the token /pods and /metrics require (the chart's Secret)",
    )
    ap.add_argument(
        "--no-token",
        action="store_true",
        help="serve /pods and /metrics to anyone who can reach the port (not on a shared cluster)",
    )
    ap.add_argument(
        "--virtual-gpus",
        type=int,
        default=0,
        metavar="N",
        help="a node without a GPU driver whose N GPUs are virtual (a demo or test cluster): "
        "no NVML, every pod on the node reported GPU-idle",
    )
    args = ap.parse_args(argv)
    if not args.token_file and not args.no_token:
        ap.error("--token-file is required (or --no-token to serve without one)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not 0 <= args.virtual_gpus <= 64:
        ap.error("--virtual-gpus must be between 0 and 64")
    nvml = VirtualGPUs(args.virtual_gpus) if args.virtual_gpus else NVML()
    agent = Agent(nvml, Path(args.proc))
    stop = threading.Event()
    threading.Thread(target=_sample, args=(agent, nvml, args.interval, stop), daemon=True).start()
    token = (lambda: None) if args.no_token else file_token(Path(args.token_file))
    try:
        serve(agent, args.port, args.host, token).serve_forever()
    finally:
        stop.set()
        nvml.close()
    return 0


def _sample(agent: Agent, nvml: NVML | VirtualGPUs, interval_s: float, stop: threading.Event) -> None:
    """Open NVML (again each interval until it opens: the driver may come up after the agent,
    and the agent says meanwhile why it has no data), then sample."""
    while not stop.is_set():
        try:
            nvml.open()
            break
        except NVMLUnavailable as err:
            log.error("%s; trying again in %.0f s", err, interval_s)
            agent.fail(f"NVML: {err}")
            stop.wait(interval_s)
    agent.sample_forever(interval_s, stop)


if __name__ == "__main__":
    raise SystemExit(main())
