"""What `python -m benchmarks.hibernate` measured on the 2-core development machine (docs/culling.md
#hibernation), for the culling replay's world with hibernation: the wake of a real kernel (kernel
start + restore before its first cell), p50 and p95 of 5 runs, by state size in bytes."""

WAKE_S = {10 << 20: (1.09, 1.25), 1 << 30: (0.0, 0.0)}
STATE_GIB = 1.0  # the replay's model: each session's kernels hold 1 GiB of state
