"""Run a snapshot notebook headless with nbclient; this is a train job's command.

    python -m gpupool.widgets.execute INPUT.ipynb OUTPUT.ipynb [--timeout S]

Progress goes to stdout (the job's log), one line per cell. The executed notebook is
written even when a cell fails, so the error can be read where it happened; the exit
code is non-zero then.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


class ProgressClient(NotebookClient):
    async def async_execute_cell(self, cell, cell_index, *args, **kwargs):
        total = len(self.nb.cells)
        first = (cell.source.strip().splitlines() or [""])[0][:60]
        print(f"[cell {cell_index + 1}/{total}] {first}", flush=True)
        t0 = time.monotonic()
        result = await super().async_execute_cell(cell, cell_index, *args, **kwargs)
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                sys.stdout.write(out.get("text", ""))
        print(f"[cell {cell_index + 1}/{total}] done in {time.monotonic() - t0:.1f}s", flush=True)
        return result


def run(input_path: Path, output_path: Path, timeout: int | None = None) -> int:
    nb = nbformat.read(str(input_path), as_version=4)
    client = ProgressClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(output_path.parent)}})
    status = 0
    try:
        client.execute()
    except CellExecutionError as err:
        print(f"a cell failed:\n{err}", flush=True)
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
