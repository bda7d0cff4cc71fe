"""`helm` (built from helm.sh/helm/v3 at the pin in tests/cluster/go/helm) against the test
control plane, with its own cache, config and data folders: nothing in the user's home."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml


@dataclass
class Helm:
    binary: Path
    kubeconfig: Path
    home: Path

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }

    def __call__(self, *args: str, timeout: float = 600) -> str:
        proc = subprocess.run(
            [str(self.binary), *args], env=self.env(), capture_output=True, text=True, timeout=timeout
        )
        if proc.returncode:
            raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        return proc.stdout

    def values_file(self, name: str, values: dict) -> Path:
        path = self.home / f"{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(values))
        return path

    def releases(self, namespace: str) -> list[str]:
        return [r["name"] for r in yaml.safe_load(self("list", "-n", namespace, "-o", "yaml")) or []]
