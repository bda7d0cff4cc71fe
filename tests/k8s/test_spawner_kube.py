"""GPUKubeSpawner's choices that need no API server: the workspace's KAI queue and the spawn
form. (They were cluster tests that made no API call; spawning for real is tests/cluster.)
kubespawner reads a kubeconfig when it is made: one that names a server nobody listens on."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from traitlets import TraitError

from gpupool.gpu.sharing import Claim, PodGPU, SharingBackend
from gpupool.spawner.form import parse_choice
from tests.k8s.test_pod_fit import GPU_TAINT, restricted_violations

SHARED = "nvidia.com/gpu.shared"

PROFILES = [
    {"display_name": "CPU only", "slug": "cpu"},
    {"display_name": "Quarter GPU", "slug": "quarter", "gpupool": {"gpus": 0.25}, "default": True},
]


@pytest.fixture
def offline_spawner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., object]]:
    from jupyterhub import orm
    from kubernetes_asyncio.config import kube_config
    from kubespawner import clients
    from traitlets.config import Config

    from gpupool.spawner.kube import GPUKubeSpawner
    from gpupool.wiring.root import ROOT_KEY, GPUPoolHub

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "none",
                "clusters": [{"name": "none", "cluster": {"server": "https://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {"token": "x"}}],
                "contexts": [{"name": "none", "context": {"cluster": "none", "user": "u"}}],
            }
        )
    )
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    clients.load_config.cache_clear()
    roots: list[GPUPoolHub] = []  # one hub: built from the first spawner's config, as a hub does once

    def make(
        groups: tuple[str, ...] = ("students",),
        sections: dict[str, dict] | None = None,
        user_name: str = "ann",
        **settings,
    ) -> GPUKubeSpawner:
        c = Config()
        for section, options in (sections or {}).items():  # other classes' options (c.GPUPool...)
            for key, value in options.items():
                setattr(c[section], key, value)
        c.GPUPool.db_url = f"sqlite:///{tmp_path}/gpupool.sqlite"
        c.GPUPool.use_nvml = False
        c.GPUPool.virtual_gpus = 2
        c.GPUPool.default_build_quota = 0.5
        c.GPUPool.allowed_fractions = [0.25, 0.5, 1]
        for key, value in settings.items():
            setattr(c.GPUKubeSpawner, key, value)
        if not roots:
            roots.append(GPUPoolHub(c))
        user = SimpleNamespace(
            name=user_name,
            id=7,
            url=f"/user/{user_name}/",
            escaped_name=user_name,
            groups=[SimpleNamespace(name=g) for g in groups],
            settings={ROOT_KEY: roots[0]},  # JupyterHub's User.settings: the hub's tornado settings
        )
        hub = SimpleNamespace(
            public_host="", url="http://hub:8081/hub/", base_url="/hub/", api_url="http://hub:8081/hub/api"
        )
        return GPUKubeSpawner(user=user, hub=hub, config=c, orm_spawner=orm.Spawner(name=""))

    yield make
    clients.load_config.cache_clear()
    for root in roots:
        root.close()


async def test_the_workspace_queue_is_the_first_listed_group_the_user_is_in(offline_spawner) -> None:
    listed = ["vision", "nlp"]  # the order of preference, not the alphabet
    q = {"kai_queue": "{group}", "kai_queue_groups": listed}
    assert offline_spawner(groups=("admins", "nlp", "vision"), **q).queue_name() == "vision"
    assert offline_spawner(groups=("nlp", "admins"), **q).queue_name() == "nlp"
    assert offline_spawner(groups=("admins",), **q).queue_name() == "default"  # no queue of its own
    # the chart's build.defaultProject for users in none of the groups; on a node pool (a KAI
    # shard) the project's queue in that pool
    one = offline_spawner(groups=("admins",), kai_default_group="cs101", **q)
    assert (one.queue_name(), one.queue_name("ws")) == ("cs101", "cs101-ws")


async def test_any_user_gets_a_namespace_named_by_kubespawner_that_is_a_dns_label(
    offline_spawner, tmp_path: Path
) -> None:
    """The chart's user-namespace config, as the hub loads it: kubespawner's own slug of a user
    name that is no DNS label ("Ada.Lovelace@Uni": capitals, a dot, an at sign) makes the
    namespace, under the longest prefix the chart admits; the policy the hub makes there names
    it. Before, a prefix of up to 30 characters made names over 63 for long user names."""
    import json
    import re

    from traitlets.config import Config

    from gpupool.kube.chart_config import load_chart_config
    from gpupool.spawner.kube_namespace import workspace_policy
    from tests.k8s.conftest import REPO
    from tests.k8s.test_chart import hub_config, render

    schema = json.loads((REPO / "helm/gpupool/values.schema.json").read_text())
    pattern = schema["properties"]["userNamespaces"]["properties"]["prefix"]["pattern"]
    prefix = "p" * int(re.search(r"\{0,(\d+)\}", pattern)[1])  # the longest the chart admits
    c = Config()
    load_chart_config(
        c, hub_config(render({"userNamespaces": {"enabled": True, "prefix": prefix}}), tmp_path)
    )
    dns_label = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
    sections = {"KubeSpawner": dict(c.KubeSpawner)}
    settings = dict(c.GPUKubeSpawner)
    names = set()
    for user in ("Ada.Lovelace@Uni", "ada.lovelace@uni", "x" * 200 + "@Uni", "ann"):
        ws = offline_spawner(sections=sections, user_name=user, **settings)
        assert ws.namespace.startswith(prefix) and dns_label.match(ws.namespace), (user, ws.namespace)
        names.add(ws.namespace)
        policy = workspace_policy(ws.namespace, ws.user_namespace_network_policy)
        assert policy["metadata"]["namespace"] == ws.namespace
    assert len(names) == 4  # no two users share one (the slug adds a hash where it changed the name)
    assert f"{prefix}ann" in names  # a name that is a DNS label already is kept as it is


async def test_the_form_is_ours_without_profiles_kubespawners_with_them_and_the_admins_if_set(
    offline_spawner,
) -> None:
    gpu = offline_spawner()
    assert "0.25" in await gpu.get_options_form()
    assert parse_choice(gpu.run_options_from_form({"gpus": ["0.5"]})).milli == 500  # the form posts GPUs

    with_profiles = offline_spawner(profile_list=PROFILES)
    assert "Quarter GPU" in await with_profiles.get_options_form()
    assert with_profiles.run_options_from_form({"profile": ["quarter"]}) == {"profile": "quarter"}

    admins = offline_spawner(options_form="<p>our own form</p>")
    assert await admins.get_options_form() == "<p>our own form</p>"


async def test_one_sharing_backend_and_node_pool_label_drive_workspaces_and_train_jobs(
    offline_spawner,
) -> None:
    """c.GPUPool.gpu_sharing and c.GPUPool.node_pool_label, set once, shape both the workspace
    pod (the spawner) and the train Job (TrainPool); before, each side had its own copy, and a
    cluster set up through one of them ran the other side on the default."""
    from gpupool.train.config import TrainPool

    one = {"gpu_sharing": "hami", "node_pool_label": "gpupool.io/node-pool"}
    ws = offline_spawner(sections={"GPUPool": one, "TrainPool": {"node_pools": {"lab": {}}}})
    assert ws.backend().name == "hami"
    terms = ws.pools_affinity({}, ["lab"])["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["key"] == "gpupool.io/node-pool"
    train = TrainPool(config=ws.config)
    assert (train.sharing(), train.job_options().node_pool_label) == ("hami", "gpupool.io/node-pool")
    # and a second copy cannot be made: the train side refuses a label or tolerations of its own
    # (a cluster set up through it would have run workspaces on the default)
    for key, value in [("node_pool_label", "example.org/pool"), ("gpu_tolerations", [])]:
        with pytest.raises(TraitError, match=f"unknown keys \\['{key}'\\]"):
            TrainPool(kube_job_options={key: value})


class QuarterReplicas(SharingBackend):
    """A site's backend: time-sliced replicas (`nvidia.com/gpu.shared`), a quarter GPU each."""

    name = "quarters"

    def fraction(self, out: PodGPU, num_gpu: int, gpu_milli: int, memory_mib: int) -> None:
        out.limits[SHARED] = str(num_gpu)

    def read_fraction(self, asked: Mapping[str, str], memory_mib: int) -> Claim:
        return Claim(int(asked.get(SHARED, 0)) * 250, frozenset({SHARED}) & frozenset(asked))


def final_pod(limits: dict[str, str]) -> dict:
    return {"metadata": {}, "spec": {"containers": [{"name": "notebook", "resources": {"limits": limits}}]}}


async def test_the_quota_check_reads_a_plugged_in_backends_pods_and_never_counts_a_gpu_as_0(
    offline_spawner,
) -> None:
    """A profile or hook that adds GPU in a way the hub did not reserve is refused: through the
    site's own backend, a device plugin's GPU or a GPU resource no backend reads (before, all
    three read as 0 GPU and the pod started)."""
    from tornado import web

    ws = offline_spawner(sections={"GPUPool": {"gpu_sharing": f"{__name__}.QuarterReplicas"}})
    assert ws.gpupool_allocation is None  # a CPU-only workspace: no GPU reserved
    ws.enforce_quota(final_pod({"cpu": "1"}))
    for limits, status, reason in [
        ({SHARED: "2"}, 403, "asks for 0.5 GPU but your quota allowed 0"),
        ({"amd.com/gpu": "1"}, 403, "asks for 1 GPU"),
        ({"nvidia.com/gpumem": "8000"}, 400, "nvidia.com/gpumem without nvidia.com/gpu: HAMi"),
        ({"example.com/gpu-slice": "1"}, 400, "example.com/gpu-slice is a GPU resource no sharing backend"),
    ]:
        with pytest.raises(web.HTTPError, match=reason) as err:
            ws.enforce_quota(final_pod(limits))
        assert err.value.status_code == status


async def test_an_admins_pod_hook_sync_or_async_runs_before_the_quota_check(offline_spawner) -> None:
    """kubespawner awaits modify_pod_hook and a callable profile_list whether sync or async;
    the quota check wraps the hook and sees the pod it returns."""
    from tornado import web

    def add_gpu(spawner: object, pod: dict) -> dict:
        pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1"
        return pod

    async def add_gpu_later(spawner: object, pod: dict) -> dict:
        return add_gpu(spawner, pod)

    for hook in (add_gpu, add_gpu_later):
        ws = offline_spawner(modify_pod_hook=hook)
        with pytest.raises(web.HTTPError, match="asks for 1 GPU but your quota allowed 0"):
            await ws.modify_pod_hook(ws, final_pod({"cpu": "1"}))
    ws = offline_spawner()  # no admin hook: the check alone, the pod unchanged
    assert await ws.modify_pod_hook(ws, final_pod({"cpu": "1"})) == final_pod({"cpu": "1"})

    async def profiles(spawner: object) -> list[dict]:  # an admin's profile_list may be async too
        return PROFILES

    assert "Quarter GPU" in await offline_spawner(profile_list=profiles).get_options_form()


async def test_a_fractional_workspace_tolerates_gpu_nodes_and_is_restricted(offline_spawner) -> None:
    """z2jh's own tolerations stay; the GPU one is added for a pod with a share only."""
    z2jh = {"key": "hub.jupyter.org/dedicated", "operator": "Equal", "value": "user", "effect": "NoSchedule"}
    sp = offline_spawner(
        sections={"KubeSpawner": {"tolerations": [z2jh], "uid": 1000}}, kai_queue_quota_check=False
    )
    sp.user_options = {"gpus": "0.25"}
    await sp.reserve_share()
    pod = sp.api.api_client.sanitize_for_serialization(await sp.get_pod_manifest())
    assert pod["metadata"]["annotations"]["gpu-fraction"] == "0.25"
    assert pod["spec"]["tolerations"] == [z2jh, GPU_TAINT]
    assert restricted_violations(pod["spec"]) == []
    assert pod["spec"]["automountServiceAccountToken"] is False
    cpu = offline_spawner(sections={"KubeSpawner": {"tolerations": [z2jh]}}, profile_list=PROFILES)
    cpu.user_options = {"profile": "cpu"}
    assert await cpu.reserve_share() is None  # a CPU-only profile holds no share
    assert cpu.api.api_client.sanitize_for_serialization(await cpu.get_pod_manifest())["spec"][
        "tolerations"
    ] == [z2jh]


async def test_a_spawns_options_are_parsed_once_and_anew_only_when_changed(
    offline_spawner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The form's parser, JupyterHub's apply_user_options check, the reservation and the pod's
    node pools read one parsed choice; options changed after it (a pre_spawn_hook) are followed."""
    from gpupool.spawner import mixin

    parsed: list[object] = []
    real = mixin.parse_choice
    monkeypatch.setattr(
        mixin, "parse_choice", lambda options, **kw: parsed.append(options) or real(options, **kw)
    )
    sp = offline_spawner(kai_queue_quota_check=False)
    sp.user_options = sp.run_options_from_form({"gpus": ["0.25"]})  # as JupyterHub's spawn does
    sp.apply_user_options(sp, sp.user_options)
    await sp.reserve_share()
    await sp.get_pod_manifest()
    assert sp.gpupool_allocation.gpu_milli == 250
    assert parsed == [{"gpus": "0.25"}]
    sp.release_gpus("the test starts it again")
    sp.user_options["gpus"] = "0.5"  # an admin's pre_spawn_hook may edit them in place
    await sp.reserve_share()
    assert sp.gpupool_allocation.gpu_milli == 500
    assert len(parsed) == 2


async def test_a_hibernating_workspace_pod_wakes_through_the_hook_and_keeps_its_state_on_the_claim(
    offline_spawner,
) -> None:
    """The chart's workspaces.hibernateStartupDir (c.GPUKubeSpawner.hibernate_startup_dir) on the
    pod kubespawner makes: the wake hook first on the notebook's PYTHONPATH (the image's own path
    after it), and saves allowed only where the home is the user's claim (z2jh's storage)."""
    from gpupool.gpu.hibernate import ENV_REFUSED

    hook = "/opt/conda/lib/python3.12/site-packages/gpupool/gpu/startup"
    image_path = {"environment": {"PYTHONPATH": "/opt/site"}}
    storage = {  # z2jh's singleuser.storage: the user's claim mounted at the home
        **image_path,
        "volumes": [{"name": "home", "persistentVolumeClaim": {"claimName": "claim-{username}"}}],
        "volume_mounts": [{"name": "home", "mountPath": "/home/jovyan"}],
    }

    async def manifest(kube: dict, **settings: object) -> dict:
        sp = offline_spawner(sections={"KubeSpawner": kube}, kai_queue_quota_check=False, **settings)
        sp.user_options = {"gpus": "0.25"}
        await sp.reserve_share()
        pod = sp.api.api_client.sanitize_for_serialization(await sp.get_pod_manifest())
        sp.release_gpus("the test read its pod")  # the next manifest reserves again
        return pod

    def env_of(pod: dict) -> dict[str, str]:
        return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}

    on = {"hibernate_startup_dir": hook, "hibernate_home": "/home/jovyan"}
    pod = await manifest(storage, **on)
    assert env_of(pod)["PYTHONPATH"] == f"{hook}:/opt/site"  # the hook wakes the kernel first
    assert ENV_REFUSED not in env_of(pod)  # the state is on the claim: it outlives the pod
    assert {"name": "home", "mountPath": "/home/jovyan"} in pod["spec"]["containers"][0]["volumeMounts"]
    claim = {"name": "home", "persistentVolumeClaim": {"claimName": "claim-ann"}}
    assert claim in pod["spec"]["volumes"]
    # a home on the pod's own disk: the hook is there, but saves are refused with the reason
    # (the state would go with the pod)
    lost = env_of(await manifest(image_path, **on))
    assert lost["PYTHONPATH"] == f"{hook}:/opt/site" and "pod's own disk" in lost[ENV_REFUSED]
    # no startup dir: no hook, the image's path as it was
    off = env_of(await manifest(storage))
    assert off["PYTHONPATH"] == "/opt/site" and ENV_REFUSED not in off


async def test_the_pinned_kubespawner_starts_gpupools_trimmed_pod_and_event_reflectors(
    offline_spawner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GPUKubeSpawner swaps kubespawner's reflector classes through kubespawner's private
    `_start_reflector` (no public hook chooses them): a kubespawner that stops calling it, or
    passes the class another way, makes the hub keep whole pods again and its ready wait poll."""
    from kubespawner import KubeSpawner

    from gpupool.spawner.kube_reflector import TrimmedEventReflector, TrimmedPodReflector

    started: dict[str, type] = {}

    async def record(self, *args, **kwargs):  # kubespawner's, below GPUKubeSpawner's override
        kind = kwargs.get("kind", args[0] if args else None)
        started[kind] = kwargs.get("reflector_class", args[1] if len(args) > 1 else None)

    monkeypatch.setattr(KubeSpawner, "_start_reflector", record)
    sp = offline_spawner()
    await sp._start_watching_pods()
    await sp._start_watching_events()
    assert started == {"pods": TrimmedPodReflector, "events": TrimmedEventReflector}
