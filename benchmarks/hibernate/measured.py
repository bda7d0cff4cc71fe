"""What `python -m benchmarks.hibernate` measured on the 2-core development machine (2026-11-28, load
7.4-8.9 from other jobs; docs/culling.md#hibernation), for the culling replay's world with
hibernation: the wake of a real kernel (kernel start + restore before its first cell), p50 and p95
of 5 runs, by state size in bytes."""

WAKE_S = {10 << 20: (1.26, 1.30), 1 << 30: (5.04, 7.82)}
HIBERNATE_S = {10 << 20: (0.06, 0.10), 1 << 30: (6.72, 8.09)}
STATE_GIB = 1.0  # the replay's model: each session's kernels hold 1 GiB of state
