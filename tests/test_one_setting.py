"""Each setting exists once (#24): where GPU use comes from and what counts as idle are the idle
culler's settings, and they measure idle train jobs too; the old train-side names still work for
one release, with a warning. (The Kubernetes pair, sharing backend and node pool label:
tests/k8s/test_spawner_kube.py.)"""

from __future__ import annotations

import json

import pytest
from traitlets import TraitError
from traitlets.config import Config

from gpupool.idle_culler.config import IdleCuller
from gpupool.idle_culler.sampler import NodeAgentSampler, make_sampler
from gpupool.idle_culler.service import service_definition
from gpupool.train.config import TrainPool
from gpupool.wiring.setup import culler_gpu_use

AGENTS = "http://node-agent.gpupool:9402/pods,http://node-agent.other:9402/pods"
TOKEN = "/etc/gpupool-agent/token"


def culler_as_started(c: Config) -> IdleCuller:
    """The culler service's settings as it reads them: what the hub hands it in its environment."""
    service, _ = service_definition(
        "gpupool-culler", "http://127.0.0.1:8095/", IdleCuller(config=c).as_dict()
    )
    return IdleCuller(**json.loads(service["environment"]["GPUPOOL_CULLER_CONFIG"]))


def train_side(c: Config) -> tuple[float, tuple[str, str, str]]:
    """The threshold and sampler of train jobs, as the hub's set-up hands them to the training
    service (setup.start_training)."""
    util_pct, culler = culler_gpu_use(c)
    train = TrainPool(config=c)
    return train.idle_rules(util_pct)["vision"].util_pct, train.gpu_use_source(culler)


def config() -> Config:
    c = Config()
    c.TrainPool.projects = {"vision": {"guarantee": 1, "idle_gpu_s": 3600}}
    return c


def test_one_sampler_and_threshold_measure_workspaces_and_train_jobs() -> None:
    """Set once, in c.IdleCuller: the culler (workspaces) and the hub's train-job idle check read
    the same agents with the same token, and call the same utilization idle. Before, train jobs
    had their own copies (defaults nvml and 1 %): the z2jh overlay set only the culler's, so
    on Kubernetes no train job was ever measured."""
    c = config()
    c.IdleCuller.sampler = "node-agent"
    c.IdleCuller.sampler_arg = AGENTS
    c.IdleCuller.node_agent_token_file = TOKEN
    c.IdleCuller.util_threshold_pct = 5.0
    culler = culler_as_started(c)
    util_pct, source = train_side(c)
    assert culler.limits().util_threshold_pct == util_pct == 5.0
    workspaces = make_sampler(culler.sampler, culler.sampler_arg, culler.node_agent_token_file)
    jobs = make_sampler(*source)
    for sampler in (workspaces, jobs):
        assert isinstance(sampler, NodeAgentSampler)
        assert (sampler.urls, sampler.token_file) == (AGENTS.split(","), TOKEN)


def test_the_culling_demos_sampler_leaves_train_jobs_on_nvml() -> None:
    # `gpupool up --demo-culling`: users say what their workspace's GPU does; jobs have no such
    # switch, and the demo sampler only runs in the culler service
    c = config()
    c.IdleCuller.sampler = "demo"
    assert train_side(c)[1] == ("nvml", "", "")
    assert train_side(config()) == (1.0, ("nvml", "", ""))  # the defaults, as before


def test_the_grace_period_is_one_setting_for_local_and_kubernetes_jobs() -> None:
    """SIGTERM to SIGKILL is c.TrainPool.grace_s on both runners (the chart's jobs.graceSeconds
    sets it): the Jobs' settings take it from there and refuse a second copy."""
    c = config()
    c.TrainPool.grace_s = 120.0
    assert TrainPool(config=c).job_options().grace_s == 120
    c.TrainPool.kube_job_options = {"grace_s": 30}
    with pytest.raises(TraitError, match="unknown keys \\['grace_s'\\]"):
        TrainPool(config=c)
