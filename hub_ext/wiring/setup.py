"""One call in jupyterhub_config.py wires gpupool into a hub:

    from gpupool import configure
    configure(c)   # last, after your c.GPUPool settings

It sets the spawner, registers the `gpupool` service (the API served from this hub
process) and the culler service, grants users and their servers access to the API,
and, once the hub has started, reconciles persisted allocations with what is running.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import secrets
import urllib.parse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from traitlets.config import Config

from gpupool.hub import tasks

if TYPE_CHECKING:
    from gpupool.alloc.manager import PoolManager
    from gpupool.api.culler import SessionEnd
    from gpupool.api.services import ApiServices
    from gpupool.gpu.env_files import GPUEnvFiles
    from gpupool.hub.adapter import HubApp
    from gpupool.idle_culler.sampler import Sampler
    from gpupool.parking.mover import MoverService
    from gpupool.parking.service import ParkingService
    from gpupool.settings.config import GPUPool
    from gpupool.store.jobs import TrainJob
    from gpupool.train.backend import TrainingBackend
    from gpupool.train.service import TrainingService
    from gpupool.usage.service import UsageService
    from gpupool.wiring.root import GPUPoolHub

log = logging.getLogger("gpupool")

SERVICE = "gpupool"
CULLER = "gpupool-culler"
ACCESS = f"access:services!service={SERVICE}"
SERVICE_ROLE = "gpupool-service"


def configure(c: Config, spawner: str = "gpupool-simple", culler: bool = False) -> None:
    """Wire gpupool into the JupyterHub config `c` (the object jupyterhub_config.py gets)."""
    from gpupool.spawner.hub_parts import SpawnerRoot
    from gpupool.wiring.root import ROOT_KEY, GPUPoolHub

    # a broken quota, project or culler table stops the hub here, while it reads its config,
    # with the reason, instead of failing inside the running hub
    validate(c)
    c.JupyterHub.spawner_class = spawner
    root = GPUPoolHub(c)  # the hub side's parts, once; the hub hands it to spawners and pages
    # added to the admin's own settings, whether they assigned a dict or updated the default lazily
    for_spawners: SpawnerRoot = root  # mypy: the root gives all that spawners read of it
    c.JupyterHub.tornado_settings.update({ROOT_KEY: for_spawners})
    settings = root.settings
    token = secrets.token_hex(32)
    root.service_token = token
    api_url = _service_url(settings)
    services = [s for s in c.JupyterHub.get("services", []) if s.get("name") not in (SERVICE, CULLER)]
    services.append(
        {
            "name": SERVICE,
            "url": api_url,
            "api_token": token,
            "oauth_no_confirm": True,
            "display": True,
            "info": {"description": "GPU pool: who holds which GPU share"},
        }
    )
    roles = [
        r for r in c.JupyterHub.get("load_roles", []) if r.get("name") not in ("user", "server", SERVICE_ROLE)
    ]
    roles += [
        {"name": "user", "scopes": ["self", ACCESS]},
        {"name": "server", "scopes": ["users:activity!user", "access:servers!server", ACCESS]},
        # a named server whose first start gpupool refused is removed again (spawner/mixin.py)
        {"name": SERVICE_ROLE, "scopes": ["delete:servers"], "services": [SERVICE]},
    ]
    notes: list[str] = []  # for the hub's log, once it logs
    if culler:
        from gpupool.idle_culler.config import IdleCuller
        from gpupool.idle_culler.service import service_definition
        from gpupool.parking.support import culler_park_after

        base = c.JupyterHub.get("base_url", "/").rstrip("/")
        culler_config = IdleCuller(config=c).as_dict()
        # parking where it works, decided now: the culler service gets a number, the log says why
        culler_config["park_after_s"], note = culler_park_after(culler_config["park_after_s"], c, spawner)
        notes.append(note)
        culler_service, culler_role = service_definition(
            CULLER, f"{api_url}{base}/services/{SERVICE}/", culler_config
        )
        services.append(culler_service)
        roles.append(culler_role)
    c.JupyterHub.services = services
    c.JupyterHub.load_roles = roles
    c.Spawner.server_token_scopes = ["users:activity!user", "access:servers!server", ACCESS]
    _home_page_warnings(c, root)
    _start_in_hub(root, token, settings.api_ip, settings.api_port, culler, notes)


def _service_url(settings: GPUPool) -> str:
    """Where the proxy and the culler reach the API: the origin of `api_url` when one is set
    (in a hub pod, the hub Service's name: JupyterHub would route a service bound to 0.0.0.0
    to the pod's hostname, which no cluster DNS resolves), else api_ip and api_port."""
    if settings.api_url:
        parts = urllib.parse.urlsplit(settings.api_url)
        return f"{parts.scheme}://{parts.netloc}"
    return f"http://{settings.api_ip}:{settings.api_port}"


def validate(c: Config) -> None:
    """Build every table gpupool reads from `c`: raises TraitError/ValueError with the reason."""
    from gpupool.host.accounts import SystemAccounts
    from gpupool.settings.config import GPUPool
    from gpupool.train.config import TrainPool
    from gpupool.wiring.root import node_pools

    node_pools(c, GPUPool(config=c).quota_policy())  # the node pools the quotas name exist
    TrainPool(config=c).department_table()  # checks the projects too
    SystemAccounts(config=c)  # the account name prefix
    from gpupool.usage.config import Usage

    Usage(config=c).budget_rules()  # budgets and prices
    Usage(config=c).price_table()
    try:
        from gpupool.idle_culler.config import IdleCuller
    except ImportError:  # the culler is optional
        return
    culler = IdleCuller(config=c)
    culler.policy()
    culler.arbiter_hook()  # importable here, so in the culler's process too (same install)


def _home_page_warnings(c: Config, root: GPUPoolHub) -> None:
    """The hub's home page shows the culler's warnings (hub_ext/templates/home.html extends
    JupyterHub's own) and its "Server not running" page why the culler stopped the server
    (not_running.html); the admin's template folders, listed first, still win."""
    from pathlib import Path

    from gpupool.api.warnings import retention_for, shares_for, stopped_server, stops_for, warnings_for

    ours = str(Path(__file__).parent.parent / "templates")
    paths = list(c.JupyterHub.get("template_paths", []))
    c.JupyterHub.template_paths = [*paths, ours] if ours not in paths else paths
    base = c.JupyterHub.get("base_url", "/").rstrip("/")
    c.JupyterHub.template_vars = {
        **c.JupyterHub.get("template_vars", {}),
        "gpupool_warnings": lambda user: warnings_for(root, user, base),
        "gpupool_shares": lambda user: shares_for(root, user, base_url=base),
        "gpupool_stops": lambda user: stops_for(root, user),
        "gpupool_retention": lambda user: retention_for(root, user),
        # JupyterHub passes the viewer; "Server not running" asks about the page's own user and
        # server (an admin may look at another's): a function of those two
        "gpupool_stopped": lambda viewer: lambda user, name: stopped_server(root, user, name),
    }


def _start_in_hub(
    root: GPUPoolHub, token: str, ip: str, port: int, culler: bool = False, notes: list[str] | None = None
) -> None:
    """Schedule the API server and the start-up reconcile on the hub's event loop.

    jupyterhub_config.py is loaded inside JupyterHub.initialize(), on the running loop;
    a config loaded without one (--generate-config, tests of the config) starts nothing.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    from gpupool.hub.adapter import HubApp

    root.refuse_lost_state()  # before the hub polls any server: the share table must be this one's
    root.hold_hub_cpu()  # before the proxy starts: it is born in the hub's CPU cgroup

    async def serve() -> None:
        await _serve(root, HubApp.running(), token, ip, port, culler, notes or [])

    tasks.start(serve(), "the gpupool API and its start-up reconcile", loop)


async def _serve(
    root: GPUPoolHub, hub: HubApp, token: str, ip: str, port: int, culler: bool, notes: Sequence[str]
) -> None:
    """Start the hub-side services in the running hub, hand them to the root, serve the gpupool
    API, and once the hub answers reconcile persisted allocations with what runs."""
    from jupyterhub.services.auth import HubOAuth

    from gpupool.api import make_app
    from gpupool.api.app import body_limits
    from gpupool.api.auth import Directory
    from gpupool.api.bodies import serve
    from gpupool.api.services import ApiServices
    from gpupool.contain.follow import WorkspaceDevices
    from gpupool.hub.quiet_refusals import install as quiet_refusals
    from gpupool.hub.redact import install
    from gpupool.wiring.root import Running

    log_like_hub(hub.log)
    install(hub.log)  # no token, cookie or password in the hub's log, whoever logs it
    from gpupool.hub.stopping import at_stop

    hub.on_stop(lambda sig: at_stop(root, sig))  # from the first signal, nothing new starts
    quiet_refusals(hub.log)  # a refused spawn (budget, quota) is one line, not a traceback
    contained = root.cgroups
    if hub.cleans_up_orphans:  # processes on this machine (on Kubernetes: pods)
        (log.info if contained.available else log.warning)("containment: %s", contained.describe())
        for line in contained.describe_limits():
            (log.warning if "NOT enforced" in line else log.info)("limit %s", line)
    for note in notes:
        log.info("%s", note)
    await asyncio.sleep(0)  # initialize() has now read the whole config file
    pool = root.pool
    gpu_files = publish_gpus(hub, pool, root.settings)
    base_url = f"{hub.base_url.rstrip('/')}/services/{SERVICE}/"
    auth = HubOAuth(
        api_token=token,
        api_url=hub.api_url,
        base_url=base_url,
        hub_prefix=f"{hub.base_url.rstrip('/')}/hub/",
        oauth_client_id=f"service-{SERVICE}",
        oauth_redirect_uri=f"{base_url}oauth_callback",
        access_scopes={ACCESS},
        cache_max_age=60,
    )
    parking = start_parking(hub.config, pool)
    usage = start_usage(hub, pool, parking)
    training = await start_training(root, hub.config, usage)  # jobs over a budget held from the start
    services = ApiServices(
        pool=pool,
        directory=Directory(hub),
        training=training,
        parking=parking,
        usage=usage,
        session_end=session_end(hub.config, culler),
        hibernate_keep_days=hibernate_keep_days(hub.config, culler),
        hibernates=hibernates(hub.config),
        demo_gpu_use=demo_use(hub.config),
    )
    app = make_app(root, auth, services)
    mover = start_mover(hub.config, pool, parking, training, services)
    # from here the home page's warnings read the culler's findings in the API's settings
    # and the pool's questions (gpupool.alloc.hooks) go to these services
    devices = WorkspaceDevices(pool, contained) if gpu_files is not None and contained.available else None
    root.serving(Running(hub, services, mover, gpu_files, devices))
    if devices is not None:
        devices.follow_all()  # after interrupted moves are finished: every workspace's devices from the rows
    if gpu_files is not None:
        gpu_files.publish_all()  # after interrupted moves are finished: every file from the rows
    serve(app, body_limits(app), port, ip)  # each route's body limit: a JSON 413 before any handler runs
    log.info("gpupool API listening on http://%s:%d%s", ip, port, base_url)
    # The hub waits for this service to answer before it finishes starting, so we listen first.
    # The hub binds its own REST API only after initialize() has checked every server it had
    # running, so once that API answers, the spawners say truthfully what is running.
    await hub_answers(hub.api_url)
    released = pool.reconcile(root.is_running)
    if released:
        log.warning("reconciled after start-up: released %s", ", ".join(released))
    pool.started()
    from gpupool.admin import register

    register(hub, services, root)  # the admin page, in the hub's own look: /hub/gpupool


def publish_gpus(hub: HubApp, pool: PoolManager, settings: GPUPool) -> GPUEnvFiles | None:
    """Each workspace's current GPU, in a file its new processes read (gpupool.gpu.env_files),
    where the servers run on this machine (local spawners: their shares can move)."""
    from gpupool.gpu.env_files import GPUEnvFiles, account_gid, default_folder

    if not hub.follows_published_gpu:
        return None
    return GPUEnvFiles(
        default_folder(), pool, settings.mps_pipe_directory, account_gid(hub.config), settings.gpu_context_mib
    )


def demo_use(config: Config) -> bool:
    """Whether users say what their GPU does (the culling demo's sampler): api/demo/gpu-use."""
    from gpupool.idle_culler.config import IdleCuller

    return IdleCuller(config=config).sampler == "demo"


def session_end(config: Config, culler: bool) -> SessionEnd | None:
    """The culler's time rules, so pages show when a session ends from its spawn on (None: no culler)."""
    if not culler:
        return None
    from gpupool.idle_culler.config import IdleCuller

    return IdleCuller(config=config).session_end()


def hibernate_keep_days(config: Config, culler: bool) -> float:
    """Retention of hibernated states (the culler deletes them at a user's next hibernation): what
    the hub's record and warnings say (0: no culler, kept until woken)."""
    if not culler:
        return 0.0
    from gpupool.idle_culler.config import IdleCuller

    return float(IdleCuller(config=config).hibernate_keep_days)


def hibernates(config: Config) -> Callable[[Sequence[str], str], bool]:
    """(groups, profile) -> whether c.IdleCuller's rules hibernate such a workspace: a user's own
    "Hibernate now" is offered and accepted only there. Read from the config whether or not the
    culler runs here (GPUPOOL_CULLER=0: it may run elsewhere with the same config)."""
    from gpupool.idle_culler.config import IdleCuller

    return IdleCuller(config=config).hibernates_for()


def start_usage(hub: HubApp, pool: PoolManager, parking: ParkingService | None) -> UsageService:
    """Usage accounting (gpupool.usage): budgets checked at spawn and submit, queued jobs of users
    over budget held, the spawn form's notes, retention pruned hourly, gauges on /hub/metrics."""
    from gpupool.usage.config import Usage
    from gpupool.usage.metrics import register_metrics
    from gpupool.usage.service import UsageService

    usage = UsageService(
        pool, Usage(config=hub.config), hub.groups_of, parking=parking is not None, group_map=hub.group_map
    )

    tasks.every(3600, usage.prune, "usage retention", first_after=60)  # retried the next hour
    register_metrics(usage)
    return usage


def start_parking(config: Config, pool: PoolManager) -> ParkingService | None:
    """The parking service, and a periodic pass that gives waiting resume claims their GPU."""
    from gpupool.gpu.parking import ParkingError
    from gpupool.parking.service import build_parking

    try:
        parking = build_parking(config, pool, state_dir())
    except ParkingError as err:
        log.warning("parking is off: %s", err)
        return None

    tasks.every(parking.cfg.grant_interval_s, parking.grant, "granting resume claims")
    return parking


def start_mover(
    config: Config,
    pool: PoolManager,
    parking: ParkingService | None,
    training: TrainingBackend | None,
    services: ApiServices,
) -> MoverService | None:
    """Idle notebooks moved for the head of the queue (c.GPUMover.enabled; off by default). Moves
    a restart interrupted are finished first, before anything else may take their GPUs."""
    from gpupool.parking.mover import build_mover

    mover = build_mover(
        config,
        pool,
        parking,
        lambda: services.culler,
        training.local if training is not None else None,
    )
    if mover is None:
        return None

    tasks.every(mover.cfg.interval_s, mover.tick, "moving notebooks")
    return mover


def culler_gpu_use(config: Config) -> tuple[float, tuple[str, str, str]]:
    """What judges GPU use, set once in c.IdleCuller for workspaces and train jobs: the threshold
    (util_threshold_pct) and the sampler (sampler, sampler_arg, node_agent_token_file). Read here,
    in the wiring, because the training pool never imports the culler."""
    from gpupool.idle_culler.config import IdleCuller

    culler = IdleCuller(config=config)
    return culler.util_threshold_pct, (culler.sampler, culler.sampler_arg, culler.node_agent_token_file)


async def start_training(root: GPUPoolHub, config: Config, usage: UsageService) -> TrainingBackend:
    """The training loop: re-adopt runs that outlived a hub restart, then tick. On Kubernetes
    (c.TrainPool.runner = "kubernetes") jobs become batch/v1 Jobs and the cluster schedules them."""
    from gpupool.train.config import TrainPool

    pool = root.pool
    cfg = TrainPool(config=config)
    util_pct, gpu_use_source = culler_gpu_use(config)
    if cfg.runner == "kubernetes":
        _configure_kubespawner_clients(config)  # before anything makes a Kubernetes client
    # idle train jobs are measured by the idle culler's own samplers, where a project has idle rules
    sampler = None
    if cfg.idle_rules(util_pct):
        from gpupool.idle_culler.sampler import make_sampler

        sampler = make_sampler(*cfg.gpu_use_source(gpu_use_source))
    if cfg.runner == "kubernetes":
        from gpupool.gpu.sharing import make_backend
        from gpupool.train.kube_service import KubeTrainingService

        kube = KubeTrainingService(
            pool,
            cfg,
            await _kube_api_client(),
            make_backend(cfg.sharing()),
            util_pct,
            gpu_use=kube_job_gpu_use(sampler) if sampler is not None else None,  # per-pod samples
            holds=usage.held_jobs,
        )
        # the API answers at once; the watches catch up (and settle rows) in the background
        tasks.start(kube.start(), "following train Jobs on Kubernetes")
        # train jobs there hold no hub allocation: their GPU-hours are their pods' lifetimes
        tasks.every(cfg.usage_relist_s, kube.record_usage, "recording train pods' GPU-hours")
        tasks.every(cfg.folder_check_s, kube.remove_old_logs, "removing old train jobs' kept logs")
        training: TrainingBackend = kube
    else:
        from gpupool.train.backend import LocalTraining
        from gpupool.train.service import TrainingService

        engine = TrainingService(
            pool,
            cfg,
            cgroups=root.cgroups,
            idle_util_pct=util_pct,
            gpu_use=job_gpu_use(sampler, pool) if sampler is not None else None,
            holds=usage.held_jobs,
            groups_of=usage.groups_of,  # the hub's groups of a job's owner: their limits (gpupool.contain)
        )
        training = LocalTraining(engine)
        await training.start()
        tasks.start(_look_after_folders(engine, cfg.folder_check_s), "measuring and cleaning job folders")

    tasks.every(cfg.tick_s, training.tick, "training cycle")
    return training


async def _look_after_folders(training: TrainingService, every_s: float) -> None:
    """Running jobs' folders measured (stopped over c.TrainPool.max_job_folder_mib), finished ones
    removed after c.TrainPool.keep_finished_days: walking folders runs off the event loop."""
    import time

    while True:
        await asyncio.sleep(every_s)
        try:
            sizes = await asyncio.to_thread(training.measure_folders)
            training.stop_over_folder_limit(sizes, time.time())
            await asyncio.to_thread(training.remove_old_folders, time.time())
        except Exception:  # noqa: BLE001 - one bad pass must not stop the next
            log.exception("looking after job folders failed")


async def hub_answers(hub_api: str, every_s: float = 0.2) -> None:
    """Wait until the hub's REST API answers (its root needs no token)."""
    from tornado.httpclient import AsyncHTTPClient, HTTPClientError

    client = AsyncHTTPClient()
    for attempt in itertools.count(1):
        try:
            await client.fetch(f"{hub_api}/", request_timeout=5)
            return
        except (HTTPClientError, OSError) as err:
            if attempt % int(60 / every_s) == 0:  # once a minute
                log.warning(
                    "still waiting for the hub's API at %s to reconcile allocations: %s", hub_api, err
                )
        await asyncio.sleep(every_s)


def job_gpu_use(sampler: Sampler, pool: PoolManager) -> Callable[[list[TrainJob]], dict[str, float | None]]:
    """The idle culler's sampler over train jobs: GPU utilization per job id (None: no data).
    A job is sampled as a workspace is: its GPUs when whole, else its run's process tree."""
    from gpupool.alloc.manager import Workload
    from gpupool.idle_culler.sampler import Target
    from gpupool.vocab.kinds import WorkloadKind

    def use(rows: list[TrainJob]) -> dict[str, float | None]:
        targets = []
        for r in rows:
            alloc = pool.allocation(Workload(WorkloadKind.TRAIN, r.owner, r.id))
            gpus = pool.inventory.node(alloc.node).gpus if alloc is not None else ()
            uuids = tuple(gpus[i].uuid for i in alloc.gpus) if alloc is not None else ()
            whole = alloc is not None and alloc.gpu_milli >= 1000
            targets.append(Target(r.owner, r.id, pid=r.pid, gpu_uuids=uuids, whole_gpus=whole))
        got = sampler.sample(targets)
        return {t.name: got[t.key].util_pct if t.key in got else None for t in targets}

    return use


def kube_job_gpu_use(
    sampler: Sampler,
) -> Callable[[list[tuple[TrainJob, list[str]]]], dict[str, float | None]]:
    """The idle culler's sampler over train jobs on Kubernetes: each running pod of a job is a
    target (its uid, as the node agent reports it; key owner/job id/pod uid), and a job's
    utilization is its busiest pod's (None: no pod sampled)."""
    from gpupool.idle_culler.sampler import Target

    def use(jobs: list[tuple[TrainJob, list[str]]]) -> dict[str, float | None]:
        targets = [
            (row.id, Target(row.owner, f"{row.id}/{uid}", pod_uid=uid)) for row, uids in jobs for uid in uids
        ]
        got = sampler.sample([t for _, t in targets])
        out: dict[str, float | None] = {row.id: None for row, _ in jobs}
        for job_id, t in targets:
            if t.key in got:
                out[job_id] = max(out[job_id] or 0.0, got[t.key].util_pct)
        return out

    return use


def _configure_kubespawner_clients(config: Config) -> None:
    """Set up kubespawner's process-wide client configuration now, as KubeSpawner does when
    the first spawner is made (`kubespawner.clients.load_config`, with the spawner's own
    settings). Every kubespawner reflector, ours included, takes kubespawner's shared client
    when it is made, and that client is cached for the loop: made before the configuration it
    has no host, and every spawn after it fails ("InvalidUrlClientError: /api/v1/namespaces/...")."""
    from kubernetes_asyncio.config import ConfigException
    from kubespawner.clients import load_config

    settings = {**config.KubeSpawner, **config.GPUKubeSpawner}
    try:
        load_config(
            host=settings.get("k8s_api_host"),
            ssl_ca_cert=settings.get("k8s_api_ssl_ca_cert"),
            verify_ssl=settings.get("k8s_api_verify_ssl"),
        )
    except ConfigException as err:  # neither in a pod nor a kubeconfig: the API client says so next
        log.warning("kubespawner's client configuration could not be loaded: %s", err)


async def _kube_api_client() -> object:
    """In a pod: its service account; elsewhere: KUBECONFIG (as kubespawner does)."""
    from kubernetes_asyncio import client, config

    cfg = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=cfg)
    else:
        await config.load_kube_config(client_configuration=cfg)
    return client.ApiClient(cfg)


def log_like_hub(hub_log: logging.Logger) -> None:
    """gpupool's messages in the hub's log, with its format and level."""
    for handler in hub_log.handlers:
        log.addHandler(handler)
    log.setLevel(hub_log.level)
    log.propagate = False


def state_dir() -> str:
    return os.environ.get("GPUPOOL_STATE_DIR", os.path.abspath("state"))
