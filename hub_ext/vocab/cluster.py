"""The cluster's words the settings name as defaults: the node pool label, the GPU taint's
toleration, the short names of the GPU sharing back-ends. Here, at the bottom, so the admin's
options (gpupool.settings.config) state them without importing the Kubernetes code that uses them
(gpupool.kube) or the back-ends (gpupool.gpu.sharing)."""

from __future__ import annotations

KAI_NODE_POOL = "kai.scheduler/node-pool"  # KAI's default nodePoolLabelKey (scheduling shards)

# GKE's taint on GPU nodes (nvidia.com/gpu=present:NoSchedule), and the GPU Operator's advice
# for other clusters: any value, so one toleration fits both.
GPU_TOLERATION: dict[str, str] = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}

# c.GPUPool.gpu_sharing's short names, in the order its help lists them; each is the `name` of one
# back-end of gpupool.gpu.sharing.BACKENDS (tests/test_config.py holds them together)
SHARING_BACKENDS = ("kai", "hami", "mig", "whole")
