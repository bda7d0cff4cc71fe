"""Map a process to its pod through its cgroup path (cgroup v1 and v2, systemd and cgroupfs)."""

from __future__ import annotations

import re
from pathlib import Path

# .../kubepods/burstable/pod<uid>/<container>            (cgroupfs)
# .../kubepods-burstable-pod<uid with _>.slice/cri-...   (systemd)
POD = re.compile(
    r"kubepods[^/]*?(?:/[a-z]+)?[/-](?:[a-z]+-)?pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}"
    r"[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
)


def pod_uid(cgroup_text: str) -> str | None:
    for line in cgroup_text.splitlines():
        m = POD.search(line)
        if m:
            return m.group(1).replace("_", "-")
    return None


def pod_of(pid: int, proc: Path = Path("/proc")) -> str | None:
    try:
        return pod_uid((proc / str(pid) / "cgroup").read_text())
    except OSError:
        return None


def pods_on_node(proc: Path = Path("/proc")) -> set[str]:
    """Every pod with a process on this node (the agent runs with hostPID): a pod on a GPU node
    with no GPU process has never opened CUDA, and counts as GPU-idle rather than unknown."""
    out = set()
    for entry in proc.iterdir():
        if entry.name.isdigit():
            uid = pod_of(int(entry.name), proc)
            if uid:
                out.add(uid)
    return out
