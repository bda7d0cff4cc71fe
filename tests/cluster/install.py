"""gpupool's chart and z2jh's, as the real-node tests install them with helm: their values
for the node's images and two GPUs, what the session's hand-applied chart left to clear first,
and what a failed step shows (the pods of both releases, their states and log tails)."""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

from tests.cluster.resources import Resources

HUB_NS = "jupyterhub"  # helm/z2jh-values.yaml's NetworkPolicy names the release's namespace
GPUPOOL_NS = "gpupool"
PASSWORD = "a-test-password"
REPO = Path(__file__).resolve().parents[2]
Z2JH = Path(os.environ.get("GPUPOOL_SHARED_DIR", REPO.parent / "shared")) / "charts" / "jupyterhub-4.4.0"


# gpupool's start-up hook in tests/cluster's single-user image (helm/singleuser-image on the
# python:3.12-slim stand-in: /usr/local/lib/python3.11/dist-packages)
SINGLEUSER_STARTUP = "/usr/local/lib/python3.11/dist-packages/gpupool/gpu/startup"


def image_values(ref: str) -> dict:
    name, tag = ref.rsplit(":", 1)
    return {"name": name, "tag": tag}


VISION_MIN_RUNTIME = "15s"


def gpupool_values(node_images: dict) -> dict:
    """The chart's values for the node's two GPUs: a department of 2, workspaces in `default`
    (guaranteed 1), projects nlp (guaranteed 1) and vision (guaranteed none: it borrows, and
    KAI reclaims a vision job only after its min runtime, VISION_MIN_RUNTIME: the time a test
    has to read the hub's forecast of that reclaim before KAI makes it)."""
    project = {"department": "research", "overQuotaWeight": 1, "limit": -1, "priority": 100}
    return {
        "hub": {"namespace": HUB_NS, "serviceAccountName": "hub"},
        "inventory": {"fromCluster": False},  # the node's 2 GPUs: NODE_INVENTORY
        "priorityClasses": {"create": True},  # KAI's chart would install them; KAI runs as processes here
        "departments": {"research": {"quota": 2, "overQuotaWeight": 1, "limit": -1}},
        "projects": {
            "default": {**project, "guarantee": 1},
            "nlp": {**project, "guarantee": 1},
            "vision": {**project, "guarantee": 0, "minRuntime": VISION_MIN_RUNTIME},
        },
        "build": {"quota": 0.5, "fractions": [0.25, 0.5], "maxPerWorkspace": 0.5, "maxWorkspaces": 1},
        "jobs": {"image": node_images["singleuser"][0], "checkpointSize": "1Gi", "graceSeconds": 30},
        # hibernation's wake hook, where the single-user image installs gpupool (the stand-in
        # python base is Debian's 3.11, whose pip installs to dist-packages); the state goes to
        # the user's home claim (z2jh's dynamic storage, the default StorageClass `local`)
        "workspaces": {"hibernateStartupDir": SINGLEUSER_STARTUP},
        "tests": {"image": image_values(node_images["hub"][0])},  # `helm test` needs gpupool.kube
        # the real node only: the kwok nodes carry GPU labels too, and their pods run nothing
        "nodeAgent": {
            "image": image_values(node_images["node-agent"][0]),
            "intervalSeconds": 2,
            "nodeSelector": {"kubernetes.io/hostname": "gpupool-node"},
            "virtualGpus": 2,
        },  # no driver here: the agent reports the node's pods GPU-idle
    }


# the node's 2 GPUs only, as these tests were written for: the cluster's inventory would also
# count the session's kwok nodes (their 16 GPUs, cordoned), where KAI places nothing, and the
# hub's forecast of KAI's order would see them free. Read before configure() (hub.extraConfig
# runs in the order of its keys, and configure() reads c.GPUPool when it is called: a later
# key's c.GPUPool lines are never read), with the chart's inventory.fromCluster off.
# Train pods' GPU-hours are relisted every 5 s (not 60): a test reads them on the usage page and
# in gus's budget right after the pods end. gus's budget is 0.002 GPU-h (7.2 GPU-s): a train job
# of his uses it up within seconds, and his queued one is then held until `adm` tops it up.
NODE_INVENTORY = """
c.GPUPool.virtual_gpus = 2
c.TrainPool.usage_relist_s = 5
c.Usage.budgets = {"user:gus": {"gpu_hours": 0.002, "window_days": 1}}
"""
ADMIN = "adm"  # a JupyterHub admin: tops budgets up

# cara's workspaces are culled within seconds, dora's hibernated within seconds (hibernation
# is off for everyone else, as by default)
CULLER_CONFIG = """
c.JupyterHub.load_groups = {"quick-cull": {"users": ["cara"]}, "quick-hibernate": {"users": ["dora"]}}
c.IdleCuller.interval_s = 5
c.IdleCuller.window_s = 5
_quick = {"idle_limit_s": 15, "jupyter_idle_s": 5, "warn_before_s": 5}
c.IdleCuller.group_overrides = {"quick-cull": _quick, "quick-hibernate": {**_quick, "hibernate": True}}
"""


def stock_culler_snippet() -> dict:
    """docs/culling.md's z2jh values for a stock hub's culler with gpupool's hook, read from the
    page: the test applies what an admin copies."""
    import yaml

    page = (REPO / "docs" / "culling.md").read_text()
    block = page[page.index("<!-- stock-culler-snippet") :].split("```yaml\n", 1)[1].split("```", 1)[0]
    return yaml.safe_load(block)


# the stock culler's test limits, after the snippet (z2jh runs extraConfig in the order of its
# keys): a pass every 2 s, GPU idle 6 s and Jupyter quiet 2 s cull; its own rule (cull.timeout)
# would stop any server Jupyter-silent 4 s. The node agents it asks are the test's relay of the
# real agent (gpu_use.py: the busy GPU a virtual one cannot show), at the URL the test gives.
STOCK_CULLER_TEST = """
import json
culler = next(s for s in c.JupyterHub.services if s["name"] == "jupyterhub-idle-culler")
culler["environment"]["GPUPOOL_NODE_AGENTS"] = {agents!r}
culler["environment"]["GPUPOOL_CULL_LIMITS"] = json.dumps(
    {{"idle_limit_s": 6, "jupyter_idle_s": 2, "window_s": 2}}
)
"""


def stock_culler_agents() -> str:
    """The node agents' Service as the snippet names it: "name.namespace:port"."""
    env = stock_culler_snippet()["hub"]["extraConfig"]["gpupool-culler"]
    return env.split('"GPUPOOL_NODE_AGENTS": "http://', 1)[1].split("/", 1)[0]


def with_stock_culler(values: dict, agents_url: str) -> dict:
    """`values` (the overlay over helm/z2jh-values.yaml) with the docs' snippet applied as an
    admin adds it: its maps merged, its list entries added to the install's own (helm replaces
    a list given again, so the overlay carries helm/z2jh-values.yaml's entries too), and the
    test's limits and relay after it."""
    import yaml

    base = yaml.safe_load((REPO / "helm" / "z2jh-values.yaml").read_text())
    snippet = stock_culler_snippet()
    out = merged(values, {k: v for k, v in snippet.items() if k != "hub"})
    hub = dict(snippet["hub"])
    for key in ("extraVolumes", "extraVolumeMounts"):
        out["hub"][key] = base["hub"][key] + hub.pop(key)
    out = merged(out, {"hub": hub})
    out["cull"] = {**out["cull"], "every": 2, "timeout": 4}
    out["hub"]["extraConfig"]["zz-stock-culler-test"] = STOCK_CULLER_TEST.format(agents=agents_url)
    return out


def z2jh_values(node_images: dict) -> dict:
    """Over helm/z2jh-values.yaml: the local images, the dummy authenticator, the proxy on a
    node port (no cloud load balancer here), the node's 2 GPUs, and off what needs images
    nobody built (the pre-puller, the user placeholders, the cloud metadata blocker)."""
    return {
        "hub": {
            "image": image_values(node_images["hub"][0]),
            "config": {
                "JupyterHub": {"authenticator_class": "dummy"},
                "DummyAuthenticator": {"password": PASSWORD},
                "Authenticator": {"allow_all": True, "admin_users": [ADMIN]},
            },
            # before the overlay's (configure() takes the culler's settings as they are then):
            # cara's workspaces are culled, dora's hibernated, within seconds; others' as by default
            "extraConfig": {"00-node-test": CULLER_CONFIG + NODE_INVENTORY},
        },
        "proxy": {"chp": {"image": image_values(node_images["chp"][0])}, "service": {"type": "NodePort"}},
        "singleuser": {
            "image": image_values(node_images["singleuser"][0]),
            "cloudMetadata": {"blockWithIptables": False},
            "startTimeout": 240,
        },
        "prePuller": {"hook": {"enabled": False}, "continuous": {"enabled": False}},
        "scheduling": {"userPlaceholder": {"enabled": False}},
    }


def clear_applied_chart(admin: Resources) -> None:
    """Deletes what the session's `chart` fixture applied without helm (conftest.CHART_VALUES),
    whose cluster-wide objects (queues, priority classes) a helm release cannot take over."""
    from tests.cluster.conftest import CHART_VALUES
    from tests.k8s.test_chart import render

    for doc in render(CHART_VALUES):
        with contextlib.suppress(KeyError):
            path = admin.path(
                doc["apiVersion"], doc["kind"], doc["metadata"]["name"], doc["metadata"].get("namespace", "")
            )
            admin.http.delete(path)


def clear_leftovers(admin: Resources, docs: list[dict], namespace: str = "") -> None:
    """Deletes the objects among `docs` (a release's rendered manifests) that exist without
    belonging to a helm release: what earlier tests on the session's plane applied directly
    (KAI's queues of their projects, e.g. `vision`; z2jh's NetworkPolicies, which the policy
    test applies to evaluate them), which `helm install` refuses to take over. `namespace` is
    the release's, for objects that do not name theirs."""
    for doc in docs:
        with contextlib.suppress(KeyError):
            path = admin.path(
                doc["apiVersion"],
                doc["kind"],
                doc["metadata"]["name"],
                doc["metadata"].get("namespace") or namespace,
            )
            found = admin.http.get(path)
            if found.status_code == 200 and "meta.helm.sh/release-name" not in (
                found.json().get("metadata", {}).get("annotations") or {}
            ):
                admin.http.delete(path)


def gpupool_rendered(values: dict) -> list[dict]:
    from tests.k8s.test_chart import render

    return render(values)


def z2jh_rendered(*overlays: dict, name: str = "jupyterhub", namespace: str = HUB_NS) -> list[dict]:
    """The real JupyterHub chart's manifests, rendered with helm/z2jh-values.yaml and `overlays`
    over it (z2jh's templates leave the namespace to helm)."""
    import helm_python as helm
    import yaml

    values = yaml.safe_load((REPO / "helm" / "z2jh-values.yaml").read_text())
    for overlay in overlays:
        values = merged(values, overlay)
    out = helm.Chart.load(str(Z2JH)).render(values, name=name, namespace=namespace)
    return [
        d
        for file, text in out.items()
        if not file.endswith("NOTES.txt")
        for d in yaml.safe_load_all(text)
        if d
    ]


def merged(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = (
            merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


# what a diagnosis leaves out of log tails: the test's own polling and the proxy's route checks
NOISE = re.compile(r"200 GET /hub/api/users/\w+ |GET /api/routes|200 GET /hub/api/user \(gpupool-culler")


def diagnose(admin: Resources, *namespaces: str) -> str:
    """Each pod's phase, its containers' states and their last log lines: what a failed install
    or spawn shows (kubectl get pods; kubectl logs --tail)."""
    out = []
    for ns in namespaces:
        for pod in admin.http.get(f"/api/v1/namespaces/{ns}/pods").json().get("items", []):
            name = pod["metadata"]["name"]
            states = {c["name"]: c.get("state") for c in pod.get("status", {}).get("containerStatuses") or []}
            out.append(f"--- {ns}/{name}: {pod.get('status', {}).get('phase')} {json.dumps(states)[:600]}")
            for c in pod["spec"]["containers"]:
                r = admin.http.get(
                    f"/api/v1/namespaces/{ns}/pods/{name}/log", params={"container": c["name"]}
                )
                if r.status_code != 200:
                    out.append(f"(no log: {r.status_code})")
                    continue
                lines = [line for line in r.text.splitlines() if not NOISE.search(line)]
                out.append("\n".join(lines[-60:])[-6000:])
    return "\n".join(out)


def pod_log(http, namespace: str, name: str) -> str:
    r = http.get(f"/api/v1/namespaces/{namespace}/pods/{name}/log")
    return r.text if r.status_code == 200 else f"(no log: {r.status_code} {r.text[:300]})"


def phase(admin: Resources, namespace: str, name: str) -> str:
    return ((admin.get(f"/api/v1/namespaces/{namespace}/pods/{name}") or {}).get("status") or {}).get(
        "phase", ""
    )
