"""What `python -m benchmarks.hibernate` measured on the 2-core development machine (2026-11-28, load
6-7 from other jobs; docs/culling.md#hibernation), for the culling replay's world with hibernation:
the wake of a real kernel (kernel start + restore before its first cell), p50 and p95 of 5 runs,
by state size in bytes."""

WAKE_S = {10 << 20: (1.60, 1.87), 1 << 30: (3.57, 4.72)}
HIBERNATE_S = {10 << 20: (0.08, 0.15), 1 << 30: (5.34, 5.93)}
STATE_GIB = 1.0  # the replay's model: each session's kernels hold 1 GiB of state
