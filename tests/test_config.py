"""Admin configuration: documented, validated, and a broken file stops with a clear message."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from traitlets import TraitError
from traitlets.config import Config

from gpupool.settings.config import GPUPool
from tests.hubtools import REPO


def gpupool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpupool.wiring.cli", *args], cwd=cwd, capture_output=True, text=True
    )


def test_generate_config_writes_every_option_with_help_and_example(tmp_path: Path) -> None:
    result = gpupool("up", "--generate-config", "gp.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "gp.py").read_text()
    for option in current(GPUPool):
        assert f"c.GPUPool.{option} =" in text
    assert "c.GPUPool.group_overrides = {" in text  # the example survives into the file
    from gpupool.idle_culler.config import IdleCuller
    from gpupool.train.config import TrainPool
    from gpupool.usage.config import Usage

    for cls in (TrainPool, IdleCuller, Usage):  # the training pool, the culler and usage accounting too
        for option in current(cls):
            assert f"c.{cls.__name__}.{option} =" in text
    # each setting once: the build and train placement policies under their own names
    settings = [line.split(" = ")[0] for line in text.splitlines() if line.startswith("# c.")]
    assert len(settings) == len(set(settings))
    assert "# c.GPUPool.build_placement_policy" in settings and "# c.TrainPool.placement_policy" in settings
    # the generated file is a valid config that passes validation as it is
    c = Config()
    exec(compile(text, "gp.py", "exec"), {"c": c, "get_config": lambda: c})
    GPUPool(config=c).quota_policy()
    TrainPool(config=c).department_table()
    # ... with make up's demo settings active, and no path of this machine
    from gpupool.wiring.embedded import DEMO_SETTINGS

    for cls, settings in DEMO_SETTINGS.items():
        for name, value in settings.items():
            assert c[cls][name] == value
    assert sys.executable not in text and str(Path(__file__).resolve().parent.parent) not in text


def current(cls: type) -> list[str]:
    """A class's options."""
    return list(cls.class_own_traits(config=True))


def test_generate_config_refuses_to_overwrite(tmp_path: Path) -> None:
    (tmp_path / "gp.py").write_text("# mine\n")
    result = gpupool("up", "--generate-config", "gp.py", cwd=tmp_path)
    assert result.returncode != 0 and "exists" in result.stderr
    assert (tmp_path / "gp.py").read_text() == "# mine\n"


@pytest.mark.parametrize(
    "line, message",
    [
        ("c.GPUPool.allowed_fractions = [0.25, 1.5]", "more than one GPU but not a whole number"),
        ("c.GPUPool.group_overrides = {'students': {'quotas': 1}}", "unknown keys ['quotas']"),
        ("c.GPUPool.default_build_quota = -1", "must not be negative"),
        ("c.GPUPool.allowed_fractions = [0.00001]", "not a whole number of milli-GPU"),
        ("c.GPUPool.group_totals = {'cs101': 'many'}", "not a GPU amount"),
        ("c.GPUPool.oops(", "cannot load"),
        (
            "c.TrainPool.projects = {'vision': {'guarantee': 4, 'department': 'lab'}}\n"
            "c.TrainPool.departments = {'lab': {'guarantee': 2}}",
            "add up to 4 GPUs, more than its guarantee of 2",
        ),
        ("c.TrainPool.projects = {'vision': {'guarantee': 'lots'}}", "not a GPU amount"),
        ("c.IdleCuller.memory_resolver = 'reboot'", "memory_resolver"),
        ("c.IdleCuller.workday_end = '25:99'", "IdleCuller.workday_end: '25:99' is not a time of day"),
        ("c.IdleCuller.group_overrides = {'lab': {'idle_limit_s': 'soon'}}", "idle_limit_s must be seconds"),
    ],
)
def test_broken_config_stops_up_with_file_and_reason(tmp_path: Path, line: str, message: str) -> None:
    cfg = tmp_path / "gp.py"
    cfg.write_text(line + "\n")
    result = gpupool("up", "--config", str(cfg), "--state", str(tmp_path / "state"), cwd=tmp_path)
    assert result.returncode != 0
    assert message in result.stderr and "gp.py" in result.stderr
    assert "Traceback" not in result.stderr


def test_group_override_keys_fall_back_to_defaults() -> None:
    c = Config()
    c.GPUPool.default_build_quota = 0.5
    c.GPUPool.allowed_fractions = [0.25, 0.5]
    c.GPUPool.group_overrides = {"research": {"quota": 2, "max_per_workspace": 2, "fractions": [1, 2]}}
    policy = GPUPool(config=c).quota_policy()
    research = policy.limits_for(["research"])
    assert (research.quota_milli, research.sizes_milli, research.max_workspaces) == (2000, (1000, 2000), 2)
    assert policy.limits_for([]).sizes_milli == (250, 500)


def test_override_must_be_a_dict() -> None:
    with pytest.raises(TraitError, match="must be a dict"):
        GPUPool(group_overrides={"students": 1})


def test_configure_refuses_a_broken_project_table_while_the_hub_reads_its_config() -> None:
    from gpupool import configure

    c = Config()
    c.TrainPool.projects = {"vision": {"guarantee": 2, "limit": 1}}
    with pytest.raises(TraitError, match="need 0 <= guarantee <= limit"):
        configure(c)


def test_in_a_hub_pod_the_proxy_reaches_the_api_by_the_hub_services_name() -> None:
    """z2jh's overlay binds the API to 0.0.0.0 and names the hub Service in api_url: the proxy's
    route (the service's url) must name that Service, not the pod's hostname JupyterHub would
    put for 0.0.0.0, which no cluster DNS resolves."""
    from gpupool import configure

    c = Config()
    c.GPUPool.api_ip = "0.0.0.0"
    c.GPUPool.api_url = "http://hub:8095/services/gpupool/"
    configure(c, spawner="gpupool-kubernetes", culler=True)
    services = {s["name"]: s for s in c.JupyterHub.services}
    assert services["gpupool"]["url"] == "http://hub:8095"
    assert "--gpupool-url=http://hub:8095/services/gpupool/" in services["gpupool-culler"]["command"]
    plain = Config()  # the embedded hub: api_ip and api_port, as before
    configure(plain)
    assert {s["name"]: s for s in plain.JupyterHub.services}["gpupool"]["url"] == "http://127.0.0.1:8095"


@pytest.mark.parametrize(
    "settings, message",
    [
        (
            {"group_overrides": {"students": {"quota": -1}}},
            "GPUPool.group_overrides['students']: must not be negative, got -1",
        ),
        (
            {"group_overrides": {"students": {"fractions": [0.25, 1.5]}}},
            "GPUPool.group_overrides['students']: 1.5 is more than one GPU but not a whole number",
        ),
        (
            {"group_overrides": {"students": {"max_workspaces": "two"}}},
            "GPUPool.group_overrides['students']: must be a whole number from 0 to 1000, got 'two'",
        ),
        (
            {"group_overrides": {"students": {"pools": ["dgx", "dgx"]}}},
            "GPUPool.group_overrides['students']: pools",
        ),
        ({"group_overrides": {"cs 101!": {"quota": 1}}}, "GPUPool.group_overrides: a group name is"),
        ({"group_totals": {"cs101": "many"}}, "GPUPool.group_totals['cs101']: not a GPU amount: 'many'"),
        ({"group_totals": {"cs101": 2.5}}, "GPUPool.group_totals['cs101']: 2.5 is more than one GPU"),
        ({"build_pools": ["dgx", "dgx"]}, "GPUPool.build_pools: pools must be a list"),
        ({"default_build_quota": "lots"}, "GPUPool.default_build_quota: not a GPU amount: 'lots'"),
        ({"max_gpus_per_workspace": 1.5}, "GPUPool.max_gpus_per_workspace: 1.5 is more than one GPU"),
        ({"max_workspaces_per_user": 1001}, "GPUPool.max_workspaces_per_user: must be a whole number"),
        ({"allowed_fractions": [0.5, 0.5]}, "GPUPool.allowed_fractions: each GPU size once"),
        ({"allowed_fractions": [0, 1]}, "GPUPool.allowed_fractions: a GPU size must be more than 0"),
    ],
)
def test_each_structured_option_is_checked_where_traitlets_reads_it(settings: dict, message: str) -> None:
    """One trait type per structured option: a bad value stops the config's read itself (not a
    later quota_policy() call), names the option and the value, and the quota API's document is
    refused with the very same words."""
    from gpupool.settings.config import policy_from_document

    c = Config()
    for name, value in settings.items():
        setattr(c.GPUPool, name, value)
    with pytest.raises(TraitError) as read:
        GPUPool(config=c)
    assert message in str(read.value)
    with pytest.raises(TraitError) as api:
        policy_from_document(settings)
    assert str(api.value) == str(read.value)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"projects": {"v": {"guarantee": -1}}}, "TrainPool.projects['v']: need 0 <= guarantee <= limit"),
        (
            {"projects": {"v": {"guarantee": 1, "weight": "heavy"}}},
            "TrainPool.projects['v']: weight must be > 0, got 'heavy'",
        ),
        (
            {"projects": {"v": {"guarantee": 1, "priority": "high"}}},
            "TrainPool.projects['v']: priority must be a whole number, got 'high'",
        ),
        (
            {"projects": {"v": {"guarantee": 1, "idle_gpu_s": "soon"}}},
            "TrainPool.projects['v']: idle_gpu_s must be seconds, got 'soon'",
        ),
        (
            {"projects": {"v": {"guarantee": {"dgx": "lots"}, "pools": ["dgx"]}}},
            "TrainPool.projects['v']: guarantee['dgx']: not a GPU amount",
        ),
        ({"departments": {"d": {"guarantee": -2}}}, "TrainPool.departments['d']: the guarantee must be >= 0"),
        ({"departments": {"d": {"quota": 2}}}, "TrainPool.departments['d'] must be a dict with keys"),
        (
            {"node_pools": {"p": {"gpus": [True]}}},
            "TrainPool.node_pools['p']: models and nodes are lists of names",
        ),
        (
            {"kube_job_options": {"namespaces": "x"}},
            "TrainPool.kube_job_options: unknown keys ['namespaces']",
        ),
    ],
)
def test_each_training_table_is_checked_where_traitlets_reads_it(settings: dict, message: str) -> None:
    """The training pool's tables are trait types too: a bad entry stops the config's read with
    the option, the entry and the value named (before, most waited for the first table built
    from them, a weight or priority that is not a number ended in a bare ValueError, and a
    negative department guarantee was kept)."""
    from gpupool.train.config import TrainPool

    c = Config()
    for name, value in settings.items():
        setattr(c.TrainPool, name, value)
    with pytest.raises(TraitError) as read:
        TrainPool(config=c)
    assert message in str(read.value)


def culler_defaults_said(text: str) -> dict[str, list[float]]:
    """Every "`trait` (15 min)" / "(8 h)" / "(off by default: 0)" a page says, in seconds."""
    unit = {"s": 1, "min": 60, "h": 3600}
    said: dict[str, list[float]] = {}
    for name, value in re.findall(r"`(\w+_s)` \(([^()]*)\)", text):
        found = re.fullmatch(r"(\d+(?:\.\d+)?) (s|min|h)", value) or re.fullmatch(
            r"off by default: (0)()", value
        )
        if found:
            said.setdefault(name, []).append(float(found.group(1)) * unit.get(found.group(2), 1))
    return said


@pytest.mark.parametrize("page", ["README.md", "docs/culling.md"])
def test_the_culling_defaults_an_admin_reads_are_the_codes(page: str) -> None:
    """An admin sizing a lab reads the defaults in the README and docs/culling.md: before, the
    README said 30 min / 15 min / 4 h / 12 h while the code had 15 min / 10 min / 8 h / none."""
    from gpupool.idle_culler.config import IdleCuller

    said = culler_defaults_said((REPO / page).read_text())
    assert {"idle_limit_s", "jupyter_idle_s", "gpu_idle_hard_s", "max_age_s"} <= set(said), said
    defaults = IdleCuller()
    for name, values in said.items():
        assert IdleCuller.class_traits().get(name) is not None, f"{page} names no culler option {name}"
        assert values == [getattr(defaults, name)] * len(values), (page, name, values)


def test_the_sharing_option_names_every_backend_gpupool_has() -> None:
    """c.GPUPool.gpu_sharing's help lists the short names from gpupool.vocab (the settings import
    no back-end): the list must stay the back-ends' own names, each of which the option accepts."""
    from gpupool.gpu.sharing import BACKENDS, make_backend
    from gpupool.vocab.cluster import SHARING_BACKENDS

    assert tuple(BACKENDS) == SHARING_BACKENDS
    help_text = GPUPool.class_traits()["gpu_sharing"].help
    assert f"alike: {', '.join(SHARING_BACKENDS)}, or the import path" in help_text
    assert [make_backend(name).name for name in SHARING_BACKENDS] == list(SHARING_BACKENDS)
