"""Build workspaces come first: a size that fits once train jobs borrowing idle GPUs are
preempted is offered on the spawn form, which says so, and the spawn makes that room. Before,
the form showed such a size "no room in the pool now", disabled, though the hub would have
reclaimed the GPUs for it."""

from __future__ import annotations

import re
import threading

import pytest

from tests.hubtools import PASSWORD, Hub, WebUser, progress_messages

pytestmark = pytest.mark.hub
J = "/services/gpupool/api/jobs"
CONFIG = """
c.TrainPool.tick_s = 0.3
c.TrainPool.grace_s = 2
c.TrainPool.projects = {"research": {"guarantee": 2}}
"""
STUBBORN = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(600)"


def size_option(html: str, value: str) -> str:
    found = re.search(
        rf'<div class="radio"><label><input type="radio" name="gpus" value="{value}"[^>]*>.*?</label>',
        html,
        re.S,
    )
    assert found, html
    return found.group(0)


def test_the_form_offers_what_preempting_borrowers_frees_and_says_so(make_hub) -> None:
    hub: Hub = make_hub(CONFIG, env={"GPUPOOL_CULLER": "0"}).start()
    token = hub.user_token("tom")
    jobs = [
        hub.api(
            "POST",
            J,
            # each takes its whole grace period to stop, as a job that saves a checkpoint would
            {"project": "research", "gpus": 2, "name": f"big{i}", "script": STUBBORN},
            token=token,
        )
        for i in range(2)
    ]
    for job in jobs:  # 2 GPUs within the guarantee, 2 borrowed: the 4 virtual GPUs are all taken
        hub.wait_job(job["id"], {"running"}, token)

    ula = WebUser(hub.url, "ula")
    ula.log_in(PASSWORD)
    _, _, form = ula.get("/hub/spawn/ula")
    one = size_option(form, "1")
    assert "disabled" not in one, one
    assert "starting it stops 1 train job borrowing idle GPUs, as build workspaces come first" in one
    assert "starting it stops 1 train job" in size_option(form, "0.25")  # no GPU has a free quarter either

    # the spawn page says what it waits for: the job preempted for it and about how long it takes
    landed: list[str] = []
    spawn = threading.Thread(target=lambda: landed.append(ula.spawn("1")))
    spawn.start()
    said = progress_messages(hub, "ula")
    spawn.join()
    assert landed and landed[0].startswith(f"{hub.url}/user/ula/lab"), landed
    waits = [m for m in said if m.startswith("Making room for 1 GPU: preempting job ")]
    assert waits, said
    named = re.fullmatch(
        r"Making room for 1 GPU: preempting job (\w+) of project research, ~[12] s", waits[0]
    )
    assert named and named.group(1) in {j["id"] for j in jobs}, waits
    states = sorted(hub.api("GET", f"{J}/{j['id']}", token=token)["state"] for j in jobs)
    assert states in (["queued", "running"], ["preempting", "running"]), states
    [share] = [s for s in hub.allocations() if s["owner"] == "ula"]
    assert share["milli"] == 1000
