"""Whether the hub lets this server's user hibernate it now: asked by JupyterLab's status (which
then offers "Hibernate now" or not), by the server's hibernate-now page and by `%gpupool
hibernate` before they save anything (gpupool.api.hibernation.available: the culler's rules for
the user's group and this server's profile)."""

from __future__ import annotations

import os
from urllib.parse import quote

from gpupool.widgets.client import Client, GPUPoolError


def hibernation(client: Client, server: str | None = None) -> tuple[bool, str]:
    """(on, why not). No answer from the hub: off, with the reason."""
    name = os.environ.get("JUPYTERHUB_SERVER_NAME", "") if server is None else server
    try:
        answer = client.get(f"api/hibernated?server={quote(name, safe='')}")
    except GPUPoolError as err:
        return False, f"the hub could not say whether hibernation is on ({err})"
    if not isinstance(answer, dict) or answer.get("available") is not True:
        said = answer.get("off_message") if isinstance(answer, dict) else None
        return False, str(said)[:300] if said else "hibernation is off on this hub"
    return True, ""


def asked_hub() -> tuple[bool, str]:
    """`hibernation` with this server's own client (GPUPOOL_API_URL, JUPYTERHUB_API_TOKEN)."""
    try:
        client = Client(timeout=8)
    except GPUPoolError as err:  # no hub to ask (GPUPOOL_API_URL unset)
        return False, f"the hub could not say whether hibernation is on ({err})"
    return hibernation(client)
