"""Build workspaces through a real JupyterHub: spawn on a share, refusals, release."""

from __future__ import annotations

import html
import os
import signal
from pathlib import Path

import pytest

from tests.hubtools import PASSWORD, Hub, WebUser
from tests.support.wait import until

pytestmark = pytest.mark.hub


def server_env(hub: Hub, owner: str, name: str = "") -> dict[str, str]:
    """The real environment of a running single-user server process."""
    share = next(s for s in hub.allocations() if s["owner"] == owner and s["name"] == name)
    raw = Path(f"/proc/{share['pid']}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def test_spawn_on_a_fraction_sets_the_gpu_environment_and_stop_releases(hub: Hub) -> None:
    import jupyterhub

    # the hub under test is the JupyterHub this environment imports (`make test-hub55` runs
    # this file on 5.5.0, z2jh's, laid over the venv's 6.x)
    assert hub.api("GET", "/hub/api/")["version"] == jupyterhub.__version__
    hub.spawn("ada", "0.25")
    shares = [s for s in hub.allocations() if s["owner"] == "ada"]
    assert [(s["milli"], s["kind"], s["state"]) for s in shares] == [(250, "build", "running")]
    env = server_env(hub, "ada")
    assert env["CUDA_VISIBLE_DEVICES"] == str(shares[0]["gpu"])  # virtual GPUs go by index
    assert env["GPUPOOL_GPU_FRACTION"] == "0.25"
    assert env["GPUPOOL_GPU_MEMORY_MIB"] == str(16384 // 4 - 500)  # less its CUDA context
    assert env["GPUPOOL_GPU_VIRTUAL"] == "1"
    assert env["GPUPOOL_API_URL"] == f"http://127.0.0.1:{hub.api_port}/services/gpupool/"
    assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.25"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env  # no MPS daemon configured

    hub.stop_server("ada")
    assert [s for s in hub.allocations() if s["owner"] == "ada"] == []


def test_quota_refusal_says_what_to_do_and_allocates_nothing(hub: Hub) -> None:
    hub.spawn("bob", "1", server="exp1")
    before = hub.allocations()
    status, message = hub.api_error("POST", "/hub/api/users/bob/servers/exp2", {"gpus": 0.5})
    assert status == 403
    assert "your build quota is 1 GPU and server 'exp1' holds 1 GPU" in message
    assert "stop it or choose a smaller fraction" in message
    assert hub.allocations() == before
    # the refused server is not left on bob's list (the home page showed it, stopped); exp1 stays
    servers = "/hub/api/users/bob?include_stopped_servers=1"
    until(lambda: "exp2" not in hub.api("GET", servers)["servers"], "exp2 removed", detail=hub.tail)
    hub.stop_server("bob", "exp1")
    # a server that has run stays the user's when a later start of it is refused
    hub.spawn("bob", "1", server="exp3")
    status, _ = hub.api_error("POST", "/hub/api/users/bob/servers/exp1", {"gpus": 0.5})
    assert status == 403
    # the spawn form, as a browser posts it for a new named server: refused alike, and removed alike
    web = WebUser(hub.url, "bob")
    web.log_in(PASSWORD)
    web.get("/hub/spawn/bob/exp4")
    status, _, page = web.post_form("/hub/spawn/bob/exp4", {"gpus": "0.5"})
    assert status == 403 and "your build quota is 1 GPU and server 'exp3' holds 1 GPU" in html.unescape(page)
    until(lambda: "exp4" not in hub.api("GET", servers)["servers"], "exp4 removed", detail=hub.tail)
    # both refusals are in the admins' events, the form's as the REST API's
    refused = hub.api("GET", "/services/gpupool/api/events?kind=refuse")["events"]
    assert {"exp2", "exp4"} <= {e["name"] for e in refused if e["owner"] == "bob"}, refused
    hub.stop_server("bob", "exp3")  # the refused start has settled meanwhile
    listed = hub.api("GET", servers)["servers"]
    assert "exp1" in listed and "exp3" in listed and "exp2" not in listed, listed


@pytest.mark.parametrize(
    "options, expected",
    [
        ({"gpus": -1}, "more than 0 GPU"),
        ({"gpus": "lots"}, "not a GPU amount"),
        ({"gpus": 0.3}, "not an offered size"),
        ({"gpus": 0.0001}, "not a whole number of milli-GPU"),
        ({}, "say how many GPUs you want"),
        ({"gpus": 3}, "not an offered size"),
    ],
)
def test_tampered_options_get_a_400_and_change_nothing(hub: Hub, options: dict, expected: str) -> None:
    # a fresh user each time: JupyterHub reuses a user's last options when a spawn sends none
    name = f"mallory{abs(hash(repr(options))) % 10_000}"
    hub.api("POST", f"/hub/api/users/{name}")
    before = hub.allocations()
    status, message = hub.api_error("POST", f"/hub/api/users/{name}/server", options)
    assert status == 400
    assert expected in message
    assert hub.allocations() == before
    assert hub.api("GET", f"/hub/api/users/{name}")["servers"] == {}
    # refused once, by the step that parses the options (the check) or weighs them (the quota),
    # with the same words as the reply; JupyterHub's own lines about the failed start aside
    said = [
        line
        for line in hub.log_path.read_text(errors="replace").splitlines()
        if expected in line and (f"for {name}: refused: " in line or f"refused {name}: " in line)
    ]
    assert len(said) == 1, said


def test_a_server_that_dies_gives_its_share_back(hub: Hub) -> None:
    hub.spawn("cyd", "0.5")
    pid = next(s["pid"] for s in hub.allocations() if s["owner"] == "cyd")
    os.kill(pid, signal.SIGKILL)
    # the hub polls servers every second in these tests (c.Spawner.poll_interval)
    until(lambda: not any(s["owner"] == "cyd" for s in hub.allocations()), "cyd's share released", timeout=30)
    assert [s for s in hub.allocations() if s["owner"] == "cyd"] == []
    # JupyterHub forgets the server in the same poll, just after the spawner's poll answered (and
    # gave the share back): a loaded machine shows the gap, so wait for it, bounded
    until(
        lambda: hub.api("GET", "/hub/api/users/cyd")["servers"] == {},
        "the hub to forget cyd's server",
        timeout=30,
    )


def test_a_failed_start_releases_the_reservation(make_hub) -> None:
    hub: Hub = make_hub('c.Spawner.cmd = ["/nonexistent/jupyterhub-singleuser"]\n').start()
    hub.api("POST", "/hub/api/users/fay")
    status, _ = hub.api_error("POST", "/hub/api/users/fay/server", {"gpus": 0.5})
    assert status == 500  # the server could not start: not a refusal, but nothing is held
    assert hub.allocations() == []
    events = hub.api("GET", "/services/gpupool/api/events")["events"]
    assert [e["kind"] for e in events[:2]] == ["release", "allocate"]
    assert "start failed" in events[0]["message"]
