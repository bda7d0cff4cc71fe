"""Hibernate and wake a real kernel: time and size on disk, for 10 MiB and 1 GiB of numpy/pandas state.

    python -m benchmarks.hibernate [--sizes 10M,1G] [--repeat 5] [--torch] [--json out.json]

Each run, end to end through the code a workspace runs (gpupool.gpu.hibernate):
  1. a real IPython kernel (jupyter_client) builds the state: half a numpy float64 array, half a
     pandas DataFrame of four float64 columns (all numpy without pandas; --torch adds a CPU tensor);
  2. *hibernate*: the workspace server's call (gpupool.widgets.labserver.hibernate_kernel) saves
     it into a fresh HOME; timed from the request to the kernel's answer;
  3. the kernel is stopped; a new one is started, as the next start of the notebook does;
  4. *wake*: from the new kernel's start until its first cell (a print) has run — kernel start +
     the restore before the first cell: what the user waits for once the server is up (the
     server's own start is the same with or without hibernation).
A second, untimed cell prints a checksum of the restored state: it equals the one computed
before hibernating, or the run fails.

The state folder lives on this machine's disk and is read back from the page cache when memory
allows (no cache drop: other people share the machine); a cold read adds size / disk bandwidth.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

BUILD = """
import numpy as np, hashlib
n = {n}
try:
    import pandas as pd
except ImportError:
    pd = None
half = max(n // 2 // 8, 1)
arr = np.arange(half, dtype=np.float64) * 1.5
if pd is not None:
    cols = max(half // 4, 1)
    df = pd.DataFrame({{c: np.arange(cols, dtype=np.float64) + i for i, c in enumerate("abcd")}})
else:
    df = np.arange(half, dtype=np.float64)
{torch}
def digest_of_state():
    h = hashlib.sha256(arr.data)
    h.update((df.to_numpy() if pd is not None else df).tobytes())
    {torchdigest_of_state}
    return h.hexdigest()[:16]
print("digest", digest_of_state())
"""
TORCH = "import torch\nt = torch.arange(1 << 20, dtype=torch.float32)"
TORCH_DIGEST = "h.update(t.numpy().tobytes())"


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def human(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MiB"


async def _run(km, code: str, timeout: float = 600) -> str:
    client = km.client()
    client.start_channels()
    out: list[str] = []

    def hook(msg: dict) -> None:
        if msg["msg_type"] == "stream":
            out.append(msg["content"].get("text", ""))
        elif msg["msg_type"] == "error":
            out.append("ERROR " + msg["content"].get("evalue", ""))

    try:
        await client.execute_interactive(code, timeout=timeout, output_hook=hook)
    finally:
        client.stop_channels()
    return "".join(out)


async def one_run(size: int, home: Path, use_torch: bool) -> dict:
    from jupyter_client.manager import AsyncKernelManager

    import gpupool.gpu
    from gpupool.widgets.labserver import HIBERNATE_EXPR, hibernate_kernel

    env = {
        **os.environ,
        "HOME": str(home),
        "JPY_SESSION_NAME": "bench.ipynb",
        "JUPYTERHUB_USER": "bench",
        "GPUPOOL_HUB": "bench",
        "GPUPOOL_INSTANCE": "bench",
        "PYTHONPATH": str(Path(gpupool.gpu.__file__).parent / "startup"),
    }
    code = BUILD.format(
        n=size, torch=TORCH if use_torch else "", torchdigest_of_state=TORCH_DIGEST if use_torch else "pass"
    )
    km = AsyncKernelManager(kernel_name="python3")
    await km.start_kernel(env=env)
    try:
        out = await _run(km, code)
        digest = out.split("digest ")[-1].split()[0]
        t0 = time.perf_counter()
        saved = await hibernate_kernel(km, HIBERNATE_EXPR.format(cap=0, quota=0, keep=0), 600)
        hibernate_s = time.perf_counter() - t0
    finally:
        await km.shutdown_kernel(now=True)
    if not saved.get("ok"):
        raise RuntimeError(f"hibernate failed: {saved}")
    km = AsyncKernelManager(kernel_name="python3")
    t0 = time.perf_counter()
    await km.start_kernel(env=env)
    try:
        out = await _run(km, "print('first cell')")  # the restore runs before it
        wake_s = time.perf_counter() - t0
        out += await _run(km, "print('digest', digest_of_state())")  # untimed: the check
    finally:
        await km.shutdown_kernel(now=True)
    woke = out.split("digest ")[-1].split()[0] if "digest " in out else ""
    if woke != digest or "gpupool: restored" not in out:
        raise RuntimeError(f"the woken kernel differs: {out[:400]!r}")
    restore_s = float(out.split("GiB, " if "GiB, " in out else "MiB, ")[-1].split(" s)")[0])
    return {
        "bytes": saved["bytes"],
        "hibernate_s": hibernate_s,
        "save_in_kernel_s": saved["seconds"],
        "wake_s": wake_s,
        "restore_s": restore_s,
    }


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.hibernate", description=__doc__)
    ap.add_argument("--sizes", default="10M,1G", help="state sizes, e.g. 10M,1G,4G (default 10M,1G)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--torch", action="store_true", help="add a CPU tensor (torch must be importable)")
    ap.add_argument("--json", default="", help="write the runs here too")
    args = ap.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    if not 1 <= args.repeat <= 100 or not all(0 < s <= 64 << 30 for s in sizes):
        ap.error("--repeat 1..100 and sizes up to 64G")
    print("| state | on disk | hibernate p50 / p95 | wake p50 / p95 | of which restore p50 | runs |")
    print("|---|---|---|---|---|---|")
    results = {}
    for size in sizes:
        runs = []
        for i in range(args.repeat):
            print(f"[{human(size)}] run {i + 1}/{args.repeat}", file=sys.stderr, flush=True)
            with tempfile.TemporaryDirectory(prefix="gpupool-hibernate-bench-") as home:
                runs.append(asyncio.run(one_run(size, Path(home), args.torch)))
        results[size] = runs
        hib = [r["hibernate_s"] for r in runs]
        wake = [r["wake_s"] for r in runs]
        print(
            f"| {human(size)} | {human(runs[0]['bytes'])} | {statistics.median(hib):.2f} / {p95(hib):.2f} s |"
            f" {statistics.median(wake):.2f} / {p95(wake):.2f} s |"
            f" {statistics.median(r['restore_s'] for r in runs):.2f} s | {len(runs)} |",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps({str(k): v for k, v in results.items()}, indent=1))
    gib = [r for s, rs in results.items() if s == 1 << 30 for r in rs]
    if gib:
        wake = p95([r["wake_s"] for r in gib])
        print(
            f"\nwake of a 1 GiB kernel: p95 {wake:.2f} s (target <= 10 s: {'met' if wake <= 10 else 'NOT met'})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
