"""Read the openb CSV format (Alibaba's GPU-sharing trace, as used by the FGD paper).

Every malformed row is reported with file, line and column, and nothing is half-read.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpupool.pool import GPU, Inventory, Node, Request
from gpupool.pool.errors import InvalidRequest
from gpupool.pool.units import MILLI_PER_GPU


class TraceError(ValueError):
    """A CSV the simulator cannot use; str() names file, line and column."""


@dataclass(frozen=True)
class TracePod:
    name: str
    request: Request
    created: int | None = None  # seconds, relative
    deleted: int | None = None


def _rows(path: Path, required: list[str]):
    try:
        f = open(path, newline="")
    except OSError as err:
        raise TraceError(f"{path}: cannot open: {err.strerror}") from None
    with f:
        reader = csv.DictReader(f)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(f"{path}:1: missing column(s) {', '.join(missing)}")
        for row in reader:
            yield reader.line_num, row


def _int(
    path: Path,
    line: int,
    row: dict[str, Any],
    column: str,
    lo: int | None = None,
    hi: int | None = None,
    blank: int | None = None,
) -> int:
    text = (row.get(column) or "").strip()
    if text == "" and blank is not None:
        return blank
    try:
        value = int(text)
    except ValueError:
        raise TraceError(f"{path}:{line}: column {column}: not a whole number: {text!r}") from None
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        raise TraceError(f"{path}:{line}: column {column}: must be {bounds}, got {value}")
    return value


def read_nodes(path: str | Path) -> Inventory:
    path = Path(path)
    nodes = []
    for line, row in _rows(path, ["sn", "cpu_milli", "memory_mib", "gpu", "model"]):
        count = _int(path, line, row, "gpu", 0, 64)
        model = (row.get("model") or "").strip()
        name = (row.get("sn") or "").strip()
        if not name:
            raise TraceError(f"{path}:{line}: column sn: empty node name")
        gpus = tuple(
            GPU(index=g, uuid=f"{name}-gpu{g}", model=model, memory_mib=0, virtual=True) for g in range(count)
        )
        nodes.append(
            Node(
                name=name,
                gpus=gpus,
                cpu_milli=_int(path, line, row, "cpu_milli", 0),
                memory_mib=_int(path, line, row, "memory_mib", 0),
                max_pods=1001,
            )
        )
    if not nodes:
        raise TraceError(f"{path}: no nodes")
    try:
        return Inventory(nodes=tuple(nodes))
    except ValueError as err:
        raise TraceError(f"{path}: {err}") from None


def read_pods(path: str | Path) -> list[TracePod]:
    path = Path(path)
    pods = []
    for line, row in _rows(path, ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"]):
        num = _int(path, line, row, "num_gpu", 0, 8)
        milli = _int(path, line, row, "gpu_milli", 0, MILLI_PER_GPU)
        if num == 0:
            milli = MILLI_PER_GPU  # CPU-only: the share column is meaningless
        elif milli == 0:
            raise TraceError(f"{path}:{line}: column gpu_milli: a GPU pod needs 1..1000 milli per GPU")
        spec = (row.get("gpu_spec") or "").strip()
        models = frozenset(m for m in spec.split("|") if m) if spec else frozenset()
        try:
            req = Request(
                num_gpu=num,
                gpu_milli=milli,
                cpu_milli=_int(path, line, row, "cpu_milli", 0),
                memory_mib=_int(path, line, row, "memory_mib", 0),
                gpu_models=models,
            )
        except InvalidRequest as err:
            raise TraceError(f"{path}:{line}: columns num_gpu/gpu_milli: {err}") from None
        created = _int(path, line, row, "creation_time", 0, blank=-1) if "creation_time" in row else -1
        deleted = _int(path, line, row, "deletion_time", 0, blank=-1) if "deletion_time" in row else -1
        pods.append(
            TracePod(
                name=row.get("name", ""),
                request=req,
                created=None if created < 0 else created,
                deleted=None if deleted < 0 else deleted,
            )
        )
    if not pods:
        raise TraceError(f"{path}: no pods")
    return pods
