"""`python -m gpupool.idle_culler.stock`: jupyterhub-idle-culler itself (same flags, same config
file), with gpupool's GPU-aware decision as its cull_arbiter_hook (`GPUArbiter.from_env()`: the
node agents from GPUPOOL_NODE_AGENTS). A z2jh hub swaps its culler's module name for this one:
docs/culling.md#gpu-aware-culling-for-a-stock-hub."""

from __future__ import annotations

from gpupool.idle_culler.stock_arbiter import GPUArbiter


def main(argv: list[str] | None = None) -> None:
    from jupyterhub_idle_culler import IdleCuller

    # a hook set in the culler's own config file (--config) still wins: it is loaded at start
    IdleCuller.launch_instance(argv, cull_arbiter_hook=GPUArbiter.from_env())


if __name__ == "__main__":
    main()
