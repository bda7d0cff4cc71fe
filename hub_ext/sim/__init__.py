"""The pool simulator: replays workloads through the same pool core the hub uses."""
