"""How the hub starts the culler service, and the least privilege it gets."""

from __future__ import annotations

import sys
from typing import Any


def service_definition(name: str, api_url: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The service entry and its role, like jupyterhub-idle-culler's recommended role."""
    service = {
        "name": name,
        "command": [sys.executable, "-m", "idle_culler", f"--gpupool-url={api_url}"],
    }
    role = {
        "name": name,
        "services": [name],
        "scopes": [
            "list:users",
            "read:users:activity",
            "read:servers",
            "delete:servers",
            "access:services!service=gpupool",
        ],
    }
    return service, role
