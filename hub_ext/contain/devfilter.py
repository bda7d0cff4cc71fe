"""A workload's GPU devices on cgroup v2: a device eBPF program attached to its cgroup2 folder.

cgroup v2 has no devices controller files; the kernel asks a BPF_CGROUP_DEVICE program attached to
the cgroup (and those of every cgroup above) at each open(2) of a device node. gpupool does not
build that program itself: a small Go helper (devfilter/main.go) hands the rules to runc's own
device filter (github.com/opencontainers/cgroups/devices, on cilium/ebpf), which emulates the v1
rules exactly and replaces the attached program atomically (BPF_F_REPLACE). The rules are the v1
ones (gpupool.contain.limits.device_rules): everything stays open except the GPUs not the
workload's.

The helper is built from Go modules at the versions pinned in devfilter/go.mod and go.sum, never
shipped as a binary: `make venv` builds it where Go is installed (`build()`),
else the hub does on first use. It lands in the user cache directory under a key made of the
sources and the Go version, so a build runs once per change.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "devfilter"
NAME = "gpupool-devfilter"
BUILD_TIMEOUT_S = 600  # a cold module and build cache on a slow machine
ATTACH_TIMEOUT_S = 30


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpupool"


def go_env() -> dict[str, str]:
    # the module and build caches; the cluster tests' Go builds import this (tests/cluster/build.py)
    root = cache_root() / "go"
    return {
        **os.environ,
        "GOMODCACHE": str(root / "mod"),
        "GOCACHE": str(root / "build"),
        "GOFLAGS": "-buildvcs=false -mod=readonly",
        "GOTOOLCHAIN": "local",
        "CGO_ENABLED": "0",
    }


def _go() -> str:
    go = shutil.which("go")
    if not go:
        raise FileNotFoundError(
            "Go is not installed (https://go.dev/doc/install): the cgroup v2 device program's helper"
            " is built from Go modules"
        )
    return go


def key(go_version: str) -> str:
    """Changes when a pin, the helper's source or the Go toolchain changes: then it is rebuilt."""
    h = hashlib.sha256(go_version.encode())
    for f in ("go.mod", "go.sum", "main.go"):
        h.update(f.encode() + b"\0" + (SOURCE / f).read_bytes())
    return h.hexdigest()[:16]


def built_path(go_version: str) -> Path:
    return cache_root() / f"devfilter-{key(go_version)}" / NAME


def build() -> Path:
    """The helper, built unless it is already (raises OSError with Go's words on failure)."""
    go = _go()
    env = go_env()
    version = subprocess.run(
        [go, "env", "GOVERSION"], capture_output=True, text=True, check=True, env=env
    ).stdout.strip()
    out = built_path(version)
    if out.exists():
        return out
    out.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="build-", dir=out.parent)) / NAME
    try:
        done = subprocess.run(
            [go, "build", "-ldflags=-s -w", "-o", str(tmp), "."],
            cwd=SOURCE,
            env=env,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
        if done.returncode:
            raise OSError(f"go build of {NAME} failed: {done.stderr.strip()[-2000:]}")
        os.replace(tmp, out)  # whole or not at all, also when two builds race
    finally:
        shutil.rmtree(tmp.parent, ignore_errors=True)
    return out


def untrusted(program: Path) -> str:
    """Why root must not run this file ("" when it may): the hub runs the helper as root, so the
    file and every folder up to the cache root must be this user's (or root's), no link, and
    writable by nobody else; else another user could swap the program root runs (an
    XDG_CACHE_HOME in a shared folder, a group-writable umask)."""
    top = cache_root()
    for path in (program, *program.parents):
        st = os.lstat(path)
        if path.is_symlink() or st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
            return f"{path} is a link, another user's, or writable by others"
        if path == top:
            return ""
    return f"{program} is not under {top}"


_built: list[Path] = []  # this process's helper once found: each detect() asks again


def helper() -> tuple[Path | None, str]:
    """(the built helper, "") or (None, why not): said at start when it decides a limit."""
    if _built and _built[0].exists():
        return _built[0], ""
    try:
        program = build()
        why = untrusted(program)
        if why:
            return None, f"will not run the cgroup v2 device program's helper as root: {why}"
        _built[:] = [program]
        return _built[0], ""
    except (OSError, subprocess.SubprocessError) as err:
        return None, f"cannot build the cgroup v2 device program's helper: {err}"


def rules(deny: Iterable[str]) -> str:
    """The helper's input: every device allowed, then the denied ones (cgroup v1 syntax)."""
    return "".join(["allow a *:* rwm\n", *(f"deny {r}\n" for r in deny)])


def attach(program: Path, folder: Path, deny: Iterable[str]) -> None:
    """Attach (or atomically replace) the device program of the cgroup2 folder. Raises OSError."""
    done = subprocess.run(
        [str(program), str(folder)],
        input=rules(deny),
        capture_output=True,
        text=True,
        timeout=ATTACH_TIMEOUT_S,
    )
    if done.returncode:
        raise OSError(done.stderr.strip()[-500:] or f"{NAME} exited {done.returncode}")
