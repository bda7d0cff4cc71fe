"""Where the shared benchmark data lives: ../shared/data beside the repository
(as CI lays it out), or GPUPOOL_SHARED_DIR."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def shared_data(*parts: str) -> Path:
    root = Path(os.environ.get("GPUPOOL_SHARED_DIR", REPO.parent / "shared"))
    path = root.joinpath("data", *parts)
    if not path.exists():
        raise SystemExit(f"benchmark data not found: {path} (set GPUPOOL_SHARED_DIR to the shared folder)")
    return path
