"""The namespace a user's train Job goes to: with user namespaces, the owner's own.

kubespawner (enable_user_namespaces) puts a workspace in the namespace its
user_namespace_template expands to, with its slug scheme; the same user's `%%train` Job goes
there too, so that it is fenced from other users' namespaces as the workspace is (RBAC, Pod
Security, NetworkPolicies) instead of running beside every user's jobs in the hub's namespace.
The name is expanded here as kubespawner expands it for the user's default server
(kubespawner.slugs: its own 'safe' and 'escape' slugs); a template needing what the hub's
training pool does not know (the user's database id, a pod's name) is refused when the hub
starts, not guessed.
"""

from __future__ import annotations

import re
import string
from typing import Any

# the fields of kubespawner's template expansion that depend on the user name alone (for the
# default server: no server name)
_FIELDS = (
    "unescaped_username",
    "unescaped_servername",
    "hubnamespace",
    "username",
    "servername",
    "user_server",
    "safe_username",
    "safe_servername",
    "safe_user_server",
    "escaped_username",
    "escaped_servername",
    "escaped_user_server",
)
_SLUG_MAX = 48  # kubespawner's per-field limit
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def template_problem(
    template: str, slug_scheme: str, setting: str = "user_namespace_template", more: tuple[str, ...] = ()
) -> str:
    """Why the train Jobs' namespaces (or, with `more` fields known, another of kubespawner's
    names: the home claim's) cannot be named from `template` ("" when they can)."""
    if slug_scheme not in ("safe", "escape"):
        return f"slug scheme must be 'safe' or 'escape', not {slug_scheme!r}"
    try:
        names = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as err:
        return f"{setting} {template!r}: {err}"
    known = (*_FIELDS, *more)
    unknown = sorted(n for n in names if n not in known)
    if unknown:
        what = "go to their owner's namespace" if not more else "name their owner's home claim"
        return (
            f"{setting} {template!r} uses {', '.join(unknown)}: train Jobs could not {what}"
            f" (the fields the hub knows for a job: {', '.join(known)})"
        )
    return ""


def user_fields(owner: str, hub_namespace: str, slug_scheme: str) -> dict[str, str]:
    """kubespawner's template fields for `owner`'s default server."""
    from kubespawner.slugs import escape_slug, multi_slug, safe_slug

    safe = safe_slug(owner, max_length=_SLUG_MAX)
    escaped = escape_slug(owner)
    # kubespawner's {user_server}: the user name with "--" and no server name, hashed again
    # when that would be too long
    safe_server = multi_slug([owner, ""], max_length=_SLUG_MAX) if len(safe) + 2 > _SLUG_MAX else safe
    username = safe if slug_scheme == "safe" else escaped
    return {
        "unescaped_username": owner,
        "unescaped_servername": "",
        # kubespawner's own rule: a hub in "default" names user namespaces "user-..."
        "hubnamespace": "user" if hub_namespace == "default" else hub_namespace,
        "username": username,
        "servername": "",
        "user_server": safe_server if slug_scheme == "safe" else escaped,
        "safe_username": safe,
        "safe_servername": "",
        "safe_user_server": safe_server,
        "escaped_username": escaped,
        "escaped_servername": "",
        "escaped_user_server": f"{escaped}--",
    }


def expand(
    template: str, owner: str, hub_namespace: str, slug_scheme: str, more: dict[str, str] | None = None
) -> str:
    """`template` expanded for `owner` as kubespawner expands it (a trailing '-' the expansion
    made is stripped, as kubespawner strips it); `more`: the resolved names kubespawner adds
    (its `namespace`, `pvc_name`)."""
    rendered = template.format(**user_fields(owner, hub_namespace, slug_scheme), **(more or {}))
    return rendered if template.endswith("-") else rendered.rstrip("-")


def owner_namespace(owner: str, hub_namespace: str, template: str, slug_scheme: str = "safe") -> str:
    """Where `owner`'s train Jobs go: the hub's namespace without a template (user namespaces
    off), else the owner's own. ValueError when the name is no namespace name (a DNS label)."""
    if not template:
        return hub_namespace
    ns = expand(template, owner, hub_namespace, slug_scheme)
    if not _DNS_LABEL.match(ns):
        raise ValueError(f"the namespace of {owner!r}'s jobs, {ns!r}, is not a DNS label")
    return ns


def namespace_labels(
    labels: dict[str, str], owner: str, hub_namespace: str, slug_scheme: str
) -> dict[str, Any]:
    """kubespawner's user_namespace_labels expanded for `owner` (the labels the namespace gets
    when the hub makes it for a job before any workspace did)."""
    return {k: expand(v, owner, hub_namespace, slug_scheme) for k, v in labels.items()}


TRAIN_POLICY = "gpupool-train"  # the chart's name for the same policy in the hub's namespace


def train_policy(namespace: str, spec: dict[str, object]) -> dict[str, object]:
    """The train pods' NetworkPolicy in a user namespace, with the chart's spec (a copy)."""
    import copy

    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": TRAIN_POLICY,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "gpupool", "app.kubernetes.io/component": "train"},
        },
        "spec": copy.deepcopy(spec),
    }


def user_namespace(name: str, labels: dict[str, str]) -> dict[str, object]:
    """The owner's namespace as kubespawner would make it at their first spawn (its labels: Pod
    Security's level and what the hub's admission policy and NetworkPolicies select)."""
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": dict(labels)}}
