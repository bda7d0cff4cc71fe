"""Offline Kubernetes checks: schemas from ../shared/schemas beside the repository."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = Path(os.environ.get("GPUPOOL_SHARED_DIR", REPO.parent / "shared")) / "schemas"


@pytest.fixture(scope="session")
def schemas() -> Path:
    if not SCHEMAS.exists():
        if os.environ.get("CI"):
            pytest.fail(f"schemas missing at {SCHEMAS}")
        pytest.skip("shared schemas not present")
    return SCHEMAS
