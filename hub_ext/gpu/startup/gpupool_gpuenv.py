"""The workspace's CURRENT GPU, for processes started after its share moved.

The hub writes each workspace's GPU variables to a file of its own (gpupool.gpu.env_files,
named by GPUPOOL_GPU_ENV_FILE); `refresh` copies them into an environment. sitecustomize.py
calls it at the start of every Python process of the workspace (before CUDA can read
CUDA_VISIBLE_DEVICES), wraps the Jupyter server's kernel and terminal launchers with it (so
kernels of any language get the current GPU), and gpupool_resume.py calls it before each cell
(so a kernel's subprocesses do too). Standard library only; a missing or unreadable file
changes nothing: the process keeps the environment it started with.
"""

from __future__ import annotations

import json
import os
from collections.abc import MutableMapping
from typing import Any

VAR = "GPUPOOL_GPU_ENV_FILE"
MAX_BYTES = 64 * 1024
# every variable gpupool.gpu.env.gpu_env sets that depends on where the share is
KEYS = (
    "CUDA_VISIBLE_DEVICES",
    "GPUPOOL_GPU_FRACTION",
    "GPUPOOL_GPU_MEMORY_MIB",
    "GPUPOOL_GPU_UUIDS",
    "GPUPOOL_GPU_MODEL",
    "GPUPOOL_GPU_VIRTUAL",
    "TF_FORCE_GPU_ALLOW_GROWTH",
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
)


def read(environ: MutableMapping[str, str] = os.environ) -> dict[str, Any] | None:
    """The hub's document for this workspace, or None (no file, not ours, malformed)."""
    path = environ.get(VAR, "")
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
        doc = json.loads(data) if len(data) <= MAX_BYTES else None
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("env"), dict):
        return None
    workspace = environ.get("GPUPOOL_WORKSPACE")
    if workspace is not None and doc.get("workspace") != workspace:
        return None  # a file about another workspace: trust nothing in it
    return doc


def refresh(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Set the GPU variables in `environ` to the hub's current ones; True when it did."""
    doc = read(environ)
    if doc is None:
        return False
    env = doc["env"]
    for key in KEYS:
        value = env.get(key)
        if isinstance(value, str) and len(value) <= 4096 and "\0" not in value:
            environ[key] = value
    return True
