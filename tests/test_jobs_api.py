"""The jobs API on a real hub: submit, watch, logs, cancel; bad input and other users' jobs."""

from __future__ import annotations

import re
import time

import pytest

from tests.hubtools import Hub
from tests.support.wait import until

pytestmark = pytest.mark.hub
J = "/services/gpupool/api/jobs"
CONFIG = """
c.TrainPool.tick_s = 0.3
c.TrainPool.grace_s = 2
c.TrainPool.max_queued_per_user = 3
c.TrainPool.projects = {"vision": {"guarantee": 1}, "nlp": {"guarantee": 1, "limit": 2},
                        "teaching": {"guarantee": 1, "department": "lab"}}
c.TrainPool.departments = {"lab": {"guarantee": 1, "limit": 1}}
"""


@pytest.fixture(scope="module")
def jobhub(tmp_path_factory) -> Hub:
    from tests.conftest import require_chp

    require_chp()
    h = Hub(state=tmp_path_factory.mktemp("jobs"), extra_config=CONFIG, env={"GPUPOOL_CULLER": "0"}).start()
    yield h
    h.cleanup()


def test_submit_run_and_read_the_log_of_a_cell(jobhub: Hub) -> None:
    token = jobhub.user_token("ada")
    job = jobhub.api(
        "POST",
        J,
        {
            "project": "vision",
            "gpus": 0.5,
            "name": "sq",
            "code": "print('sum of squares', sum(i*i for i in range(n)))",
            "parameters": {"n": 10},
        },
        token=token,
    )
    assert job["state"] == "queued" and job["gpus"] == 0.5
    done = jobhub.wait_job(job["id"], {"succeeded", "failed"}, token)
    assert done["state"] == "succeeded", done
    logs = jobhub.api("GET", f"{J}/{job['id']}/logs", token=token)
    assert "sum of squares 285" in "\n".join(logs["lines"])
    assert logs["output_notebook"].endswith("output.ipynb")
    assert jobhub.allocations() == [] or all(s["kind"] != "train" for s in jobhub.allocations())


def test_cancel_a_running_job_and_nobody_else_can_see_it(jobhub: Hub) -> None:
    token = jobhub.user_token("bea")
    job = jobhub.api(
        "POST", J, {"project": "nlp", "gpus": 1, "script": "import time\ntime.sleep(120)"}, token=token
    )
    jobhub.wait_job(job["id"], {"running"}, token)
    other = jobhub.user_token("cal")
    for method in ("GET", "DELETE"):
        status, message = jobhub.api_error(method, f"{J}/{job['id']}", token=other)
        assert status == 404 and "no job" in message
    assert job["id"] not in [j["id"] for j in jobhub.api("GET", J, token=other)["jobs"]]
    jobhub.api("DELETE", f"{J}/{job['id']}", token=token)
    done = jobhub.wait_job(job["id"], {"cancelled"}, token)
    assert re.fullmatch(r"cancelled by its owner at \d\d:\d\d", done["message"]), done["message"]
    status, message = jobhub.api_error("DELETE", f"{J}/{job['id']}", token=token)
    assert status == 409 and "already cancelled" in message


def test_an_admins_cancel_is_told_to_the_owner_and_not_called_a_preemption(jobhub: Hub) -> None:
    """The owner's monitor and log say who ended the job; before, the message was a bare
    "cancelled" and the log said "preempted ... the job goes back to the queue"."""
    from gpupool.widgets.jobs import job_row

    token = jobhub.user_token("eli")
    job = jobhub.api(
        "POST",
        J,
        {
            "project": "vision",
            "gpus": 0.5,
            "name": "long",
            "code": "import time\nprint('working', flush=True)\ntime.sleep(300)",
        },
        token=token,
    )
    until(
        lambda: "working" in "\n".join(jobhub.api("GET", f"{J}/{job['id']}/logs", token=token)["lines"]),
        "the job's first output",
        detail=jobhub.tail,
    )
    jobhub.api("DELETE", f"{J}/{job['id']}")  # the admin (the test's admin service)
    done = jobhub.wait_job(job["id"], {"cancelled"}, token)
    assert re.fullmatch(r"cancelled by test-admin at \d\d:\d\d", done["message"]), done["message"]
    assert done["message"] in job_row(done)  # what the owner's JobMonitor shows
    log = "\n".join(jobhub.api("GET", f"{J}/{job['id']}/logs", token=token)["lines"])
    assert f"--- gpupool: {done['message']}: this run stops and the job ends ---" in log
    assert "preempt" not in log and "back to the queue" not in log, log
    kinds = [
        (e["kind"], e["message"])
        for e in jobhub.api("GET", "/services/gpupool/api/events?kind=cancel")["events"]
    ]
    assert ("cancel", f"job {job['id']} of vision {done['message']}") in kinds


@pytest.mark.parametrize(
    "body, message",
    [
        ({"project": "nope", "gpus": 1, "command": "true"}, "unknown project 'nope'"),
        ({"project": "vision", "gpus": -1, "command": "true"}, "more than 0 GPU"),
        ({"project": "vision", "gpus": 0, "command": "true"}, "more than 0 GPU"),
        ({"project": "vision", "gpus": "lots", "command": "true"}, "not a GPU amount"),
        ({"project": "vision", "gpus": 64, "command": "true"}, "no node has 64 GPUs"),
        ({"project": "vision", "gpus": 1, "command": "true", "name": "../../etc"}, "name:"),
        ({"project": "vision", "gpus": 1}, "give exactly one of"),
        (
            {"project": "vision", "gpus": 1, "command": "true", "priority": "high"},
            "priority must be a number",
        ),
        ({"project": "vision", "gpus": 1, "code": "   "}, "no code to run"),
    ],
)
def test_bad_submissions_are_refused_and_change_nothing(jobhub: Hub, body: dict, message: str) -> None:
    token = jobhub.user_token("dan")
    before = jobhub.api("GET", J, token=token)["jobs"]
    status, text = jobhub.api_error("POST", J, body, token=token)
    assert status == 400 and message in text, text
    assert jobhub.api("GET", J, token=token)["jobs"] == before


def test_oversized_body_and_queue_cap(jobhub: Hub) -> None:
    token = jobhub.user_token("eli")
    status, _ = jobhub.api_error(
        "POST", J, {"project": "vision", "gpus": 1, "script": "x" * (3 * 1024 * 1024)}, token=token
    )
    assert status == 413
    status, message = jobhub.api_error(
        "POST", J, {"project": "nlp", "gpus": 4, "command": "true"}, token=token
    )
    assert status == 400 and "project nlp may use at most 2 GPUs" in message
    # nlp runs one 2-GPU job (its limit): further nlp jobs wait, and the fourth waiting one is refused
    first = jobhub.api(
        "POST", J, {"project": "nlp", "gpus": 2, "script": "import time\ntime.sleep(120)"}, token=token
    )["id"]
    jobhub.wait_job(first, {"running"}, token)
    ids = [
        jobhub.api("POST", J, {"project": "nlp", "gpus": 1, "command": "true", "name": f"w{i}"}, token=token)[
            "id"
        ]
        for i in range(3)
    ]
    status, message = jobhub.api_error(
        "POST", J, {"project": "nlp", "gpus": 1, "command": "true"}, token=token
    )
    assert status == 429 and "cancel one or wait" in message
    assert [jobhub.api("GET", f"{J}/{i}", token=token)["queue_position"] for i in ids] == [1, 2, 3]
    # the waiting ones first: cancelling the running one first let a waiting `true` start and end
    # before its own cancel came (409: already succeeded)
    for job_id in [*ids, first]:
        jobhub.api("DELETE", f"{J}/{job_id}", token=token)


def test_a_running_job_survives_a_hub_crash_and_runs_exactly_once(make_hub) -> None:
    from pathlib import Path

    hub: Hub = make_hub(CONFIG, env={"GPUPOOL_CULLER": "0"}).start()
    token = hub.user_token("kai")
    # the job ends when the test says so (a file it writes), never on the clock: a slow
    # restart on a loaded machine cannot outlast it
    script = (
        "import os, time\n"
        "open('starts.txt', 'a').write(f'{os.getpid()}\\n')\n"
        "while not os.path.exists('go'):\n    time.sleep(0.05)\n"
        "print('done once')\n"
    )
    job = hub.api("POST", J, {"project": "vision", "gpus": 1, "script": script}, token=token)
    running = hub.wait_job(job["id"], {"running"}, token)
    hub.kill9()
    hub.start()
    adopted = hub.api("GET", f"{J}/{job['id']}", token=token)
    assert adopted["state"] == "running" and adopted["runs"] == 1  # re-adopted, not restarted
    Path(running["workdir"], "go").touch()
    done = hub.wait_job(job["id"], {"succeeded", "failed"}, token)
    assert done["state"] == "succeeded" and done["runs"] == 1
    assert len(Path(running["workdir"], "starts.txt").read_text().split()) == 1  # ran exactly once
    assert not [s for s in hub.allocations() if s["kind"] == "train"]  # its GPU came back


def test_a_department_limit_holds_its_projects_back_though_gpus_are_idle(jobhub: Hub) -> None:
    token = jobhub.user_token("tia")
    jobs = [
        jobhub.api(
            "POST",
            J,
            {"project": "teaching", "gpus": 1, "name": f"t{i}", "script": "import time\ntime.sleep(120)"},
            token=token,
        )
        for i in range(2)
    ]
    jobhub.wait_job(jobs[0]["id"], {"running"}, token)
    for _ in range(10):  # a few scheduling cycles (0.3 s each)
        time.sleep(0.3)
        assert jobhub.api("GET", f"{J}/{jobs[1]['id']}", token=token)["state"] == "queued"
    lab = jobhub.api("GET", "/services/gpupool/api/projects", token=token)["departments"]
    assert lab == [
        {
            "name": "lab",
            "guarantee_milli": 1000,
            "limit_milli": 1000,
            "projects": ["teaching"],
            "used_milli": 1000,
        }
    ]
    for job in jobs:
        jobhub.api("DELETE", f"{J}/{job['id']}", token=token)
