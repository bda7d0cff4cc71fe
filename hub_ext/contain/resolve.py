"""Which memory, process and CPU limits one workload gets: one rule for workspaces and train jobs.

Key by key (memory, processes, CPU weight), the most specific setting wins:
1. the workload's profile (a workspace's size on the spawn form), where it sets that key: what a
   workload of that shape needs, whoever starts it;
2. else the user's hub groups that have limits: the most generous of them (0, no limit, is the
   most generous of all); a group that does not set the key counts with the default;
3. else the default.
Train jobs have no spawn profile: their owner's groups, then the default.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

KEYS = ("memory_bytes", "pids_max", "cpu_shares")
Override = Mapping[str, int]  # some of KEYS -> a value (0: none)


def _most_generous(values: list[int]) -> int:
    return 0 if 0 in values else max(values)


def resolve(
    defaults: Override,
    groups: Mapping[str, Override],
    profiles: Mapping[str, Override],
    user_groups: Iterable[str] = (),
    profile: str = "",
) -> dict[str, int]:
    """KEYS -> the value this workload gets (see the module's rule). Pure: no I/O, no config."""
    mine = [groups[g] for g in sorted(set(user_groups)) if g in groups]
    chosen = profiles.get(profile, {}) if profile else {}
    out: dict[str, int] = {}
    for key in KEYS:
        default = int(defaults.get(key, 0))
        if key in chosen:
            out[key] = int(chosen[key])
        elif mine:
            values = [int(m.get(key, default)) for m in mine]
            # a CPU weight of 0 is the kernel's default, not "unlimited": the highest weight wins
            out[key] = max(values) if key == "cpu_shares" else _most_generous(values)
            if key == "cpu_shares" and not out[key]:
                out[key] = default
        else:
            out[key] = default
    return out
