"""Parking is the culler's default where the hub can park (gpupool.parking.support), decided
once at start: the culler service gets a number, and the hub's log says which rule applies."""

from __future__ import annotations

import json

import pytest
from traitlets.config import Config

from gpupool.idle_culler.config import IdleCuller
from gpupool.parking.support import AUTO_PARK_AFTER_S, culler_park_after
from gpupool.wiring.setup import CULLER, configure


def culler_config(c: Config, spawner: str = "gpupool-simple") -> dict:
    configure(c, spawner=spawner, culler=True)
    service = next(s for s in c.JupyterHub.services if s["name"] == CULLER)
    return json.loads(service["environment"]["GPUPOOL_CULLER_CONFIG"])


@pytest.mark.parametrize(
    "setup, spawner, parks, why",
    [
        (lambda c: None, "gpupool-simple", False, "no NVIDIA GPU found"),  # this machine: virtual GPUs
        (lambda c: setattr(c.GPUParking, "backend", "virtual"), "gpupool-simple", True, "virtual"),
        (
            lambda c: setattr(c.GPUParking, "backend", "virtual"),
            "gpupool-kubernetes",
            False,
            "Kubernetes pods",
        ),
        (lambda c: setattr(c.GPUPool, "mps_pipe_directory", "/tmp/mps"), "gpupool-simple", False, "MPS"),
        (lambda c: setattr(c.GPUPool, "use_nvml", False), "gpupool-simple", False, "virtual"),
    ],
)
def test_the_culler_parks_by_default_only_where_the_hub_can(setup, spawner, parks, why) -> None:
    c = Config()
    setup(c)
    after, note = culler_park_after(IdleCuller(config=c).park_after_s, c, spawner)
    assert after == (AUTO_PARK_AFTER_S if parks else 0.0)
    assert why in note and (
        "parking idle GPUs after 10 min" in note if parks else "stopping idle workspaces" in note
    )
    assert culler_config(c, spawner)["park_after_s"] == after  # what the culler service is started with


@pytest.mark.parametrize("value", [0.0, 300.0])
def test_the_admins_park_after_wins_either_way(value: float) -> None:
    for backend in ("virtual", "auto"):
        c = Config()
        c.GPUParking.backend = backend
        c.IdleCuller.park_after_s = value
        assert culler_config(c)["park_after_s"] == value


def test_an_unset_park_after_never_parks_in_a_culler_started_by_hand() -> None:
    """A culler run without the hub's decision (tests, `--once` by hand) treats unset as 0."""
    assert IdleCuller().park_after_s is None and IdleCuller().limits().park_after_s == 0.0
