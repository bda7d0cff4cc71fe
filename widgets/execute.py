"""Run a snapshot notebook headless with nbclient; this is a train job's command.

    python -m gpupool.widgets.execute INPUT.ipynb OUTPUT.ipynb [--timeout S]

Progress goes to stdout (the job's log), one line per cell. The executed notebook is
written even when a cell fails, so the error can be read where it happened; the exit
code is non-zero then. The kernel talks over local IPC sockets (no TCP, so no transport
warning in the log). On SIGTERM (preemption) the kernel gets SIGTERM too, so user code can
save its checkpoint (`gpupool.widgets.checkpoint`); the log then says so in one line instead
of the kernel's tracebacks.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from pathlib import Path

import nbformat
from jupyter_core.utils import ensure_async
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from traitlets.config import Config


class ProgressClient(NotebookClient):
    """nbclient that prints progress, and on SIGTERM passes the signal to the kernel (nbclient's own
    handler shuts the kernel down at once: no checkpoint, a page of tracebacks in the log)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.stopping: list[float] = []
        self.on_notebook_start = self._own_sigterm

    def output(self, outs, msg, display_id, cell_index):
        if msg.get("msg_type") == "stream":  # into the job's log as it comes: the monitor tails it live
            sys.stdout.write(msg.get("content", {}).get("text", ""))
            sys.stdout.flush()
        return super().output(outs, msg, display_id, cell_index)

    def _own_sigterm(self, **_: object) -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self._preempted)

    def _preempted(self) -> None:
        self.stopping.append(time.time())
        # the kernel runs in its own session, so the runner's signal to our group misses it
        if self.km is not None:  # (a kernel runs before this handler is installed)
            # the client's kernel manager is nbclient's async one; ensure_async takes either kind
            asyncio.ensure_future(ensure_async(self.km.signal_kernel(signal.SIGTERM)))

    async def async_execute_cell(self, cell, cell_index, *args, **kwargs):
        total = len(self.nb.cells)
        first = (cell.source.strip().splitlines() or [""])[0][:60]
        print(f"[cell {cell_index + 1}/{total}] {first}", flush=True)
        t0 = time.monotonic()
        result = await super().async_execute_cell(cell, cell_index, *args, **kwargs)
        print(f"[cell {cell_index + 1}/{total}] done in {time.monotonic() - t0:.1f}s", flush=True)
        return result


# the run only knows it got SIGTERM: preempted, cancelled, out of time or idle, the hub's own line
# just above in the log says which (and whether the job comes back)
PREEMPTED = "gpupool: this run stopped (SIGTERM)"


def run(input_path: Path, output_path: Path, timeout: int | None = None) -> int:
    nb = nbformat.read(str(input_path), as_version=4)
    ipc = Config({"KernelManager": {"transport": "ipc", "ip": str(output_path.parent / ".kernel-ipc")}})
    client = ProgressClient(
        nb,
        config=ipc,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(output_path.parent)}},
    )
    status = 0
    try:
        client.execute()
    except CellExecutionError as err:
        if client.stopping:  # e.g. the checkpoint's exit, or the kernel's SIGTERM as an error
            print(PREEMPTED, flush=True)
            status = 143
        else:
            print(f"a cell failed:\n{err}", flush=True)
            status = 1
    except Exception as err:  # noqa: BLE001 - the kernel died: say it in one line, not its traceback
        if client.stopping:
            print(PREEMPTED, flush=True)
            status = 143
        else:
            print(
                f"the kernel stopped: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
                flush=True,
            )
            status = 1
    finally:
        nbformat.write(nb, str(output_path))
        print(f"executed notebook: {output_path}", flush=True)
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpupool.widgets.execute", description=__doc__)
    parser.add_argument("input", type=Path)
    parser.add_argument("output", type=Path)
    parser.add_argument("--timeout", type=int, default=None, help="seconds per cell (default: none)")
    args = parser.parse_args(argv)
    if not args.input.is_file():
        parser.error(f"{args.input} not found")
    return run(args.input, args.output, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
