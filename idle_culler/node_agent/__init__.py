"""The GPU node agent (a DaemonSet with hostPID): per-pod GPU use from NVML, served as JSON
(`/pods`) and Prometheus metrics (`/metrics`) for the idle culler.

Pods are found through /proc/<pid>/cgroup, because KAI's fractional pods do not appear in
kubelet's pod-resources API.
"""
