"""The README's first path, as a new user walks it on a machine like CI's (root, Python in a
private folder): `make up`, log in on the hub's form, pick a GPU size on the spawn form, land in
JupyterLab — served by the user's own Unix account, with gpupool's server and lab extensions.

Before the users' environment carried Jupyter's folders, the spawn worked and
`/user/<name>/lab` answered 404 (no JupyterLab in `state/user-env`)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from tests.hubtools import PASSWORD, Hub, WebUser, page_config, uid_of, why_no_accounts

pytestmark = pytest.mark.hub
WHY_NOT = why_no_accounts()


@pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)
def test_log_in_spawn_on_the_form_and_land_in_jupyterlab_as_your_own_account(make_hub) -> None:
    hub: Hub = make_hub(account_prefix="jupyter-").start()  # make up's own account names
    name = f"newcomer{secrets.token_hex(3)}"  # accounts are real: a name no one else has
    user = WebUser(hub.url, name)
    user.log_in(PASSWORD)
    landed = user.spawn("0.25")
    assert landed.startswith(f"{hub.url}/user/{name}/lab"), landed

    status, _, html = user.get(f"/user/{name}/lab")
    assert status == 200, html[-500:]
    extensions = [e["name"] for e in page_config(html).get("federated_extensions", [])]
    assert "gpupool-lab" in extensions, extensions  # the status item and the cull warnings
    status, _, body = user.get(f"/user/{name}/gpupool/status")  # gpupool's server extension
    assert status == 200 and json.loads(body)["share"] == "0.25", body

    account = hub.account(name)
    assert account.pw_name == f"jupyter-{name}" and account.pw_uid != 0
    [share] = [s for s in hub.allocations() if s["owner"] == name]
    assert uid_of(share["pid"]) == account.pw_uid  # the server runs as the account, not as root
    assert Path(account.pw_dir).parent == hub.state / "home"
