"""JupyterHub config for `gpupool up`: the embedded, one-machine hub.

Loaded by `gpupool up`; an admin's own settings come from the file named by
--config (a gpupool config file holding `c.GPUPool...` and any `c.JupyterHub...`).
"""

import os

from gpupool import configure
from gpupool.host.accounts import make_on_login
from gpupool.host.state_lock import StateBusy, hold_state
from gpupool.wiring.embedded import (
    apply_demo,
    apply_demo_culling,
    chp_command,
    demo_password,
    isolation,
    load_user_config,
    private_state,
    singleuser_command,
    state_accounts,
    state_databases,
    user_python,
)

c = get_config()  # type: ignore[name-defined]  # noqa: F821 - provided by JupyterHub when it loads this file

state = os.environ["GPUPOOL_STATE_DIR"]
try:  # held until this hub ends: `gpupool stop-jobs` never runs beside it, nor a second hub
    STATE_LOCK = hold_state(state, "the hub")
except StateBusy as err:
    raise SystemExit(f"gpupool: not starting: {err}; wait for it to end") from None
c.JupyterHub.ip = os.environ.get("GPUPOOL_IP", "127.0.0.1")
c.JupyterHub.port = int(os.environ.get("GPUPOOL_PORT", "8000"))
c.JupyterHub.hub_port = int(os.environ.get("GPUPOOL_HUB_PORT", "8081"))
state_databases(c, state)
c.JupyterHub.cookie_secret_file = f"{state}/jupyterhub_cookie_secret"
c.ConfigurableHTTPProxy.pid_file = f"{state}/proxy.pid"
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{int(os.environ.get('GPUPOOL_PROXY_API_PORT', '8001'))}"
c.ConfigurableHTTPProxy.command = [chp_command()]
c.JupyterHub.allow_named_servers = True
c.JupyterHub.default_url = "/hub/home"

# demo log-in: any user name with one shared password; 'admin' (an admin) with its own
c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = demo_password(state)
c.SharedPasswordAuthenticator.admin_password = demo_password(state, admin=True)
c.Authenticator.allow_all = True
c.Authenticator.admin_users = {"admin"}

c.GPUPool.api_port = int(os.environ.get("GPUPOOL_API_PORT", "8095"))
c.Spawner.default_url = "/lab"
c.Spawner.cmd = [singleuser_command()]
c.TrainPool.python = user_python()

mode, _ = isolation(state)
if mode == "accounts":
    # the hub is root: hub user alice runs as the Unix account jupyter-alice, made on first use,
    # home <state>/home/jupyter-alice (0700); her jobs' folders under <state>/jobs/alice (0700)
    private_state(state)
    state_accounts(c, state)
    c.SystemAccounts.create = True
    c.Authenticator.post_auth_hook = make_on_login  # the account is made at log-in (and at spawn)
    c.TrainPool.jobs_root = f"{state}/jobs/{{username}}"
    c.TrainPool.run_as = "owner"
    spawner = "gpupool-local"
else:  # everyone shares the hub's account (`gpupool up` says so)
    c.Spawner.home_dir_template = f"{state}/home/{{username}}"
    c.TrainPool.jobs_root = f"{state}/home/{{username}}/gpupool-jobs"
    if os.getuid() == 0:
        c.Spawner.args = ["--allow-root"]
    spawner = os.environ.get("GPUPOOL_SPAWNER") or "gpupool-simple"

apply_demo(
    c
)  # virtual GPUs where NVML finds none, two training projects (gpupool.wiring.embedded.DEMO_SETTINGS)
if os.environ.get("GPUPOOL_DEMO_CULLING") == "1":  # gpupool up --demo-culling
    apply_demo_culling(c)

if os.environ.get("GPUPOOL_STOP_JOBS") == "1":  # gpupool up --stop-jobs
    c.TrainPool.stop_jobs_at_stop = True
load_user_config(c, os.environ.get("GPUPOOL_CONFIG", ""))
configure(c, spawner=spawner, culler=os.environ.get("GPUPOOL_CULLER", "1") == "1")
