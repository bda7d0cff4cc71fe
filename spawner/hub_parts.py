"""What gpupool's spawners read of the hub's composition root (gpupool.wiring.root.GPUPoolHub).

`configure(c)` puts the root in the hub's tornado settings; JupyterHub hands those to every User
(`User.settings`), and a spawner reads it there (`spawner_root`). The spawners name here what they
use of it, so they do not import the root, which sits above them (`make layers`); the root's
set-up (gpupool.wiring.setup.configure) has mypy check that it gives all of it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from gpupool.hub.root_key import stored_root

if TYPE_CHECKING:
    from gpupool.alloc.manager import PoolManager
    from gpupool.contain import WorkloadCgroups
    from gpupool.settings.config import GPUPool


class GroupDirectory(Protocol):
    """Users' groups as the hub has them now (gpupool.api.auth.Directory)."""

    def groups_of(self, names: set[str]) -> dict[str, tuple[str, ...]] | None: ...


class SpawnerRoot(Protocol):
    """The hub's parts a spawner uses."""

    @property
    def pool(self) -> PoolManager: ...

    @property
    def settings(self) -> GPUPool: ...

    @property
    def cgroups(self) -> WorkloadCgroups: ...

    @property
    def directory(self) -> GroupDirectory | None:
        """None before the gpupool API runs."""
        ...

    @property
    def cluster_reads(self) -> dict[Any, tuple[float, Any]]:
        """What spawners read of the cluster and reuse for a while (a KAI Queue): key ->
        (monotonic time of the read, what was read)."""
        ...

    @property
    def service_token(self) -> str:
        """The gpupool service's token for the hub's REST API ("" when it has none)."""
        ...


def spawner_root(settings: Mapping[str, object] | None) -> SpawnerRoot:
    """The root in a User's `settings` (NotConfigured where `configure(c)` never ran)."""
    root: SpawnerRoot = stored_root(settings)
    return root
