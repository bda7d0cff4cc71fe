"""NetworkPolicy semantics, as a CNI enforces them, for the policies a real API server admitted
(none is enforced here: no CNI runs). A connection is allowed when the source's egress policies
AND the destination's ingress policies allow it; a pod no policy of a direction selects is open
in that direction. ipBlocks match addresses outside the cluster only (Cilium's reading; Calico
also matches pod addresses against them, which would only allow more)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Pod:
    ns: str
    labels: dict[str, str]
    ports: dict[str, int] = field(default_factory=dict)  # named container ports


def selects(selector: dict | None, labels: dict[str, str]) -> bool:
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        has, value = e["key"] in labels, labels.get(e["key"])
        op = e["operator"]
        if (
            (op == "Exists" and not has)
            or (op == "DoesNotExist" and has)
            or (op == "In" and value not in e["values"])
            or (op == "NotIn" and has and value in e["values"])
        ):
            return False
    return True


def _peer(peer: dict, policy_ns: str, other: Pod | None, ip: str | None, ns_labels: dict[str, dict]) -> bool:
    if "ipBlock" in peer:
        if ip is None:
            return False
        addr, block = ipaddress.ip_address(ip), peer["ipBlock"]
        return addr in ipaddress.ip_network(block["cidr"]) and not any(
            addr in ipaddress.ip_network(x) for x in block.get("except") or []
        )
    if other is None:
        return False
    ns_ok = (
        selects(peer["namespaceSelector"], ns_labels[other.ns])
        if "namespaceSelector" in peer
        else other.ns == policy_ns
    )
    return ns_ok and selects(peer.get("podSelector"), other.labels)


def _port(rule: dict, port: int, target: Pod | None) -> bool:
    for p in rule.get("ports") or [{}]:
        want = p.get("port")
        if (
            want is None
            or want == port
            or (isinstance(want, str) and target is not None and target.ports.get(want) == port)
        ):
            return True
    return False


def _side(
    policies: list[dict],
    pod: Pod,
    direction: str,
    other: Pod | None,
    ip: str | None,
    port: int,
    target: Pod | None,
    ns_labels: dict[str, dict],
) -> bool:
    kind = "Egress" if direction == "egress" else "Ingress"
    mine = [
        p
        for p in policies
        if p["metadata"]["namespace"] == pod.ns
        and selects(p["spec"]["podSelector"], pod.labels)
        and kind in (p["spec"].get("policyTypes") or ["Ingress"])
    ]
    if not mine:
        return True
    peers = "to" if direction == "egress" else "from"
    return any(
        _port(rule, port, target)
        and (
            not rule.get(peers)
            or any(_peer(peer, policy["metadata"]["namespace"], other, ip, ns_labels) for peer in rule[peers])
        )
        for policy in mine
        for rule in policy["spec"].get(direction) or []
    )


def allowed(policies: list[dict], ns_labels: dict[str, dict], src: Pod, dst: Pod | str, port: int) -> bool:
    """Whether `src` may open a connection to `dst` (a pod, or an address outside the cluster)."""
    if isinstance(dst, str):
        return _side(policies, src, "egress", None, dst, port, None, ns_labels)
    return _side(policies, src, "egress", dst, None, port, dst, ns_labels) and _side(
        policies, dst, "ingress", src, None, port, dst, ns_labels
    )
