"""`gpupool` command line: `up` runs the embedded hub, `accounts` lists or removes the Unix accounts
it made as root, `backup` / `restore` save and bring back its databases, `stop-jobs` ends the train
jobs a stopped hub left running, `simulate` runs the pool simulator."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

from traitlets import TraitError
from traitlets.config import Application, Config, Configurable

from gpupool.settings.config import GPUPool

HERE = os.path.dirname(os.path.abspath(__file__))  # embedded_config.py is beside it


def config_classes() -> list[type[Configurable]]:
    """Every configurable class an admin may set in a gpupool config file."""
    from gpupool.contain import Containment
    from gpupool.host.accounts import SystemAccounts
    from gpupool.parking.mover import GPUMover
    from gpupool.parking.service import GPUParking
    from gpupool.train.config import TrainPool
    from gpupool.usage.config import Usage

    classes: list[type[Configurable]] = [
        GPUPool,
        TrainPool,
        GPUParking,
        GPUMover,
        SystemAccounts,
        Usage,
        Containment,
    ]
    try:
        from gpupool.idle_culler.config import config_classes as culler_classes
    except ImportError:  # the culler is optional
        return classes
    return classes + culler_classes()


class _ConfigWriter(Application):
    name = "gpupool"
    description = "gpupool configuration"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.classes = config_classes()


def generate_config(path: str) -> None:
    """The demo's settings, active, then every option commented with its help and example; no
    path of this machine (the defaults that are one are named instead)."""
    from gpupool.wiring.embedded import demo_lines

    text = _ConfigWriter().generate_config_file()
    text = text.replace(repr(sys.executable), "(the hub's own Python)").replace(
        sys.executable, "(the hub's own Python)"
    )
    header = (
        "# gpupool configuration: every option with its help text and an example.\n"
        "# Use it with `gpupool up --config THIS_FILE`, or paste the settings into your\n"
        "# jupyterhub_config.py before `gpupool.configure(c)`.\n\n"
    )
    demo = (
        "\n# `make up`'s demo settings (as they are, this file starts the same hub as the demo):\n"
        + demo_lines()
    )
    head, marker, rest = text.partition("c = get_config()  #noqa\n")
    text = head + marker + demo + rest if marker else demo + text
    if os.path.exists(path):
        raise SystemExit(f"gpupool: {path} exists; remove it or pick another name")
    with open(path, "w") as f:
        f.write(header + text)
    print(f"wrote {path}")


def check_config(path: str) -> Config:
    """Load and validate an admin's config so a mistake stops `up` with a clear message."""
    from gpupool.wiring.embedded import load_user_config

    c = Config()
    load_user_config(c, path)
    from gpupool.wiring.setup import validate

    try:
        validate(c)
    except (TraitError, ValueError) as err:
        raise SystemExit(f"gpupool: invalid configuration in {path}: {err}") from None
    return c


def up(args: argparse.Namespace) -> int:
    if args.generate_config:
        generate_config(args.generate_config)
        return 0
    from gpupool.host.system_env import SystemEnvError, prepare_state_root

    state = os.path.abspath(args.state)
    try:
        prepare_state_root(state)
    except SystemEnvError as err:
        raise SystemExit(f"gpupool: {err}") from None
    os.makedirs(state, exist_ok=True)
    config = os.path.abspath(args.config) if args.config else ""
    checked = check_config(config)
    remember_up(state, config, args.user_env)
    from gpupool.wiring.embedded import chp_command, demo_password

    env = dict(
        os.environ,
        GPUPOOL_STATE_DIR=state,
        GPUPOOL_CONFIG=config,
        GPUPOOL_CHP=chp_command(),
        GPUPOOL_DEMO_CULLING="1" if args.demo_culling else "",
        GPUPOOL_STOP_JOBS="1" if args.stop_jobs else "",
        **port_env(args),
    )
    if not args.user_env and os.geteuid() == 0 and not os.environ.get("GPUPOOL_SPAWNER"):
        args.user_env = users_python(state)
    if args.user_env:
        env["GPUPOOL_USER_ENV"] = os.environ["GPUPOOL_USER_ENV"] = os.path.abspath(
            args.user_env
        )  # banner too
    from gpupool.host.system_env import PACKAGE_VAR

    if os.environ.get(PACKAGE_VAR):
        env[PACKAGE_VAR] = os.environ[PACKAGE_VAR]
    refuse_root_without_accounts(state)
    check_user_env(state)
    password, admin_password = demo_password(state), demo_password(state, admin=True)
    argv = [sys.executable, "-m", "jupyterhub", "-f", os.path.join(HERE, "embedded_config.py")]
    hub = subprocess.Popen(argv, env=env, cwd=state)
    # the hub's own start-up log comes first; the log-in banner last, once the hub answers
    signal.signal(signal.SIGTERM, lambda *_: hub.send_signal(signal.SIGTERM))
    try:
        if wait_until_up(f"http://127.0.0.1:{args.port}/hub/api/", hub):
            print(
                banner(
                    args.port,
                    password,
                    admin_password,
                    state,
                    args.demo_culling,
                    containment_note(checked, state),
                    checked,  # the admin's --config: its culling limits win over the demo's
                ),
                flush=True,
            )
        return hub.wait()
    except KeyboardInterrupt:  # Ctrl-C reached the hub too (same terminal): let it shut down
        return hub.wait()


def users_python(state: str) -> str:
    """As root, users run as accounts of their own, which must be able to run the users' Python
    and every file of gpupool a workspace or job reads: the hub's installation may sit in a private
    folder (a clone in root's home, mode 0700). So, as TLJH does, the users' environment is
    installed under /opt/gpupool/<install key> (gpupool.host.system_env), root's and read-only to
    them, and workspaces and jobs take everything from there."""
    from gpupool.host.system_env import PACKAGE_VAR, SystemEnvError, ensure

    try:
        folder = ensure()
    except SystemEnvError as err:
        raise SystemExit(f"gpupool: users cannot be isolated: {err}; pass --user-env") from None
    os.environ[PACKAGE_VAR] = users_package(folder)
    return str(folder / "env")


def users_package(folder: str | os.PathLike[str]) -> str:
    """The gpupool package of the users' environment in `folder` (its job wrapper among its files)."""
    return os.path.join(folder, "site-packages", "gpupool")


UP_ARGS = "up-args.json"  # in the state folder: what the last `gpupool up` ran with


def remember_up(state: str, config: str, user_env: str) -> None:
    """The --config and --user-env of this `gpupool up`, for `gpupool stop-jobs` on the same
    state: without them it read another hub's settings (accounts, GPUs, grace period)."""
    data = json.dumps({"config": config, "user_env": os.path.abspath(user_env) if user_env else ""})
    tmp = os.path.join(state, f".{UP_ARGS}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(data)
    os.replace(tmp, os.path.join(state, UP_ARGS))


def remembered_up(state: str) -> dict[str, str]:
    """What `remember_up` kept for `state` ({} when nothing, or nothing readable, is there)."""
    try:
        fd = os.open(os.path.join(state, UP_ARGS), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return {}
    with os.fdopen(fd) as f:
        try:
            data = json.loads(f.read(64 * 1024))
        except ValueError:
            return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if k in ("config", "user_env") and isinstance(v, str)}


def jobs_wrapper_as_up(user_env: str) -> None:
    """The runner knows a job's run by its wrapper's path (gpupool.runners.local.is_run): the one
    of the users' environment `gpupool up` made as root (users_python), found here without
    building it, before gpupool.runners.local is imported. Otherwise the runs of a root hub would
    look ended, and a job be requeued while it runs on."""
    from gpupool.host.system_env import PACKAGE_VAR, ROOT, install_key

    if user_env or os.geteuid() != 0 or os.environ.get("GPUPOOL_SPAWNER") or os.environ.get(PACKAGE_VAR):
        return
    os.environ[PACKAGE_VAR] = users_package(os.path.join(ROOT, install_key()))


def refuse_root_without_accounts(state: str) -> None:
    """A root hub that cannot give users accounts of their own would run every workspace as
    root: it does not start, and says why (an admin who wants one shared account chooses a
    spawner with GPUPOOL_SPAWNER)."""
    from gpupool.wiring.embedded import isolation

    mode, why = isolation(state)
    if os.geteuid() == 0 and mode != "accounts" and not os.environ.get("GPUPOOL_SPAWNER"):
        raise SystemExit(f"gpupool: will not run workspaces as root: {why}")


def check_user_env(state: str) -> None:
    """A hub whose users run as their own accounts starts their servers with the users' Python:
    one without JupyterLab or gpupool's extensions would answer /user/<name>/lab with a 404 after a
    spawn that seemed to work. Said now, with what is missing, instead."""
    from gpupool.host.user_env import missing_jupyter
    from gpupool.wiring.embedded import isolation, user_python

    if isolation(state)[0] != "accounts":
        return
    missing = missing_jupyter(user_python())
    if missing:
        raise SystemExit(
            f"gpupool: workspaces would start without {', '.join(missing)}: the users' Python"
            f" {user_python()} does not find them. Install gpupool (it brings JupyterLab) in that"
            " environment, or leave --user-env out to let `gpupool up` make one"
        )


def banner(
    port: int,
    password: str,
    admin_password: str,
    state: str,
    demo_culling: bool = False,
    contained: str = "",
    user_config: Config | None = None,
) -> str:
    from gpupool.wiring.embedded import demo_culling_note, isolation

    return (
        f"\ngpupool: embedded hub ready on http://127.0.0.1:{port}\n"
        f"  log in with any user name and the password: {password}\n"
        f"  as 'admin' (an admin) with the password: {admin_password}\n"
        f"  (both are kept in {state}: demo-password, demo-admin-password)\n"
        f"  {accounts_note(os.geteuid(), *isolation(state))}\n"
        + (f"  {contained}\n" if contained else "")
        + (f"  {demo_culling_note(user_config)}\n" if demo_culling else "")
    )


def containment_note(c: Config, state: str) -> str:
    """Said at start: whether jobs and workspaces run in cgroups of their own (the hub's own finding,
    with the same settings: its database names the cgroups)."""
    from gpupool.contain import Containment, WorkloadCgroups, detect, hub_key

    db_url = c.GPUPool.db_url if "db_url" in c.GPUPool else f"sqlite:///{state}/gpupool.sqlite"
    opts = Containment(config=c)
    tree = detect(opts.mode, hub_key(db_url), devices=opts.devices)
    cgroups = WorkloadCgroups(tree, "", policy=opts.policy())
    first = cgroups.describe().replace(f" ({tree.root})", "") if tree.available else cgroups.describe()
    # each limit, enforced or not and why (said, never silent)
    return "\n  ".join([first, *(f"  {line}" for line in cgroups.describe_limits())])


def wait_until_up(url: str, hub: subprocess.Popen[bytes], timeout: float = 300) -> bool:
    """Poll the hub's API until it answers; False if the hub exited (its log says why)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and hub.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return True
        except (OSError, urllib.error.URLError):
            time.sleep(0.5)
    return False


PORTS = {  # option -> (environment variable read by embedded_config.py, default, what listens)
    "port": ("GPUPOOL_PORT", 8000, "public port: the proxy users open"),
    "hub_port": ("GPUPOOL_HUB_PORT", 8081, "the hub's own port (behind the proxy)"),
    "proxy_api_port": ("GPUPOOL_PROXY_API_PORT", 8001, "configurable-http-proxy's REST API"),
    "api_port": ("GPUPOOL_API_PORT", 8095, "the gpupool REST API (a hub service)"),
}


def port_env(args: argparse.Namespace) -> dict[str, str]:
    return {var: str(getattr(args, opt)) for opt, (var, _, _) in PORTS.items()}


def accounts_note(euid: int, mode: str = "shared", reason: str = "") -> str:
    """Said plainly at start-up: whose Unix account workspaces and jobs run as."""
    from gpupool.wiring.embedded import ACCOUNT_PREFIX

    if mode == "accounts":
        return (
            f"each user runs as a Unix account of their own ({ACCOUNT_PREFIX}<name>, made on first use,"
            " home readable only by it): users cannot read each other's files (docs/security.md)"
        )
    if euid != 0:
        return (
            "workspaces and jobs run as this account: users share it and can read each other's files"
            " (run as root for an account per user; see docs/security.md)"
        )
    return (
        f"running as root, but users are NOT isolated: workspaces run as root ({reason});"
        " see docs/security.md"
    )


def _port(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"not a port number (1-65535): {text[:20]!r}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["simulate"]:
        from gpupool.sim.cli import main as simulate

        return simulate(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "up":
        return up(args)
    if args.command in ("backup", "restore"):
        return backup_or_restore(args)
    if args.command == "stop-jobs":
        return stop_jobs(args)
    if args.command == "accounts":
        from gpupool.host.account_cleanup import main as accounts

        return accounts(args.state, args.remove, args.kill)
    return 2


def stop_jobs(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gpupool.wiring.stop_jobs import StopJobsError
    from gpupool.wiring.stop_jobs import stop_jobs as end_them

    config = os.path.abspath(args.config) if args.config else ""
    user_env = args.user_env
    last = remembered_up(os.path.abspath(args.state))
    if not config and last.get("config"):
        config = last["config"]
        print(f"gpupool: the config the last `gpupool up` on this state ran with: {config}", flush=True)
    if not user_env and last.get("user_env"):
        user_env = last["user_env"]
    jobs_wrapper_as_up(user_env)
    try:
        lines = end_them(Path(args.state).absolute(), config)
    except StopJobsError as err:
        print(f"gpupool: stop-jobs: {err}", file=sys.stderr)
        return 1
    for line in lines:
        print(f"gpupool: {line}", flush=True)
    return 0


def backup_or_restore(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gpupool.host.backup import BackupError, backup, restore

    state, folder = Path(args.state).absolute(), Path(args.folder).absolute()
    try:
        if args.command == "backup":
            made = backup(state, folder)
            print(
                f"gpupool: backed up {', '.join(made['files'])} of {state} (instance {made['instance']})"
                f" to {folder}"
            )
        else:
            for line in restore(folder, state):
                print(f"gpupool: {line}")
            print("gpupool: restored; start the hub again (`gpupool up`)")
    except (BackupError, OSError) as err:
        print(f"gpupool: {args.command} failed: {err}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    from gpupool.host.system_env import default_state

    parser = argparse.ArgumentParser(prog="gpupool", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="run the embedded hub on this machine")
    p_up.add_argument("--config", default="", help="a gpupool config file (c.GPUPool... settings)")
    p_up.add_argument(
        "--generate-config",
        nargs="?",
        const="gpupool_config.py",
        default="",
        metavar="FILE",
        help="write a commented config file and exit",
    )
    p_up.add_argument(
        "--state",
        default=default_state(),
        help="folder for databases and homes (default ./state; as root, when the accounts cannot reach"
        " ./state, /var/lib/gpupool/<install key>/state)",
    )
    p_up.add_argument(
        "--stop-jobs",
        action="store_true",
        help="end the running train jobs when the hub stops (they resume from their checkpoints at"
        " the next start); without it they keep running and the next start adopts them"
        " (c.TrainPool.stop_jobs_at_stop)",
    )
    p_up.add_argument(
        "--demo-culling",
        action="store_true",
        help="try the idle culler and GPU parking in minutes without a GPU: short limits, and GPU"
        " use is what users say (%%gpupool gpu busy / idle) (README: Try culling and parking)",
    )
    p_up.add_argument(
        "--user-env",
        default=os.environ.get("GPUPOOL_USER_ENV", ""),
        metavar="FOLDER",
        help="the Python environment (a venv with jupyterhub and jupyterlab) workspaces and jobs"
        " run in; default: the hub's own, or $GPUPOOL_USER_ENV. As root it must be one every"
        " account can run",
    )
    for opt, (var, default, what) in PORTS.items():
        p_up.add_argument(
            f"--{opt.replace('_', '-')}",
            type=_port,
            default=os.environ.get(var, str(default)),
            help=f"{what} (default {default}, or ${var})",
        )
    p_acc = sub.add_parser(
        "accounts",
        help="list (or remove) the Unix accounts `gpupool up` made as root",
        description="The Unix accounts a root `gpupool up` made for its hub users: those whose"
        " comment says `gpupool user <name>` and whose home is in the state folder."
        " `make clean` removes them.",
    )
    p_acc.add_argument("--state", default=default_state(), help="the hub's state folder (default: as `up`'s)")
    p_acc.add_argument(
        "--remove", action="store_true", help="userdel them, with their homes (the hub must be stopped)"
    )
    p_acc.add_argument("--kill", action="store_true", help="with --remove: kill their processes first")
    p_stop = sub.add_parser(
        "stop-jobs",
        help="end the train jobs a stopped hub left running (they go back to the queue)",
        description="After a stop without --stop-jobs, train jobs run on as their users' accounts"
        " and the next start adopts them. This ends them now, as `gpupool up --stop-jobs` does at a"
        " stop: SIGTERM, SIGKILL after c.TrainPool.grace_s, each job back in the queue. Refused"
        " while a hub runs on the state folder.",
    )
    p_stop.add_argument(
        "--state", default=default_state(), help="the hub's state folder (default: as `up`'s)"
    )
    p_stop.add_argument(
        "--config",
        default="",
        help="the config file the hub ran with (default: the last `up --config` on --state)",
    )
    p_stop.add_argument(
        "--user-env",
        default=os.environ.get("GPUPOOL_USER_ENV", ""),
        metavar="FOLDER",
        help="the --user-env the hub ran with, if any",
    )
    sub.add_parser("simulate", help="run the pool simulator (gpupool simulate --help)")
    p_backup = sub.add_parser(
        "backup", help="copy the hub's databases into a new folder (safe while it runs)"
    )
    p_restore = sub.add_parser(
        "restore",
        help="put a backup's databases back (the hub must be stopped; the files replaced are kept aside)",
    )
    for p in (p_backup, p_restore):
        p.add_argument("--state", default=default_state(), help="the hub's state folder (default: as `up`'s)")
        p.add_argument("folder", help="the backup folder")
    return parser


if __name__ == "__main__":
    sys.exit(main())
