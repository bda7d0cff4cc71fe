"""A notebook's move, timed on a real GPU: park a process holding N GiB and restore it (same GPU).

What the mover does to an idle kernel (docs/culling.md, "Moves"), phase by phase, through the
hub's own backend (`gpupool.gpu.cuda_checkpoint`, driver r570+): lock -> checkpoint (GPU memory
to host memory, the GPU is free) -> restore -> unlock. A PyTorch child process holds the tensors;
after each cycle it compares them bit for bit (int32 views) with a host copy made before.
Then one more cycle with a "cell" started while the process is parked: it must block (not fail)
and run once restored, and we print how long it waited.

Runs from a plain checkout with torch and cuda-bindings only (no pip install, no JupyterHub):

    python benchmarks/gpu_move_cycle.py --sizes 1,10 --repeat 3 --json /tmp/move-cycle.json

It prints one JSON object: per size and repeat the seconds of each phase, the medians, s/GiB,
a fit `fixed_s + per_gib_s * GiB` for park and restore (the virtual backend's `Delays`), GPU
memory in use while parked (nvidia-smi, where present) and `identical` per cycle.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import queue
import shutil
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _import_gpupool() -> None:
    """`gpupool` is the folder hub_ext/ (pyproject's package-dir). Without an install, register
    that folder as the package: its __init__ imports nothing, and gpupool.gpu.parking and
    gpupool.gpu.cuda_checkpoint need only the stdlib and cuda-bindings."""
    try:
        import gpupool  # noqa: F401 - installed: use it

        return
    except ImportError:
        pass
    spec = importlib.util.spec_from_file_location(
        "gpupool", ROOT / "hub_ext" / "__init__.py", submodule_search_locations=[str(ROOT / "hub_ext")]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpupool"] = module
    spec.loader.exec_module(module)


# The kernel stand-in: holds N GiB of float32 on the GPU and a host copy of its bits; answers
# commands on stdin with one JSON line each.
HOLDER = textwrap.dedent("""
    import json, sys, time, torch
    gib = float(sys.argv[1])
    n = int(gib * 256 * 1024 * 1024)
    torch.manual_seed(27)
    x = torch.randn(n, device="cuda")
    torch.cuda.synchronize()
    saved = x.view(torch.int32).cpu()
    props = torch.cuda.get_device_properties(0)
    print(json.dumps({"ready": True, "gpu": props.name, "uuid": str(getattr(props, "uuid", "")),
                      "torch": torch.__version__, "cuda": torch.version.cuda}), flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "check":
            t0 = time.perf_counter()
            same = bool(torch.equal(x.view(torch.int32).cpu(), saved))
            print(json.dumps({"identical": same, "check_s": time.perf_counter() - t0}), flush=True)
        elif cmd == "cell":
            # a cell started while the process is parked: CUDA calls block until unlock
            print(json.dumps({"cell_started": True}), flush=True)
            t0 = time.perf_counter()
            y = float((x[: 1 << 20] * 2).sum())
            torch.cuda.synchronize()
            print(json.dumps({"cell_wait_s": time.perf_counter() - t0, "ok": y == y}), flush=True)
        elif cmd == "quit":
            break
""")


class Holder:
    def __init__(self, gib: float, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(gib)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.info = self.answer(timeout_s=max(timeout_s, 300))

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")

    def answer(self, timeout_s: float | None = None) -> dict:
        try:
            line = self.lines.get(timeout=timeout_s or self.timeout_s)
        except queue.Empty:
            raise RuntimeError(f"the holder did not answer within {timeout_s or self.timeout_s} s") from None
        if not line:
            raise RuntimeError(f"the holder exited (rc {self.proc.poll()})")
        return json.loads(line)

    def send(self, cmd: str) -> None:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        try:
            self.send("quit")
            self.proc.wait(timeout=30)
        except Exception:  # noqa: BLE001 - it is going anyway
            self.proc.kill()


def gpu_mem_used_mib() -> int | None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    out = subprocess.run(
        [smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    try:
        return int(out.stdout.split()[0])
    except (IndexError, ValueError):
        return None


def timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def cycle(backend, holder: Holder, lock_timeout_ms: int) -> dict:
    pid = holder.proc.pid
    assert backend.state(pid) == "running", backend.state(pid)
    used_before = gpu_mem_used_mib()
    run = {
        "lock_s": timed(backend.lock, pid, lock_timeout_ms),
        "checkpoint_s": timed(backend.checkpoint, pid),
    }
    run["state_parked"] = backend.state(pid)
    run["gpu_mem_used_mib"] = {"before": used_before, "parked": gpu_mem_used_mib()}
    run["restore_s"] = timed(backend.restore, pid, None)
    run["unlock_s"] = timed(backend.unlock, pid)
    run["state_after"] = backend.state(pid)
    run["gpu_mem_used_mib"]["after"] = gpu_mem_used_mib()
    holder.send("check")
    run.update(holder.answer())
    return run


def cell_during_park(backend, holder: Holder, parked_s: float, lock_timeout_ms: int) -> dict:
    """Park, start a cell, keep it parked `parked_s`, restore: the cell must wait, then run."""
    pid = holder.proc.pid
    backend.lock(pid, lock_timeout_ms)
    backend.checkpoint(pid)
    holder.send("cell")
    holder.answer()  # the cell has started (its CUDA call now blocks)
    time.sleep(parked_s)  # the parked time the cell must sit through (real time on purpose)
    restore_s = timed(backend.restore, pid, None)
    unlock_s = timed(backend.unlock, pid)
    out = holder.answer()
    out.update(
        {
            "parked_s": parked_s,
            "restore_s": restore_s,
            "unlock_s": unlock_s,
            "wait_beyond_restore_s": out["cell_wait_s"] - parked_s - restore_s - unlock_s,
        }
    )
    holder.send("check")
    out.update(holder.answer())
    return out


def fit(points: list[tuple[float, float]]) -> dict:
    """Least squares seconds = fixed_s + per_gib_s * GiB (one size: all of it per GiB)."""
    if len({g for g, _ in points}) < 2:
        g, s = points[0]
        return {"fixed_s": 0.0, "per_gib_s": round(s / g, 4)}
    mg = statistics.fmean(g for g, _ in points)
    ms = statistics.fmean(s for _, s in points)
    slope = sum((g - mg) * (s - ms) for g, s in points) / sum((g - mg) ** 2 for g, _ in points)
    return {"fixed_s": round(ms - slope * mg, 4), "per_gib_s": round(slope, 4)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", default="1,10", help="GiB held by the process, comma-separated (default 1,10)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="full cycles per size (default 3)")
    parser.add_argument(
        "--parked-s", type=float, default=1.0, help="how long the cell-during-park test stays parked"
    )
    parser.add_argument("--lock-timeout-ms", type=int, default=10_000)
    parser.add_argument("--timeout-s", type=float, default=120.0, help="the most one holder answer may take")
    parser.add_argument("--json", default="", help="also write the result here")
    args = parser.parse_args(argv)
    sizes = [float(s) for s in args.sizes.split(",") if s.strip()]

    _import_gpupool()
    from gpupool.gpu.cuda_checkpoint import CudaCheckpoint

    backend = CudaCheckpoint()
    version = int(backend._call("cuDriverGetVersion", backend.driver.cuDriverGetVersion))
    result: dict = {"driver_cuda": f"{version // 1000}.{version % 1000 // 10}", "sizes": {}, "errors": []}
    park_points: list[tuple[float, float]] = []
    restore_points: list[tuple[float, float]] = []
    for gib in sizes:
        holder = Holder(gib, args.timeout_s)
        result.update({k: holder.info[k] for k in ("gpu", "uuid", "torch", "cuda")})
        runs = []
        try:
            for _ in range(args.repeat):
                runs.append(cycle(backend, holder, args.lock_timeout_ms))
                park_points.append((gib, runs[-1]["lock_s"] + runs[-1]["checkpoint_s"]))
                restore_points.append((gib, runs[-1]["restore_s"] + runs[-1]["unlock_s"]))
            if gib == max(sizes):
                try:
                    result["cell_during_park"] = cell_during_park(
                        backend, holder, args.parked_s, args.lock_timeout_ms
                    )
                except Exception as err:  # noqa: BLE001 - report, keep the figures above
                    result["errors"].append(f"cell during park ({gib} GiB): {err}")
        except Exception as err:  # noqa: BLE001 - report what failed and what was measured
            result["errors"].append(f"{gib} GiB: {type(err).__name__}: {err}")
        finally:
            holder.close()
        phases = ("lock_s", "checkpoint_s", "restore_s", "unlock_s")
        median = {p: round(statistics.median(r[p] for r in runs), 4) for p in phases} if runs else {}
        result["sizes"][str(gib)] = {
            "runs": runs,
            "median": median,
            "park_s_per_gib": round((median["lock_s"] + median["checkpoint_s"]) / gib, 4) if runs else None,
            "restore_s_per_gib": round((median["restore_s"] + median["unlock_s"]) / gib, 4) if runs else None,
            "identical": bool(runs) and all(r.get("identical") for r in runs),
        }
    if park_points:
        result["fit"] = {"park": fit(park_points), "restore": fit(restore_points)}
    result["ok"] = (
        not result["errors"]
        and all(s["identical"] for s in result["sizes"].values())
        and result.get("cell_during_park", {}).get("identical", False)
    )
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
