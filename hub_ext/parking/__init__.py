"""Parking and moving idle workspaces' GPUs, in the hub process."""
