"""A small real file system for disk-full tests: a tmpfs of `size` mounted at a fresh folder, so
the kernel itself answers ENOSPC once it is filled (as root; skipped elsewhere with the reason)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_disk(folder: Path, size: str) -> Iterator[Path]:
    """`folder` (made here) as a tmpfs of `size` (e.g. "64k", "48m") for the block's length."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("needs root to mount a small file system")
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
