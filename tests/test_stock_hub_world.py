"""The culling replay's "stock idle-culler + gpupool arbiter" world (benchmarks/culling/stock_hub.py)
really decides through jupyterhub-idle-culler's loop: its HTTP requests to the world's hub API, its
clock travelled, gpupool's hook asked about every server."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks.culling import stock_hub
from benchmarks.culling.sessions import Session

pytest.importorskip("jupyterhub_idle_culler")  # the `culler` extra (the test extras include it)

H = 3600.0
# opens at 16:00 and trains 5 h: the user goes home at 18:00, Jupyter is silent from then on
TRAINING = Session(gpus=1, lifetime_s=8 * H, cells=((0.0, 5 * H),), start_tod=16 * H)
# one short cell at 09:00, then the notebook stays open, unused
IDLE = Session(gpus=1, lifetime_s=8 * H, cells=((0.0, 60.0),), start_tod=9 * H)


def test_the_arbiter_keeps_a_computing_gpu_that_idle_cullers_own_rule_culls():
    asked: list[dict] = []

    def hook(world):
        arbiter = stock_hub.arbiter_hook(world)

        async def spy(**kw):
            asked.append(kw["server"])
            return await arbiter(**kw)

        return spy

    ours = asyncio.run(stock_hub.run_world([TRAINING, IDLE], 300, hook))
    stock = asyncio.run(stock_hub.run_world([TRAINING, IDLE], 300, None))
    training, idle = ours["world"].lives
    # idle-culler's own rule (z2jh's cull.timeout, 1 h) stops the training run at 19:00
    assert stock["killed"] == 1
    assert stock["world"].lives[0].culls == 1
    # gpupool's hook keeps it while its GPU computes and culls it once the run has ended
    assert training.killed == 0 and training.culls == 1
    assert ours["killed"] == 0
    # the idle notebook goes within GPU idle 15 min + a pass, where the stock rule waits its hour
    assert idle.culls == 1 and stock["world"].lives[1].culls == 1
    assert idle.reserved < stock["world"].lives[1].reserved
    # both servers were asked about through the hub API's model, kubespawner's pod in their state
    assert {s["state"]["pod_name"] for s in asked} == {"jupyter-u00000", "jupyter-u00001"}
    assert ours["used_pct"] > stock["used_pct"]
