"""A real hub against what users can send it: no token reaches the log, a made-up Authorization
header does not switch off the XSRF check of a cookie-authenticated call, a profile name a user
makes up gets no culler override, and a full disk is named in the error.
"""

from __future__ import annotations

import http.cookiejar
import json
import secrets
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.hubtools import PASSWORD, Hub
from tests.support.disk import small_disk

pytestmark = pytest.mark.hub
J = "/services/gpupool/api/jobs"
CONFIG = """
c.TrainPool.tick_s = 0.3
c.TrainPool.projects = {"lab": {"guarantee": 1}}
c.IdleCuller.max_age_s = 3600
c.IdleCuller.profile_overrides = {"long": {"max_age_s": 30 * 86400}}
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> Hub:
    from tests.conftest import require_chp

    require_chp()
    h = Hub(state=tmp_path_factory.mktemp("safety"), extra_config=CONFIG).start()  # with the culler
    yield h
    h.stop()


def test_tokens_in_urls_and_headers_never_reach_the_log(hub: Hub) -> None:
    secret = secrets.token_hex(16)
    for path in (
        f"/services/gpupool/api/me?token={secret}",
        f"/services/gpupool/api/jobs?x=1&token={secret}",
        f"/hub/api/users?token={secret}",
    ):
        req = urllib.request.Request(hub.url + path, headers={"Authorization": f"token {secret}x"})
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(req, timeout=30)
    hub.api("GET", "/services/gpupool/api/pool")  # a request after them: their lines are written
    log = hub.log_path.read_text()
    assert "[secret]" in log  # the lines are there, the tokens are not
    assert secret not in log


def browser_session(hub: Hub, user: str) -> urllib.request.OpenerDirector:
    """Logged in through the hub's form, then through OAuth into the gpupool service, as a browser."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    opener.open(f"{hub.url}/hub/login", timeout=30).read()
    xsrf = next(c.value for c in jar if c.name == "_xsrf")
    form = urllib.parse.urlencode({"username": user, "password": PASSWORD, "_xsrf": xsrf}).encode()
    opener.open(f"{hub.url}/hub/login?next=/hub/home", data=form, timeout=60).read()
    opener.open(
        f"{hub.url}/services/gpupool/", timeout=60
    ).read()  # the OAuth dance sets the service's cookie
    assert any(c.name.startswith("gpupool") or "services" in (c.path or "") for c in jar), [
        c.name for c in jar
    ]
    return opener


def test_a_made_up_authorization_header_does_not_skip_the_xsrf_check(hub: Hub) -> None:
    opener = browser_session(hub, "xena")
    body = json.dumps({"project": "lab", "gpus": 1, "command": ["true"]}).encode()
    req = urllib.request.Request(
        f"{hub.url}{J}",
        data=body,
        method="POST",
        headers={"Authorization": "token made-up", "Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        opener.open(req, timeout=30)
    assert err.value.code == 403
    assert hub.api("GET", J, token=hub.user_token("xena"))["jobs"] == []  # nothing was submitted
    me = json.loads(opener.open(f"{hub.url}/services/gpupool/api/me", timeout=30).read())
    assert me["name"] == "xena"  # the cookie itself works for reading


def test_a_profile_name_a_user_makes_up_gets_no_culler_override(hub: Hub) -> None:
    hub.api("POST", "/hub/api/users/pia")
    hub.api("POST", "/hub/api/users/pia/server", {"gpus": 0.25, "profile": "long"})
    hub.wait_ready("pia")
    token = hub.user_token("pia")
    [mine] = hub.api("GET", "/services/gpupool/api/culler/status", token=token)["workspaces"]
    [target] = [
        t for t in hub.api("GET", "/services/gpupool/api/culler/targets")["workspaces"] if t["owner"] == "pia"
    ]
    started = time.time()
    assert target["profile"] == ""  # the local spawner offers no profiles
    assert mine["cull_at"] - started < 3600 + 60, mine  # the default hour, not the 30 days of "long"
    hub.stop_server("pia")


def test_a_full_disk_is_named_in_the_error(make_hub, tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "48m") as disk:
        hub: Hub = make_hub(
            CONFIG.replace("c.IdleCuller", "# c.IdleCuller")
            + f"c.GPUPool.db_url = 'sqlite:///{disk}/gpupool.sqlite'\n"
            # a 48 MiB disk is under the default free-space reserve from the start: this test is
            # about the disk that fills anyway (the reserve has its own test in test_hub_stop)
            + "c.GPUPool.min_free_disk_mib = 0\n"
            f"c.TrainPool.jobs_root = '{disk}/jobs/{{username}}'\n",
            env={"GPUPOOL_CULLER": "0"},
        )
        hub.start()
        token = hub.user_token("dora")
        waiting = hub.api(
            "POST", J, {"project": "lab", "gpus": 0.5, "command": ["sleep", "1000"]}, token=token
        )
        filler = disk / "filler"
        with open(filler, "wb") as f:  # the disk fills up
            try:
                while True:
                    f.write(b"\0" * (1 << 20))
                    f.flush()
            except OSError:
                pass
        status, message = hub.api_error(
            "POST", J, {"project": "lab", "gpus": 1, "script": "print(1)"}, token=token
        )
        assert status == 507 and "disk is full" in message, (status, message)
        status, message = hub.api_error("DELETE", f"{J}/{waiting['id']}", token=token)
        assert status == 507 and "disk is full" in message, (status, message)
        status, message = hub.api_error("POST", "/hub/api/users/dora/server", {"gpus": 0.25})
        assert status == 507 and "disk is full" in message, (status, message)
        filler.unlink()  # room again: everything works
        hub.api("DELETE", f"{J}/{waiting['id']}", token=token)
        hub.stop()
