"""The chart renders offline (helm-python-sdk), lints strictly, and every manifest validates:
core kinds against the Kubernetes OpenAPI schemas (kubernetes-validate, strict), KAI and
Kueue resources against their CRDs. Bad values are refused by values.schema.json."""

from __future__ import annotations

from pathlib import Path

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from traitlets import TraitError
from traitlets.config import Config

from gpupool.kube.chart_config import ChartConfigError, load_chart_config
from gpupool.settings.config import GPUPool
from gpupool.train.config import TrainPool
from tests.k8s.conftest import REPO

CHART = REPO / "helm" / "gpupool"
K8S = kubernetes_validate.latest_version()
EXAMPLES = [None, REPO / "helm/examples/research-3-projects.yaml", REPO / "helm/examples/teaching-lab.yaml"]


def render(values: dict | None, hooks: bool = False) -> list[dict]:
    """The manifests `helm install` applies (NOTES.txt is text, not a manifest; the `helm test`
    hook's objects only with `hooks`)."""
    out = helm.Chart.load(str(CHART)).render(values, name="gpupool", namespace="gpupool")
    docs = [
        d
        for name, text in out.items()
        if not name.endswith("NOTES.txt")
        for d in yaml.safe_load_all(text)
        if d
    ]
    return [d for d in docs if hooks or "helm.sh/hook" not in (d["metadata"].get("annotations") or {})]


def notes(values: dict | None) -> str:
    """What `helm install` prints after installing (templates/NOTES.txt)."""
    out = helm.Chart.load(str(CHART)).render(values, name="gpupool", namespace="gpupool")
    return next(text for name, text in out.items() if name.endswith("NOTES.txt"))


def crd_schema(schemas: Path, group: str, kind: str, version: str) -> dict:
    for f in (schemas / "crds").glob(f"{group}_*.yaml"):
        crd = yaml.safe_load(f.read_text())
        if crd["spec"]["names"]["kind"] == kind:
            return next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"][
                "openAPIV3Schema"
            ]
    raise AssertionError(f"no CRD for {group} {kind}")


def kai_module_schema(kind: str, version: str) -> dict | None:
    """A kai.scheduler CRD's schema from KAI's module in the Go module cache (there once the
    cluster tests or `make cluster` fetched it; ../shared/schemas has none of this group)."""
    try:
        from tests.cluster import kai

        folder = kai.module_dir(download=False) / "deployments" / "kai-scheduler" / "crds"
    except (OSError, RuntimeError, AttributeError, ValueError):
        return None
    for f in sorted(folder.glob("kai.scheduler_*.yaml")) if folder.is_dir() else ():
        crd = yaml.safe_load(f.read_text())
        if crd["spec"]["names"]["kind"] == kind:
            return next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"][
                "openAPIV3Schema"
            ]
    return None


def validate(doc: dict, schemas: Path) -> None:
    group, _, version = doc["apiVersion"].rpartition("/")
    if group in ("scheduling.run.ai", "kueue.x-k8s.io"):
        jsonschema.validate(doc, crd_schema(schemas, group, doc["kind"], version))
    elif group == "kai.scheduler":
        schema = kai_module_schema(doc["kind"], version)
        if schema is None:  # the real API server checks it against KAI's CRD in tests/cluster
            schema = {
                "type": "object",
                "required": ["metadata", "spec"],
                "properties": {
                    "spec": {
                        "type": "object",
                        "properties": {
                            "partitionLabelValue": {"type": "string"},
                            "args": {"type": "object", "additionalProperties": {"type": "string"}},
                        },
                    }
                },
            }
        jsonschema.validate(doc, schema)
    else:
        kubernetes_validate.validate(doc, K8S, strict=True)


@pytest.mark.parametrize("example", EXAMPLES, ids=["defaults", "research", "teaching"])
def test_every_rendered_manifest_validates(example, schemas: Path) -> None:
    values = yaml.safe_load(example.read_text()) if example else None
    docs = render(values)
    for doc in docs:
        validate(doc, schemas)
    kinds = {d["kind"] for d in docs}
    assert {"Queue", "DaemonSet", "Role", "RoleBinding", "ConfigMap"} <= kinds
    if example and "research" in example.name:
        queues = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "Queue"}
        assert queues["vision"]["parentQueue"] == "department-research"
        assert queues["vision"]["resources"]["gpu"] == {"quota": 8, "overQuotaWeight": 2, "limit": 16}
        cq = next(d for d in docs if d["kind"] == "ClusterQueue" and d["metadata"]["name"] == "nlp")
        quota = cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]
        assert (quota["nominalQuota"], quota["borrowingLimit"]) == (6, 6)
        assert cq["spec"]["preemption"]["reclaimWithinCohort"] == "Any"
    if example and "teaching" in example.name:
        assert sum(d["kind"] == "Namespace" for d in docs) == 3
        classes = {d["metadata"]["name"]: d["value"] for d in docs if d["kind"] == "PriorityClass"}
        assert classes == {"build": 100, "train": 50, "gpupool-train-high": 75}


def test_chart_lints_clean_in_strict_mode() -> None:
    report = helm.lint(str(CHART), strict=True)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize(
    "values, message",
    [
        ({"projects": {"p": {"department": "default", "guarantee": -1}}}, "guarantee"),
        ({"projects": {"p": {"department": "default", "guarantee": 1, "quota": 2}}}, "quota"),
        ({"projects": {"Bad_Name": {"department": "default", "guarantee": 1}}}, "Bad_Name"),
        ({"nodeAgent": {"port": 70000}}, "port"),
        ({"projects": {"p": {"department": "nowhere", "guarantee": 1}}}, "department nowhere"),
        (
            {
                "departments": {"default": {"quota": 4}},
                "projects": {"p": {"department": "default", "guarantee": 4, "limit": 2}},
            },
            "limit 2 is below its guarantee",
        ),
        ({"sharing": {"backend": "slurm"}}, "backend"),
        ({"build": {"quota": -0.5}}, "quota"),
        ({"departments": {"default": {"quota": -2}}}, "quota"),
        ({"jobs": {"checkpointSize": "lots"}}, "checkpointSize"),
        ({"nodeAgent": {"hostNetwork": True}}, "hostNetwork"),
        # a password in the ConfigMap: readable by whoever reads config, not a Secret
        ({"database": {"url": "postgresql+psycopg://gpupool:hunter2@db/gpupool"}}, "url"),
        ({"database": {"url": "mysql://gpupool@db/gpupool"}}, "url"),
    ],
)
def test_bad_values_are_refused_with_the_key_named(values: dict, message: str) -> None:
    with pytest.raises(helm.HelmError) as err:
        helm.Chart.load(str(CHART)).render(values, name="gpupool", namespace="gpupool")
    assert message in str(err.value)


def hub_config(docs: list[dict], folder: Path) -> Path:
    """The chart's ConfigMap's hub-config.json, written where the z2jh hub mounts it."""
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    assert cm["metadata"]["namespace"] == "jupyterhub"  # where the z2jh hub mounts it
    path = folder / "hub-config.json"
    path.write_text(cm["data"]["hub-config.json"])
    return path


def merged(base: dict, over: dict) -> dict:
    """Helm's merge of a values file over the chart's defaults."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merged(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


def test_z2jh_overlay_fits_the_upstream_chart_schema(schemas: Path) -> None:
    overlay = yaml.safe_load((REPO / "helm" / "z2jh-values.yaml").read_text())
    defaults = yaml.safe_load((schemas / "z2jh" / "values.yaml").read_text())
    schema = yaml.safe_load((schemas / "z2jh" / "values.schema.yaml").read_text())
    jsonschema.validate(merged(defaults, overlay), schema)
    with pytest.raises(jsonschema.ValidationError):  # the schema does catch a wrong key
        jsonschema.validate(merged(defaults, {"hub": {"extraConfigs": {}}}), schema)
    assert "gpupool-kubernetes" in overlay["hub"]["extraConfig"]["gpupool"]


def test_the_hub_reads_projects_quotas_and_backend_from_the_charts_configmap(tmp_path: Path) -> None:
    values = yaml.safe_load((REPO / "helm/examples/research-3-projects.yaml").read_text())
    values["projects"]["nlp"]["minRuntime"] = "1h30m"  # KAI's queue has it; the hub's forecast of KAI too
    c = Config()
    load_chart_config(c, hub_config(render(values), tmp_path))
    assert TrainPool(config=c).job_options().queue_min_runtime == {"nlp": "1h30m"}
    projects = TrainPool(config=c).project_table()
    assert (
        projects["vision"].guarantee_milli,
        projects["vision"].limit_milli,
        projects["vision"].weight,
    ) == (8000, 16000, 2.0)
    assert projects["robotics"].priority == 110 and projects["nlp"].department == "research"
    assert TrainPool(config=c).department_table()["research"].limit_milli == -1  # limit -1: none
    limits = GPUPool(config=c).quota_policy().limits_for([])
    assert limits.quota_milli == 1000 and limits.sizes_milli == (250, 500, 1000)
    assert c.GPUPool.gpu_sharing == "kai" and "gpu_sharing" not in c.GPUKubeSpawner  # once, for both sides
    # its own projects only (before, the chart's default project merged into every install's);
    # users in none of their groups: the example's build.defaultProject
    assert c.GPUKubeSpawner.kai_queue_groups == ["nlp", "robotics", "vision"]  # no build.queues
    assert c.GPUKubeSpawner.kai_default_group == "nlp" and set(projects) == {"nlp", "robotics", "vision"}
    train = TrainPool(config=c)  # train jobs become Jobs there, with the chart's image and claim size
    assert train.runner == "kubernetes" and train.image == values.get("jobs", {}).get("image", "")
    opts = train.job_options()
    assert (opts.namespace, opts.queue, opts.kueue, opts.checkpoint_size, opts.storage_class) == (
        "jupyterhub",
        "{project}",
        True,
        "10Gi",
        None,
    )
    assert (opts.grace_s, opts.high_priority_class, opts.kai_namespace) == (
        60,
        "gpupool-train-high",
        "kai-scheduler",
    )
    assert train.sharing() == "kai"


def test_gpupools_database_is_the_charts_value_or_sqlite_beside_the_hubs(tmp_path: Path) -> None:
    url = "postgresql+psycopg://gpupool@postgres.db.svc:5432/gpupool"
    c = Config()
    load_chart_config(c, hub_config(render({"database": {"url": url}}), tmp_path))
    assert GPUPool(config=c).db_url == url  # the password: libpq's PGPASSWORD (z2jh sets it)
    c = Config()
    load_chart_config(c, hub_config(render(None), tmp_path))
    assert "db_url" not in c.GPUPool and GPUPool(config=c).db_url == "sqlite:///gpupool.sqlite"


def test_the_chart_renders_traitlets_config_with_one_name_per_setting(tmp_path: Path) -> None:
    """hub-config.json is traitlets config as jupyterhub_config.py would set it: every key a
    configurable class, every key under it one of that class's options (no second vocabulary
    for Python to translate); the chart's values arrive on their traits as written; and a value
    that the chart's schema lets through but an option refuses stops the hub's read of it with
    the option's own words, as in a config file."""
    from kubespawner import KubeSpawner

    from gpupool.idle_culler.config import IdleCuller
    from gpupool.spawner.kube import GPUKubeSpawner

    values = {
        "departments": {"lab": {"quota": 2, "limit": 3}},
        "projects": {
            "cs101": {"department": "lab", "guarantee": 2, "pools": ["ws"]},
            "guests": {"department": "lab", "guarantee": 0, "limit": 0},  # borrows nothing
        },
        "nodePools": {"ws": {"nodes": ["ws-1"], "models": []}},
        "build": {
            "quota": 0.5,
            "fractions": [0.25, 0.5],
            "maxWorkspaces": 1,
            "groupOverrides": {"staff": {"quota": 2, "fractions": [1, 2], "max_per_workspace": 2}},
            "queues": ["cs101"],
            "defaultProject": "guests",
        },
        "sharing": {"backend": "hami", "fractionByMemory": True},
        "jobs": {
            "graceSeconds": 120,
            "storageClass": "fast",
            "maxLogMiB": 20,
            "logsDir": "/srv/logs",
            "maxFolderMiB": 2048,
        },
        "userNamespaces": {"enabled": True, "prefix": "lab-"},
        "nodeAgent": {"port": 9500},
    }
    path = hub_config(render(values), tmp_path)
    import json

    classes = {
        "GPUPool": GPUPool,
        "TrainPool": TrainPool,
        "GPUKubeSpawner": GPUKubeSpawner,
        "KubeSpawner": KubeSpawner,
        "IdleCuller": IdleCuller,
    }
    raw = json.loads(path.read_text())
    assert set(raw) == set(classes)
    for name, options in raw.items():
        traits = classes[name].class_traits(config=True)
        assert set(options) <= set(traits), (name, set(options) - set(traits))
    c = Config()
    load_chart_config(c, path)
    pool = GPUPool(config=c)
    policy = pool.quota_policy()
    assert (policy.default.quota_milli, policy.default.sizes_milli, policy.default.max_workspaces) == (
        500,
        (250, 500),
        1,
    )
    assert policy.limits_for(["staff"]).sizes_milli == (1000, 2000) and pool.gpu_sharing == "hami"
    train = TrainPool(config=c)
    assert train.project_table()["guests"].limit_milli == 0  # a limit of 0 is kept, not "none"
    assert (
        train.project_table()["cs101"].pools == ("ws",) and train.project_table()["cs101"].limit_milli == -1
    )
    assert train.department_table()["lab"].limit_milli == 3000
    assert train.pool_table()["ws"].nodes == frozenset({"ws-1"}) and train.grace_s == 120
    assert train.job_options().storage_class == "fast" and train.job_options().grace_s == 120
    # limits as on one machine: the kept log's size and place, the working folder's sizeLimit
    assert (train.max_log_mib, train.kube_logs_dir, train.job_options().work_size_mib) == (
        20,
        "/srv/logs",
        2048,
    )
    assert c.GPUKubeSpawner.fraction_by_memory is True and c.GPUKubeSpawner.kai_queue_groups == ["cs101"]
    assert c.KubeSpawner.user_namespace_template == "lab-{username}"
    # the culler samples this release's node agents, at the chart's port (before, the overlay
    # named 9402 and the namespace gpupool a second time)
    culler = IdleCuller(config=c)
    assert (culler.sampler, culler.sampler_arg) == (
        "node-agent",
        "http://gpupool-node-agent.gpupool:9500/pods",
    )
    assert "IdleCuller" not in json.loads(
        hub_config(render({"nodeAgent": {"enabled": False}}), tmp_path).read_text()
    )
    # the schema allows any positive sizes; GPUPool.allowed_fractions refuses a repeated one
    bad = Config()
    load_chart_config(bad, hub_config(render({"build": {"fractions": [0.5, 0.5]}}), tmp_path))
    with pytest.raises(TraitError, match=r"GPUPool.allowed_fractions: each GPU size once; repeated: \[0.5\]"):
        GPUPool(config=bad)


def test_the_hibernation_hook_reaches_the_spawner_and_a_path_that_would_break_pythonpath_is_refused(
    tmp_path: Path,
) -> None:
    """workspaces.hibernateStartupDir is c.GPUKubeSpawner.hibernate_startup_dir (hibernation on
    Kubernetes needs it); unset, the spawner keeps its default (no hook). It goes on the pod's
    PYTHONPATH: a relative path, a ":" (a second entry) or a space is refused at install."""
    from gpupool.gpu.sharing import make_backend
    from gpupool.kube.job_spec import TrainJobSpec
    from gpupool.kube.objects import train_job

    hook = "/opt/conda/lib/python3.12/site-packages/gpupool/gpu/startup"
    c = Config()
    load_chart_config(c, hub_config(render({"workspaces": {"hibernateStartupDir": hook}}), tmp_path))
    assert c.GPUKubeSpawner.hibernate_startup_dir == hook
    # train Jobs run in the workspaces' image (jobs.image empty): the same hook caps a fractional
    # job's PyTorch at its share, as in the notebook it came from (it was dropped from job pods)
    spec = TrainJobSpec(
        id="j1", owner="ada", project="default", num_gpu=1, gpu_milli=250, command=["python"], image="img"
    )
    train = TrainPool(config=c)
    job = train_job(spec, train.job_options(), make_backend(train.sharing()))
    pod = job["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in pod["env"]}
    assert env["PYTHONPATH"] == hook and env["GPUPOOL_GPU_FRACTION"] == "0.25"
    c.TrainPool.image = "registry.example.org/trainer:1"  # another image: its own path, not the workspaces'
    assert TrainPool(config=c).job_options().startup_dir == ""
    c = Config()
    load_chart_config(c, hub_config(render(None), tmp_path))
    assert "hibernate_startup_dir" not in c.GPUKubeSpawner
    for bad in ("opt/gpupool/startup", "/opt/a:/tmp/evil", "/opt/my hooks", "/" + "a" * 1024):
        with pytest.raises(helm.HelmError, match="hibernateStartupDir"):
            render({"workspaces": {"hibernateStartupDir": bad}})


def test_finished_jobs_and_their_checkpoint_claims_are_kept_for_the_charts_days(tmp_path: Path) -> None:
    """jobs.keepFinishedDays is each train Job's ttlSecondsAfterFinished (its own checkpoint
    claim is owned by the Job and goes with it): an admin bounds how long 10 GiB claims pile up."""
    from gpupool.kube.job_spec import TrainJobSpec
    from gpupool.kube.objects import train_job

    def ttl(values: dict | None) -> int:
        c = Config()
        load_chart_config(c, hub_config(render(values), tmp_path))
        opts = TrainPool(config=c).job_options()
        spec = TrainJobSpec(
            id="j1", owner="ada", project="lab", num_gpu=1, gpu_milli=1000, command=["python"], image="img"
        )
        return train_job(spec, opts)["spec"]["ttlSecondsAfterFinished"]

    assert ttl(None) == 7 * 86400
    assert ttl({"jobs": {"keepFinishedDays": 2}}) == 2 * 86400
    for bad in (-1, 366, "7"):
        with pytest.raises(helm.HelmError, match="keepFinishedDays"):
            render({"jobs": {"keepFinishedDays": bad}})


def test_the_schema_admits_what_the_hubs_options_admit_at_their_edges(tmp_path: Path) -> None:
    """An admin's values the hub accepts are not refused by the chart first: no workspaces for a
    group (0), a group's node pools; and what the hub would refuse, the schema refuses too."""
    values = {
        "nodePools": {"workstations": {"models": ["A2000"]}},
        "build": {
            "maxWorkspaces": 0,  # nobody gets one unless their group says so
            "groupOverrides": {"cs101": {"max_workspaces": 1, "pools": ["workstations"]}},
        },
    }
    c = Config()
    load_chart_config(c, hub_config(render(values), tmp_path))
    quotas = GPUPool(config=c).quota_policy()
    assert quotas.limits_for([]).max_workspaces == 0
    assert (quotas.limits_for(["cs101"]).max_workspaces, quotas.limits_for(["cs101"]).pools) == (
        1,
        ("workstations",),
    )
    for bad in (
        {"build": {"maxWorkspaces": 1001}},
        {"build": {"groupOverrides": {"cs101": {"pools": ["dgx", "dgx"]}}}},
        {"build": {"groupOverrides": {"cs101": {"pools": "workstations"}}}},
    ):
        with pytest.raises(helm.HelmError):
            render(bad)


def test_the_overlays_hub_config_runs_over_the_charts_file(tmp_path: Path) -> None:
    """helm/z2jh-values.yaml's hub.extraConfig, run as z2jh's hub runs it (with `c` its config)
    over the file the chart rendered, where the hub mounts it: the hub's quotas, its culler's
    sampler (in the culler service's environment) and its own lines after the chart's."""
    import json

    overlay = yaml.safe_load((REPO / "helm" / "z2jh-values.yaml").read_text())
    code = overlay["hub"]["extraConfig"]["gpupool"]
    assert '"/etc/gpupool/hub-config.json"' in code
    mounted = overlay["hub"]["extraVolumeMounts"][0]
    assert (mounted["name"], mounted["mountPath"]) == ("gpupool-config", "/etc/gpupool")
    url = "postgresql+psycopg://jupyterhub@postgres.db.svc/gpupool"
    values = {"build": {"quota": 0.5, "fractions": [0.25, 0.5]}, "database": {"url": url}}
    path = hub_config(render(values), tmp_path)
    c = Config()
    singleuser = overlay["singleuser"]["image"]
    c.KubeSpawner.image = (
        f"{singleuser['name']}:{singleuser['tag']}"  # z2jh's file sets it before extraConfig
    )
    exec(compile(code.replace("/etc/gpupool/hub-config.json", str(path)), "extraConfig", "exec"), {"c": c})
    assert GPUPool(config=c).quota_policy().default.quota_milli == 500
    # jobs.image left empty: train Jobs run in the workspaces' image, which has gpupool for notebook jobs
    assert TrainPool(config=c).kube_image() == f"{singleuser['name']}:{singleuser['tag']}"
    c.TrainPool.image = "registry.example.org/trainer:1"
    assert TrainPool(config=c).kube_image() == "registry.example.org/trainer:1"
    assert GPUPool(config=c).use_nvml is False  # the overlay's own line
    # the chart's database.url is gpupool's database: the overlay's SQLite is only the default
    assert GPUPool(config=c).db_url == url
    culler = next(s for s in c.JupyterHub.services if s["name"] == "gpupool-culler")
    settings = json.loads(culler["environment"]["GPUPOOL_CULLER_CONFIG"])
    assert (settings["sampler"], settings["sampler_arg"], settings["node_agent_token_file"]) == (
        "node-agent",
        "http://gpupool-node-agent.gpupool:9402/pods",
        "/etc/gpupool-agent/token",
    )


def test_an_older_charts_file_is_refused(tmp_path: Path) -> None:
    """A hub image newer than its chart finds the old values-shaped file: it stops with what
    to do, instead of starting with default quotas and no projects."""
    old = tmp_path / "gpupool.json"
    old.write_text('{"projects": {"vision": {"guarantee": 4}}, "build": {"quota": 2}}')
    with pytest.raises(
        ChartConfigError, match="rendered by an older gpupool chart; upgrade the gpupool chart"
    ):
        load_chart_config(Config(), old)


def rules_of(docs: list[dict]) -> list[tuple[str, str, dict]]:
    return [
        (d["kind"], d["metadata"].get("namespace", ""), r)
        for d in docs
        if d["kind"] in ("Role", "ClusterRole")
        for r in d["rules"]
    ]


def test_rbac_is_least_privilege_and_users_only_read_their_own_namespace() -> None:
    values = yaml.safe_load((REPO / "helm/examples/teaching-lab.yaml").read_text())
    docs = render(values)
    for kind, _ns, rule in rules_of(docs):
        assert "*" not in rule["verbs"] and "*" not in rule["resources"], (kind, rule)
        assert not {"secrets", "roles", "rolebindings"} & set(rule["resources"]), (kind, rule)
        if "nodes" in rule["resources"]:  # the GPU inventory: reading nodes, nothing else
            assert (rule["resources"], set(rule["verbs"])) == (["nodes"], {"get", "list"}), rule
        if kind == "ClusterRole":  # cluster-wide: no update; patch or delete of pods and train Jobs only
            assert set(rule["verbs"]) <= {"get", "list", "watch", "create", "delete", "patch"}
            assert not {"delete", "patch"} & set(rule["verbs"]) or rule["resources"] in (["pods"], ["jobs"])
            # a budget hold (suspend), a train pod's usage finalizer taken off
            assert "patch" not in rule["verbs"] or rule["resources"] in (["jobs"], ["pods"])
    # every kind the hub may write cluster-wide, the admission policy fences to its own and the
    # user namespaces
    vap = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicy")
    fenced = {r for rule in vap["spec"]["matchConstraints"]["resourceRules"] for r in rule["resources"]}
    written = {
        res
        for kind, _ns, rule in rules_of(docs)
        if kind == "ClusterRole" and {"create", "delete", "patch"} & set(rule["verbs"])
        for res in rule["resources"]
    }
    assert written <= fenced, written - fenced
    user_roles = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "gpupool-user"]
    assert {r["metadata"]["namespace"] for r in user_roles} == {
        "lab-student01",
        "lab-student02",
        "lab-student03",
    }
    assert all(set(rule["verbs"]) == {"get", "list", "watch"} for r in user_roles for rule in r["rules"])
    bindings = {
        (d["metadata"]["namespace"], d["subjects"][0]["name"])
        for d in docs
        if d["kind"] == "RoleBinding" and d["metadata"]["name"] == "gpupool-user"
    }
    assert bindings == {
        ("lab-student01", "student01"),
        ("lab-student02", "student02"),
        ("lab-student03", "student03"),
    }
    agent = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    assert agent["hostPID"] is True and "privileged" not in agent["containers"][0]["securityContext"]


def test_user_namespaces_work_for_whoever_logs_in(tmp_path: Path, schemas: Path) -> None:
    """No list of users: the hub's ServiceAccount may start a workspace in any user namespace
    (kubespawner creates it at the first spawn, labelled as the chart says: the Pod Security
    level, gpupool.io/user), and the API server refuses its writes anywhere else; workspaces
    there reach the hub and the API by fully qualified names (the short name `hub` resolves in
    the hub's namespace only). Before, only listed users' namespaces had the hub's RBAC."""
    values = {
        "hub": {"namespace": "jupyterhub", "serviceAccountName": "hub", "clusterDomain": "corp.example"},
        "userNamespaces": {"enabled": True, "prefix": "lab-"},
    }
    docs = render(values)
    for d in docs:
        validate(d, schemas)
    grants = [
        (rule["apiGroups"][0], res, set(rule["verbs"]))
        for d in docs
        if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "gpupool-hub-user-namespaces"
        for rule in d["rules"]
        for res in rule["resources"]
    ]
    assert ("", "pods", {"create", "delete", "get", "list", "watch", "patch"}) in grants
    assert ("", "namespaces", {"create"}) in grants
    assert ("networking.k8s.io", "networkpolicies", {"create", "get"}) in grants
    binding = next(
        d
        for d in docs
        if d["kind"] == "ClusterRoleBinding" and d["metadata"]["name"] == "gpupool-hub-user-namespaces"
    )
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "hub", "namespace": "jupyterhub"}]
    # the fence: the hub's writes only in its namespace and labelled ones, its namespaces restricted
    policy = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicy")
    assert policy["spec"]["matchConditions"][0]["expression"] == (
        'request.userInfo.username == "system:serviceaccount:jupyterhub:hub"'
    )
    rules = " ".join(v["expression"] for v in policy["spec"]["validations"])
    assert "'gpupool.io/user' in namespaceObject.metadata.labels" in rules
    assert '== "restricted"' in rules and 'startsWith("lab-")' in rules
    assert next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding")["spec"][
        "validationActions"
    ] == ["Deny"]
    c = Config()
    load_chart_config(c, hub_config(docs, tmp_path))
    assert c.KubeSpawner.user_namespace_labels == {
        "gpupool.io/user": "{username}",
        "pod-security.kubernetes.io/enforce": "restricted",
    }
    assert c.KubeSpawner.hub_connect_url == "http://hub.jupyterhub.svc.corp.example:8081"
    assert c.GPUPool.api_url == "http://hub.jupyterhub.svc.corp.example:8095/services/gpupool/"
    # the policy the hub makes in each user namespace: the chart's, with the hub's namespace
    spec = c.GPUKubeSpawner.user_namespace_network_policy
    assert spec["podSelector"] == {"matchLabels": {"component": "singleuser-server"}}
    assert "169.254.169.254/32" in spec["egress"][-1]["to"][0]["ipBlock"]["except"]
    off = render(
        {**values, "userNamespaces": {**values["userNamespaces"], "networkPolicy": {"enabled": False}}}
    )
    assert "user_namespace_network_policy" not in hub_config(off, tmp_path).read_text()
    # a baseline site says so; a prefix that, with kubespawner's 48-character slug, would pass
    # the 63 characters of a namespace is refused
    loose = render({**values, "userNamespaces": {**values["userNamespaces"], "podSecurity": "baseline"}})
    load_chart_config(c, hub_config(loose, tmp_path))
    assert c.KubeSpawner.user_namespace_labels["pod-security.kubernetes.io/enforce"] == "baseline"
    with pytest.raises(helm.HelmError, match="prefix"):
        render({**values, "userNamespaces": {"enabled": True, "prefix": "p" * 16}})


def test_a_release_gets_its_own_projects_only_and_a_default_only_when_it_names_none() -> None:
    """Helm merges values files map by map: a project in the chart's defaults would be added to
    every release's own (the teaching lab got 5 guaranteed GPUs on its 4)."""
    values = yaml.safe_load((REPO / "helm/examples/teaching-lab.yaml").read_text())
    queues = {d["metadata"]["name"]: d["spec"] for d in render(values) if d["kind"] == "Queue"}
    assert set(queues) == {"department-teaching", "cs101"}
    assert sum(q["resources"]["gpu"]["quota"] for n, q in queues.items() if "parentQueue" in q) == 4
    bare = {d["metadata"]["name"] for d in render(None) if d["kind"] == "Queue"}
    assert bare == {"department-default", "default"}  # a first install with no values still works
    assert "no projects were given" in notes(None) and "no projects were given" not in notes(values)
    with pytest.raises(helm.HelmError, match="departments are set but no projects"):
        render({"departments": {"d": {"quota": 1}}})
    two = {
        "departments": {"d": {"quota": 2}},
        "projects": {p: {"department": "d", "guarantee": 1} for p in "ab"},
    }
    with pytest.raises(helm.HelmError, match="set build.defaultProject"):
        render(two)
    cm = next(d for d in render({**two, "build": {"defaultProject": "b"}}) if d["kind"] == "ConfigMap")
    assert '"kai_default_group":"b"' in cm["data"]["hub-config.json"]


def test_operability_values_keep_policy_global_and_the_node_agents_pod() -> None:
    docs = render(
        {
            "global": {"imageRegistry": "mirror.example.org"},  # as a parent chart passes it
            "nodeAgent": {
                "imagePullSecrets": [{"name": "regcred"}],
                "runtimeClassName": "nvidia",
                "priorityClassName": "system-node-critical",
                "tolerations": [{"key": "dedicated", "operator": "Exists"}],
                "resources": {"requests": {"cpu": "50m"}, "limits": {"memory": "1Gi"}},
            },
        }
    )
    for q in (d for d in docs if d["kind"] == "Queue"):
        assert (
            q["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        )  # uninstall keeps queues in use
    pod = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}] and pod["runtimeClassName"] == "nvidia"
    assert pod["priorityClassName"] == "system-node-critical" and pod["tolerations"] == [
        {"key": "dedicated", "operator": "Exists"}
    ]
    # Helm merges maps: the default memory request stays
    assert pod["containers"][0]["resources"] == {
        "requests": {"cpu": "50m", "memory": "64Mi"},
        "limits": {"memory": "1Gi"},
    }
    # the token file is readable by the pod's fsGroup: the agent does not run as root
    assert pod["securityContext"]["fsGroup"] == 1000 and pod["volumes"][0]["secret"]["defaultMode"] == 0o440
    text = notes(None)
    assert "pod-security.kubernetes.io/enforce=privileged" in text  # hostPID needs it
    assert "oci://ghcr.io/kai-scheduler/kai-scheduler/kai-scheduler" in text and "--version v0.17.0" in text
    assert "scheduler.args.update-pod-eviction-condition=true" in text and "helm test gpupool" in text


def test_the_helm_test_hook_checks_what_was_rendered(tmp_path: Path) -> None:
    """`helm test` runs gpupool.kube.check in the hub's image with what the chart rendered (run
    for real against KAI's schedulers in tests/cluster/test_kai_real.py); node pools' shards,
    their label commands in NOTES, and the hub's user namespaces from the ConfigMap."""
    import json

    values = {
        "departments": {"r": {"quota": 4}},
        "nodePools": {"dgx": {"models": ["NVIDIA H100 80GB HBM3"]}, "ws": {"nodes": ["ws-1", "ws-2"]}},
        "projects": {"v": {"department": "r", "guarantee": {"dgx": 2, "ws": 1}}},
        "userNamespaces": {"enabled": True, "prefix": "lab-", "users": ["ann"]},
    }
    hooks = [
        d
        for d in render(values, hooks=True)
        if (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"
    ]
    pod = next(d for d in hooks if d["kind"] == "Pod")
    assert pod["spec"]["containers"][0]["command"] == ["python", "-m", "gpupool.kube.check"]
    check = json.loads(pod["spec"]["containers"][0]["env"][0]["value"])
    assert check["pools"] == ["dgx", "ws"] and {"v-dgx", "v-ws", "pool-dgx", "department-r", "v"} <= set(
        check["queues"]
    )
    assert {d["kind"] for d in hooks} == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "RoleBinding",
        "Pod",
    }
    text = notes(values)
    assert (
        "kubectl label nodes -l 'nvidia.com/gpu.product in (NVIDIA-H100-80GB-HBM3)' kai.scheduler/node-pool=dgx"
        in text
    )
    assert "kubectl label nodes ws-1 ws-2 kai.scheduler/node-pool=ws" in text
    c = Config()
    load_chart_config(c, hub_config(render(values), tmp_path))
    # the chart made lab-<user> namespaces with the hub's RBAC there: kubespawner starts pods there
    assert (
        c.KubeSpawner.enable_user_namespaces is True
        and c.KubeSpawner.user_namespace_template == "lab-{username}"
    )
    with pytest.raises(helm.HelmError, match="longer than 63 characters"):
        render(
            {
                **values,
                "projects": {"p" * 60: {"department": "r", "guarantee": {"dgx": 1}}},
                "build": {"defaultProject": "p" * 60},
            }
        )


def test_helm_uninstall_first_takes_the_usage_finalizer_off_train_pods_with_the_least_rbac() -> None:
    """`helm uninstall` runs a pre-delete hook Job (gpupool.kube.usage_finalizer in the node
    agent's small image) before the release's objects go: with the hub gone nothing else would
    take the usage finalizer off a train pod. Its account may list, get and patch pods, nothing
    else: in the hub's namespace only (a Role there), in every namespace only where jobs run in
    users' namespaces; its objects exist only while the hook runs (run for real on the real node:
    tests/cluster/test_node_real.py's uninstall)."""
    for user_namespaces, where in ((False, "jupyterhub"), (True, "*")):
        values = {"userNamespaces": {"enabled": user_namespaces}, "nodeAgent": {"image": {"tag": "9.9"}}}
        hooks = [
            d
            for d in render(values, hooks=True)
            if (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == "pre-delete"
        ]
        for d in hooks:
            assert (
                d["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
                == "before-hook-creation,hook-succeeded"
            )
        kinds = {d["kind"]: d for d in hooks}
        job = kinds.pop("Job")
        pod = job["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["command"] == ["python", "-m", "gpupool.kube.usage_finalizer"]
        assert container["image"] == "registry.example.org/gpupool-node-agent:9.9"
        assert {e["name"]: e["value"] for e in container["env"]} == {"GPUPOOL_NAMESPACES": where}
        assert pod["serviceAccountName"] == kinds.pop("ServiceAccount")["metadata"]["name"]
        role, binding = (
            (kinds.pop("ClusterRole"), kinds.pop("ClusterRoleBinding"))
            if user_namespaces
            else (kinds.pop("Role"), kinds.pop("RoleBinding"))
        )
        assert kinds == {}, kinds  # nothing more
        assert role["rules"] == [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "get", "patch"]}
        ]
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["subjects"][0]["name"] == pod["serviceAccountName"]
        if not user_namespaces:
            assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "jupyterhub"
        # the RBAC is made before the Job (lower weight), the Job waited for
        assert int(role["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(
            job["metadata"]["annotations"].get("helm.sh/hook-weight", "0")
        )
