"""Builds the real control plane the cluster tests start, from Go modules at pinned versions.

Each component is a small wrapper module under tests/cluster/go/<name>/: its go.mod and go.sum
are the pins, its `tool` lines name the commands to build. Binaries land in the user cache
directory under a key made of the pins and the Go version, so a build runs once per pin
change; Go's module and build caches sit beside them (a warm rebuild compiles nothing).

    python tests/cluster/build.py            # build what is missing, print where it is
    python tests/cluster/build.py --check    # exit 1 when something is not built yet
    python tests/cluster/build.py --repin kai github.com/kai-scheduler/KAI-scheduler@v0.17.0
                                             # a new pin: its go.mod and go.sum, same commands

Nothing is downloaded outside the Go module proxy. Components the proxy refuses would be
listed in UNAVAILABLE with the exact error, and the tests that need them say so when skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# one definition of where Go builds cache (the hub's cgroup v2 device helper shares the caches)
from gpupool.contain.devfilter import cache_root, go_env

GO_DIR = Path(__file__).resolve().parent / "go"


@dataclass(frozen=True)
class Component:
    name: str  # a folder under tests/cluster/go
    binaries: tuple[str, ...]  # what `go build tool` writes (the last element of each tool path)
    # a module whose pinned version the binaries report as their Kubernetes version (`/version`):
    # unstamped they say v0.0.0-master, which clients that parse it refuse (Kueue does)
    stamp: str = ""
    packages: tuple[str, ...] = ()  # packages of the wrapper module itself, built beside the tools


COMPONENTS = (
    Component("etcd", ("server",)),  # go.etcd.io/etcd/server/v3: Go names it "server"
    Component(
        "kube",
        (
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kubelet",
            "kube-proxy",
            "deviceplugin",
        ),
        stamp="k8s.io/kubernetes",
        packages=("./deviceplugin",),
    ),
    Component("kwok", ("kwok",)),
)
# Built only for the tests that need them (their fixture asks): a failure to build one skips
# those tests with the error (fails them in CI) and never stops the rest of the plane.
OPTIONAL = (
    Component("kueue", ("kueue",)),  # sigs.k8s.io/kueue/cmd/kueue: Kueue's controller manager
    # KAI-Scheduler's cmd/* (module and version: go/kai/go.mod, the one pin; kai.py derives the
    # rest): what queues, shards, GPU fractions and reclaim need. On KAI's own k8s.io pins
    # (v0.34 before KAI v0.15): those versions do not compile against 1.35's scheduler framework.
    Component(
        "kai", ("scheduler", "binder", "podgrouper", "queuecontroller", "podgroupcontroller", "admission")
    ),
    # the real node's tests (tests/cluster/node.py): helm.sh/helm/v3/cmd/helm, and CoreDNS (our
    # main with the plugins a cluster's Corefile uses) for the node's cluster DNS
    Component("helm", ("helm",)),
    Component("coredns", ("coredns",), packages=(".",)),
)

# Components the module proxy (the only source this project may download from) refuses, with
# the exact error: none at the moment.
UNAVAILABLE: dict[str, str] = {}


def go_version() -> str:
    go = shutil.which("go")
    if not go:
        raise FileNotFoundError("go is not installed (https://go.dev/doc/install); the cluster tests need it")
    return subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=True).stdout.strip()


def ldflags(component: Component) -> str:
    if not component.stamp:
        return ""
    version = module_version(component.name, component.stamp)  # v1.35.4
    major, minor = version.lstrip("v").split(".")[:2]
    pkg = "k8s.io/component-base/version"
    return f"-X {pkg}.gitVersion={version} -X {pkg}.gitMajor={major} -X {pkg}.gitMinor={minor}"


def key(component: Component, version: str) -> str:
    """Changes when a pin (go.mod, go.sum), the Go toolchain or the flags change: then it is rebuilt."""
    h = hashlib.sha256((version + ldflags(component)).encode())
    folder = GO_DIR / component.name
    for f in ("go.mod", "go.sum"):
        h.update((folder / f).read_bytes())
    for f in sorted(folder.rglob("*.go")):  # the wrapper's own packages (packages=)
        h.update(f.relative_to(folder).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def bin_dir(component: Component, version: str) -> Path:
    return cache_root() / "cluster" / f"{component.name}-{key(component, version)}"


def built(component: Component, version: str) -> bool:
    return (bin_dir(component, version) / ".complete").exists()


@contextlib.contextmanager
def build_lock(component: Component, version: str, log=print) -> Iterator[None]:
    """One build of a component's pins at a time on this machine: a second builder (another
    checkout's `make cluster`, a test session's fixture while a build runs) waits for the first
    and then finds it built, instead of compiling the same packages again beside it."""
    path = bin_dir(component, version).with_suffix(".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another build of {component.name} on this machine to finish")
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def build(component: Component, version: str, log=print) -> Path:
    """Builds one component unless its pins are built already; returns its binaries' folder."""
    out = bin_dir(component, version)
    if built(component, version):
        return out
    with build_lock(component, version, log):
        if built(component, version):  # by the builder this one waited for
            return out
        return _build(component, version, out, log)


def _build(component: Component, version: str, out: Path, log) -> Path:
    start = time.monotonic()
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{component.name}-") as tmp:
        mod = (GO_DIR / component.name / "go.mod").read_text()
        tools = ["tool"] if re.search(r"^tool\b", mod, re.M) else []
        proc = subprocess.run(
            [
                "go",
                "build",
                f"-ldflags={ldflags(component)}",
                "-o",
                tmp + os.sep,
                *tools,
                *component.packages,
            ],
            cwd=GO_DIR / component.name,
            env=go_env(),
            capture_output=True,
            text=True,
        )
        if proc.returncode:
            raise RuntimeError(f"building {component.name} failed:\n{proc.stderr[-4000:]}")
        Path(tmp, ".complete").write_text(f"{version}\n")
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)  # whole or nothing: an interrupted build leaves no half folder
        os.chmod(out, 0o755)
    log(f"built {component.name} in {time.monotonic() - start:.0f} s -> {out}")
    return out


def binaries(log=print) -> dict[str, Path]:
    """Every binary of every component, built if needed: {"kube-apiserver": Path, "etcd": Path, …}."""
    version = go_version()
    found: dict[str, Path] = {}
    for c in COMPONENTS:
        folder = build(c, version, log)
        for b in c.binaries:
            found["etcd" if c.name == "etcd" else b] = folder / b
    return found


def optional(name: str, log=print) -> Path:
    """The folder of one OPTIONAL component's binaries, built if needed (RuntimeError if it fails)."""
    component = next(c for c in OPTIONAL if c.name == name)
    return build(component, go_version(), log)


def module_version(component: str, module: str) -> str:
    """The version of `module` that `component`'s go.mod pins."""
    mod = (GO_DIR / component / "go.mod").read_text()
    return re.search(rf"^\s*(?:require\s+)?{re.escape(module)} (v\S+)", mod, re.M).group(1)


def module_dir(component: str, module: str) -> Path:
    """`module`'s source in the Go module cache, at the version `component`'s go.mod pins
    (where the tests read CRDs and stage definitions from)."""
    escaped = re.sub(r"[A-Z]", lambda m: "!" + m.group().lower(), module)  # the cache's case encoding
    return Path(go_env()["GOMODCACHE"]) / f"{escaped}@{module_version(component, module)}"


def download(component: str, module: str) -> Path:
    """`module`'s source at the pinned version, downloaded into the module cache if missing
    (without building anything): where CRDs are read from. RuntimeError if the proxy refuses."""
    folder = module_dir(component, module)
    if not folder.exists():
        proc = subprocess.run(
            ["go", "mod", "download", module],
            cwd=GO_DIR / component,
            env=go_env(),
            capture_output=True,
            text=True,
        )
        if proc.returncode:
            raise RuntimeError(f"go mod download {module} failed:\n{proc.stderr[-2000:]}")
    return folder


def repin(component: str, target: str, log=print) -> None:
    """Rewrite `component`'s wrapper module for another module@version (the same commands, its
    go.mod comment kept): `go get -tool` resolves it and writes go.sum. Where the checksum
    database does not know the version (sum.golang.org answers 404 for some modules the proxy
    serves), it is fetched once without it and the go.sum written then pins it from there on."""
    module, _, version = target.partition("@")
    folder = GO_DIR / component
    old = (folder / "go.mod").read_text()
    tools = re.findall(r"^\s*(?:tool\s+)?(\S+/cmd/\S+)\s*$", old, re.M)
    if not (module and version and tools):
        raise SystemExit(
            f"usage: --repin {component} <module>@<version> (the wrapper names its commands"
            " as <module>/cmd/<name> tool lines)"
        )
    cmds = [f"{module}/cmd/{t.rsplit('/cmd/', 1)[1]}@{version}" for t in tools]
    comment = "".join(line + "\n" for line in old.splitlines() if line.startswith("//"))
    with tempfile.TemporaryDirectory() as tmp:
        env = {**go_env(), "GOFLAGS": "-buildvcs=false"}
        subprocess.run(
            ["go", "mod", "init", f"gpupool.test/cluster/{component}"],
            cwd=tmp,
            env=env,
            check=True,
            capture_output=True,
        )
        # the lowest go line: `go get` raises it to what the dependencies need, not to this Go's
        subprocess.run(["go", "mod", "edit", "-go=1.22"], cwd=tmp, env=env, check=True)
        proc = subprocess.run(["go", "get", "-tool", *cmds], cwd=tmp, env=env, capture_output=True, text=True)
        if proc.returncode and "sum.golang.org" in proc.stderr and "404" in proc.stderr:
            log(
                f"the checksum database does not know {module}@{version}; fetching it without:"
                f" {proc.stderr.strip().splitlines()[-1]}"
            )
            proc = subprocess.run(
                ["go", "get", "-tool", *cmds],
                cwd=tmp,
                env={**env, "GONOSUMDB": module},
                capture_output=True,
                text=True,
            )
        if proc.returncode:
            raise SystemExit(f"go get {module}@{version} failed:\n{proc.stderr[-3000:]}")
        (folder / "go.mod").write_text(comment + Path(tmp, "go.mod").read_text())
        shutil.copy(Path(tmp, "go.sum"), folder / "go.sum")
    log(f"{component} now pins {module} {version}; build it with: python tests/cluster/build.py")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only report whether every component is built")
    ap.add_argument(
        "--repin",
        nargs=2,
        metavar=("COMPONENT", "MODULE@VERSION"),
        help="pin a component to another module version (rewrites its go.mod and go.sum)",
    )
    args = ap.parse_args(argv)
    if args.repin:
        repin(*args.repin)
        return 0
    try:
        version = go_version()
    except FileNotFoundError as err:
        print(err, file=sys.stderr)
        return 1
    if args.check:
        missing = [c.name for c in COMPONENTS + OPTIONAL if not built(c, version)]
        print("missing: " + ", ".join(missing) if missing else "all built")
        return 1 if missing else 0
    start = time.monotonic()
    try:
        found = binaries()
    except RuntimeError as err:
        print(err, file=sys.stderr)
        return 1
    for c in OPTIONAL:  # reported, never fatal: only the tests that need it skip (or fail in CI)
        try:
            folder = build(c, version)
        except RuntimeError as err:
            print(f"not built: {c.name} (its tests will skip, and fail in CI): {err}", file=sys.stderr)
            continue
        found.update({b: folder / b for b in c.binaries})
    for name, path in sorted(found.items()):
        print(f"{name}: {path}")
    for name, why in UNAVAILABLE.items():
        print(f"not built: {name}: {why}")
    print(f"total {time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
