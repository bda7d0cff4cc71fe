"""Helpers for the embedded hub's config (kept out of the config file so they are testable)."""

from __future__ import annotations

import os
import secrets
import shutil
import sys

from traitlets.config import Config, PyFileConfigLoader

# What `make up`'s demo sets beyond the defaults (besides where its state lives): applied by
# embedded_config.py and written, active, at the top of `gpupool up --generate-config`.
DEMO_SETTINGS: dict[str, dict[str, object]] = {
    "GPUPool": {"virtual_gpus": 4},  # used only when NVML finds no GPU
    # "default" is open to every user (no member lists); "research" only to its members (and admins)
    "TrainPool": {
        "projects": {
            "default": {"guarantee": 2},
            "research": {"guarantee": 1, "weight": 2, "users": ["demo"], "groups": ["research"]},
        }
    },
}


# `gpupool up --demo-culling`: the idle culler and GPU parking in minutes, with no GPU. GPU use is
# what users say (%gpupool gpu busy|idle; idle unless said), sampled every 10 s: an idle GPU is
# parked after 2 min (a cell brings it back), a session is warned 4 min before its end at 8 min
# and may be extended once by 5 min. An admin's --config still overrides any of these.
DEMO_CULLING: dict[str, dict[str, object]] = {
    "IdleCuller": {
        "sampler": "demo",
        "interval_s": 10.0,
        "window_s": 10.0,
        "stale_after_s": 60.0,
        "park_after_s": 120.0,
        "max_age_s": 480.0,
        "warn_before_s": 240.0,
        "extension_s": 300.0,
        "busy_grace_s": 60.0,
        "idle_limit_s": 240.0,
        "jupyter_idle_s": 60.0,
    },
    "GPUParking": {"grant_interval_s": 2.0},
}


def demo_culling_note(user: Config | None = None) -> str:
    """What the banner says the culling demo does: its limits, with the admin's --config
    overrides of them (before, the banner said 2/4/8 min whatever --config set)."""
    said = dict(DEMO_CULLING["IdleCuller"])
    if user is not None and "IdleCuller" in user:
        said.update({k: v for k, v in user.IdleCuller.items() if k in said})

    def minutes(key: str) -> str:
        return f"{float(said[key]) / 60:g} min"  # type: ignore[arg-type]

    park = (
        f"an idle GPU is parked after {minutes('park_after_s')} (run a cell to get it back), "
        if said.get("park_after_s")
        else ""
    )
    end = float(said["max_age_s"])  # type: ignore[arg-type]
    warn = float(said["warn_before_s"])  # type: ignore[arg-type]
    ends = (
        f"sessions are warned at {max(0.0, end - warn) / 60:g} min and end at {minutes('max_age_s')}"
        f" (Extend: {minutes('extension_s')} more, once)"
        if end
        else "sessions have no time limit"
    )
    return f"culling demo: GPU use is what you say (%gpupool gpu busy / idle; idle until said): {park}{ends}"


DEMO_CULLING_NOTE = demo_culling_note()  # with the demo's own limits


def apply_demo_culling(c: Config) -> None:
    for cls, settings in DEMO_CULLING.items():
        for name, value in settings.items():
            setattr(c[cls], name, value)


def apply_demo(c: Config) -> None:
    for cls, settings in DEMO_SETTINGS.items():
        for name, value in settings.items():
            setattr(c[cls], name, value)


def demo_lines() -> str:
    return "".join(
        f"c.{cls}.{name} = {value!r}\n"
        for cls, settings in DEMO_SETTINGS.items()
        for name, value in settings.items()
    )


ACCOUNT_PREFIX = "jupyter-"  # TLJH's convention


def state_databases(c: Config, state: str) -> None:
    """The embedded hub's two databases, in its state folder. `gpupool stop-jobs` opens the same
    ones from the same place (gpupool.wiring.stop_jobs)."""
    c.JupyterHub.db_url = f"sqlite:///{state}/jupyterhub.sqlite"
    c.GPUPool.db_url = f"sqlite:///{state}/gpupool.sqlite"


def state_accounts(c: Config, state: str) -> None:
    """As root, hub user alice is the Unix account jupyter-alice, home <state>/home/jupyter-alice:
    what the hub looks accounts up by, and `gpupool stop-jobs` too (the owner of a job's files)."""
    c.SystemAccounts.prefix = ACCOUNT_PREFIX
    c.SystemAccounts.home_root = f"{state}/home"


def isolation(state: str, euid: int | None = None, spawner: str | None = None) -> tuple[str, str]:
    """How `gpupool up` keeps users apart, and why when it cannot:

    - ("accounts", ""): the hub runs as root, so each hub user gets a Unix account of their own
      (jupyter-<name>) and workspaces and jobs run as it;
    - ("shared", reason): everyone runs as the hub's account — it is not root, an admin chose
      another spawner (GPUPOOL_SPAWNER), or other accounts could not run this installation.
    """
    from gpupool.host.accounts import unreachable

    euid = os.geteuid() if euid is None else euid
    spawner = os.environ.get("GPUPOOL_SPAWNER", "") if spawner is None else spawner
    if euid != 0:
        return "shared", "the hub does not run as root, so it cannot switch accounts"
    if spawner:
        return "shared", f"the spawner {spawner!r} was chosen with GPUPOOL_SPAWNER"
    if shutil.which("useradd") is None:
        return "shared", "useradd is missing, so no account can be made"
    # the package root workspaces and jobs read (the system prefix's copy, when there is one)
    here = os.environ.get("GPUPOOL_USER_PACKAGE") or os.path.dirname(
        os.path.dirname(os.path.abspath(__file__))
    )
    why = unreachable(
        [
            user_python(),
            singleuser_command(),
            os.path.join(here, "runners", "wrap.py"),
            os.path.join(here, "gpu", "startup"),
            state,
        ]
    )
    if why:
        return "shared", (
            f"other accounts could not run the users' Python environment: {why}; point"
            " --user-env at one they can run"
        )
    return "accounts", ""


def user_python() -> str:
    """The Python workspaces and jobs run with: the one of GPUPOOL_USER_ENV (`gpupool up
    --user-env`), else the hub's own. A hub that switches accounts needs one every account can
    run: the hub's may live in a private folder (a Python built under /root)."""
    env = os.environ.get("GPUPOOL_USER_ENV")
    return os.path.join(env, "bin", "python") if env else sys.executable


def singleuser_command() -> str:
    return os.path.join(os.path.dirname(user_python()), "jupyterhub-singleuser")


def private_state(state: str) -> None:
    """The state folder of a hub with user accounts: accounts pass through it to their homes but
    cannot list it, and every file the hub makes there (databases, logs) is its own."""
    os.umask(0o077)
    os.chmod(state, 0o711)
    for name in os.listdir(state):
        path = os.path.join(state, name)
        if name.endswith((".sqlite", ".sqlite-wal", ".sqlite-shm", ".log", ".pid")) and os.path.isfile(path):
            os.chmod(path, 0o600)  # made before this hub had accounts (or by the proxy)


def demo_password(state_dir: str, admin: bool = False) -> str:
    """A random password kept in the state folder, so `gpupool up` can print it: one shared by
    every user, and a longer one for 'admin' (JupyterHub wants 32 characters for it)."""
    name, var, size = (
        ("demo-admin-password", "GPUPOOL_DEMO_ADMIN_PASSWORD", 24)
        if admin
        else ("demo-password", "GPUPOOL_DEMO_PASSWORD", 9)
    )
    path = os.path.join(state_dir, name)
    if env := os.environ.get(var):
        return env
    if not os.path.exists(path):
        os.makedirs(state_dir, exist_ok=True)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(secrets.token_urlsafe(size))
    with open(path) as f:
        return f.read().strip()


def load_user_config(c: Config, path: str) -> None:
    """Merge an admin's gpupool config file into `c`; a broken file stops the hub with
    the file and the error, not a half-configured pool."""
    if not path:
        return
    if not os.path.isfile(path):
        raise SystemExit(f"gpupool: config file not found: {path}")
    loader = PyFileConfigLoader(os.path.basename(path), os.path.dirname(os.path.abspath(path)))
    try:
        c.merge(loader.load_config())
    except Exception as err:  # noqa: BLE001 - any error in the admin's file is reported the same way
        raise SystemExit(f"gpupool: cannot load {path}: {err}") from None


def chp_command() -> str:
    """configurable-http-proxy: on PATH, or the one `make` installed in ./node_modules."""
    found = os.environ.get("GPUPOOL_CHP") or shutil.which("configurable-http-proxy")
    if found:
        return found
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for root in (os.getcwd(), repo):
        candidate = os.path.join(root, "node_modules", ".bin", "configurable-http-proxy")
        if os.access(candidate, os.X_OK):
            return candidate
    raise SystemExit(
        "gpupool: configurable-http-proxy not found: run `make up` (installs it with npm)"
        " or `npm install -g configurable-http-proxy`"
    )
