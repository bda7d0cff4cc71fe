"""The parts of Kubernetes objects gpupool reads back from the API server (watch events, lists),
named once: Jobs, Pods, Nodes and the metadata, conditions and container states in them.

Every key is optional (total=False): gpupool reads them with `.get(...)` and a default, as the
server leaves out what is empty and gpupool.kube.follow keeps only these keys of what arrives.
Only what gpupool reads is named; the manifests gpupool writes are plain dicts
(gpupool.kube.objects), the server's answer to them is not read as a shape."""

from __future__ import annotations

from typing import TypedDict


class ObjectMeta(TypedDict, total=False):
    name: str
    namespace: str
    uid: str
    resourceVersion: str
    deletionTimestamp: str  # RFC 3339: the object is being deleted
    creationTimestamp: str
    labels: dict[str, str]
    annotations: dict[str, str]
    finalizers: list[str]


class Condition(TypedDict, total=False):
    """A condition of a Pod's or Job's status."""

    type: str
    status: str  # "True", "False" or "Unknown"
    reason: str
    message: str


class Terminated(TypedDict, total=False):
    exitCode: int | None


class ContainerState(TypedDict, total=False):
    """One of the three keys is there: the state the container is in."""

    waiting: dict[str, str]
    running: dict[str, str]
    terminated: Terminated


class ContainerStatus(TypedDict, total=False):
    state: ContainerState


class ObjectStatus(TypedDict, total=False):
    """A Pod's status (phase, containerStatuses) or a Job's (active, succeeded, failed)."""

    phase: str  # a Pod's: Pending, Running, Succeeded, Failed, Unknown
    conditions: list[Condition]
    containerStatuses: list[ContainerStatus]
    active: int  # a Job's pods by state
    succeeded: int
    failed: int


class JobSpec(TypedDict, total=False):
    suspend: bool
    parallelism: int
    completions: int
    backoffLimit: int
    activeDeadlineSeconds: int


class KubeObject(TypedDict, total=False):
    """A Job or a Pod as gpupool.kube.follow keeps it (a Pod has no spec kept)."""

    metadata: ObjectMeta
    spec: JobSpec
    status: ObjectStatus


class NodeStatus(TypedDict, total=False):
    capacity: dict[str, str]  # resource name -> quantity ("8", "500m")
    allocatable: dict[str, str]


class KubeNode(TypedDict, total=False):
    metadata: ObjectMeta
    status: NodeStatus
