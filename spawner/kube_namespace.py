"""The user namespace a workspace starts in: what the hub adds to it before the pod.

kubespawner (enable_user_namespaces) names the namespace from its own user_namespace_template
and creates it with user_namespace_labels; z2jh's singleuser NetworkPolicy exists in the hub's
namespace only, so a workspace in its own namespace would reach every pod and the cloud
metadata server. The hub makes gpupool's policy there before the pod exists, for whoever logs
in (the chart cannot list them in advance), and a spawn it cannot fence is refused.
"""

from __future__ import annotations

import copy
from typing import Any

POLICY_NAME = "gpupool-singleuser"


def workspace_policy(namespace: str, spec: dict[str, object]) -> dict[str, Any]:
    """The NetworkPolicy object for `namespace` with the chart's spec (a copy: the trait's dict
    is shared by every spawner)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": POLICY_NAME,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "gpupool", "app.kubernetes.io/component": "singleuser"},
        },
        "spec": copy.deepcopy(spec),
    }


async def ensure_workspace_policy(api_client: Any, namespace: str, spec: dict[str, object]) -> bool:
    """Create the policy in `namespace`; False when it was there already (the chart made it, or
    an earlier spawn). Any other refusal (403: RBAC or the hub's admission policy) is raised:
    the workspace must not start unfenced."""
    from kubernetes_asyncio.client import NetworkingV1Api
    from kubernetes_asyncio.client.rest import ApiException

    try:
        # a plain dict is sent as it is (the client serializes dicts unchanged)
        body: Any = workspace_policy(namespace, spec)
        await NetworkingV1Api(api_client).create_namespaced_network_policy(namespace, body)
    except ApiException as err:
        if err.status == 409:
            return False
        raise
    return True
