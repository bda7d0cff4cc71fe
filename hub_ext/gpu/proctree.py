"""Which processes belong to a workspace: its server and everything it started (kernels)."""

from __future__ import annotations

from pathlib import Path


def descendants(pid: int, proc: Path = Path("/proc")) -> set[int]:
    """pid and all its descendants, from /proc/<pid>/stat's parent pids."""
    children: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p in out:
            continue
        out.add(p)
        todo.extend(children.get(p, []))
    return out
