"""PromoteToTraining and JobMonitor against a real hub, with a user's own token."""

from __future__ import annotations

import pytest

from gpupool.widgets import Client, JobMonitor, PromoteToTraining
from gpupool.widgets.jobs import job_row, validate_choices
from gpupool.widgets.magics import train_args
from tests.hubtools import REPO, Hub

pytestmark = pytest.mark.hub
CONFIG = """
c.TrainPool.tick_s = 0.3
c.TrainPool.projects = {"vision": {"guarantee": 1, "limit": 2}}
"""


def test_promote_a_cell_and_watch_it_succeed(make_hub) -> None:
    hub: Hub = make_hub(CONFIG, env={"GPUPOOL_CULLER": "0"}).start()
    client = Client(f"http://127.0.0.1:{hub.api_port}/services/gpupool/", hub.user_token("ivy"))
    promote = PromoteToTraining(code="print('answer', 6 * n)", client=client)
    assert list(promote.project.options) == ["vision"]
    promote.params.value = "{not json"
    assert promote.submit_button.disabled and "must be a JSON object" in promote.problems.value
    assert list(promote.gpus.options) == [0.25, 0.5, 1, 2, 4]  # the demo's node has 4 GPUs: 8 never fits
    promote.gpus.value = 4
    promote.params.value = '{"n": 7}'
    assert "may use at most 2 GPUs" in promote.problems.value  # explained before submitting
    promote.gpus.value = 0.5
    assert not promote.submit_button.disabled
    assert (promote.priority.min, promote.priority.max) == (-100, 100)  # the API's range
    job = promote.submit()
    assert job["state"] == "queued"
    monitor = promote.monitor_box.children[0]
    assert monitor._thread is not None  # it follows the job by itself: nobody calls refresh()
    monitor._thread.join(90)
    assert not monitor._thread.is_alive(), monitor.table.value  # and stops once the job has ended
    assert "succeeded" in monitor.table.value
    assert "answer 42" in monitor.log_view.value
    assert "output.ipynb" in monitor.message.value
    assert monitor.cancel_button.disabled
    everyone = JobMonitor(client=Client(client.api_url, hub.user_token("jon")))
    assert job["id"] not in everyone.table.value  # another user sees none of it


def test_job_row_and_choices_are_explained() -> None:
    row = job_row(
        {
            "id": "abc",
            "name": "n",
            "project": "p",
            "gpus": 0.5,
            "state": "queued",
            "queue_position": 2,
            "runs": 0,
            "preemptions": 0,
            "gpu": [],
            "message": "",
        }
    )
    assert "#2 in queue" in row and "not started" in row
    why = "waiting for GPUs: project p uses 2 of its 2-GPU guarantee and no GPU is idle; 1 job ahead"
    row = job_row(
        {
            "id": "abc",
            "name": "n",
            "project": "p",
            "gpus": 1,
            "state": "queued",
            "queue_position": 2,
            "wait_reason": why,
            "runs": 1,
            "preemptions": 1,
            "gpu": [],
            "message": "preempted; will resume",
            "preemption": "preempted at 14:02 so that project q gets its guarantee back; resumes from"
            " the checkpoint saved at 13:55",
        }
    )
    assert why in row and "run 1, preempted 1×" in row and "resumes from the checkpoint saved at 13:55" in row
    assert "will resume" not in row  # the plain line replaces the bare state message
    # over its memory limit after a resume: the monitor says why it failed, not the old preemption
    killed = "killed: over its 8 GiB memory limit; exit code -9"
    row = job_row(
        {
            **dict(id="abc", name="n", project="p", gpus=1, runs=2, preemptions=1, gpu=[]),
            "state": "failed",
            "message": killed,
            "preemption": "preempted at 14:02 so that project q gets",
        }
    )
    assert killed in row and "preempted at 14:02" not in row
    problems, params = validate_choices("x", 1, [{"name": "p", "limit_milli": -1}], '{"a": 1}')
    assert problems == ["choose a project: p"] and params == {"a": 1}


def test_gpu_choices_fit_one_node() -> None:
    from gpupool.widgets.jobs import gpu_choices

    pool = {"gpus": [{"node": "a"}] * 4 + [{"node": "b"}] * 3}
    assert gpu_choices(pool) == [0.25, 0.5, 1, 2, 4]
    assert gpu_choices({"gpus": [{"node": "a"}] * 3}) == [0.25, 0.5, 1, 2, 3]


def test_train_magic_arguments() -> None:
    args = train_args("--project vision --gpus 0.5 -p lr=0.01 -p tag=baseline")
    assert (args.project, args.gpus, args.parameters) == ("vision", 0.5, {"lr": 0.01, "tag": "baseline"})


def test_one_priority_range_in_the_magic_the_slider_and_the_api() -> None:
    """%%train, PromoteToTraining and the API take the same priorities (the magic and the slider
    offered -10..10 while the API and the docs said -100..100)."""
    from gpupool.vocab.priority import PRIORITY_MAX, PRIORITY_MIN
    from gpupool.widgets.magics import train_parser

    assert (PRIORITY_MIN, PRIORITY_MAX) == (-100, 100)
    assert train_args("--project p --priority 50").priority == 50
    assert train_args("--project p --priority -100").priority == -100
    for bad in ("101", "-101", "high", "1.5"):
        with pytest.raises(ValueError, match="a whole number from -100 to 100"):
            train_args(f"--project p --priority {bad}")
    assert "-100..100" in train_parser().format_help()
    openapi = (REPO / "docs" / "openapi.yaml").read_text()
    assert "priority: {type: integer, minimum: -100, maximum: 100}" in openapi
    assert "−100…100" in (REPO / "docs" / "training.md").read_text()


def test_output_link_opens_the_notebook_in_this_lab() -> None:
    from gpupool.widgets.jobs import output_link

    env = {"HOME": "/home/ann", "JUPYTERHUB_SERVICE_PREFIX": "/user/ann/"}
    link = output_link("/home/ann/gpupool-jobs/sq-1/output.ipynb", env)
    assert "href='/user/ann/lab/tree/gpupool-jobs/sq-1/output.ipynb'" in link
    assert "<code>/srv/x.ipynb</code>" in output_link("/srv/x.ipynb", env)


def test_promote_the_current_notebook_after_a_rename_without_the_calling_cell(make_hub) -> None:
    import nbformat

    hub: Hub = make_hub(env={"GPUPOOL_CULLER": "0"}).start()
    hub.spawn("ida", "0.25")
    token, server = hub.user_token("ida"), "/user/ida/"
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("a = 1"),
        nbformat.v4.new_markdown_cell("x"),
        nbformat.v4.new_code_cell("print(a)"),
        nbformat.v4.new_code_cell("%%train --project default\nprint('a job of its own')"),
        nbformat.v4.new_code_cell("PromoteToTraining.current_notebook()"),
    ]
    hub.api("PUT", server + "api/contents/Untitled.ipynb", {"type": "notebook", "content": nb}, token=token)
    session = hub.api(
        "POST",
        server + "api/sessions",
        {"path": "Untitled.ipynb", "type": "notebook", "name": "", "kernel": {"name": "python3"}},
        token=token,
    )
    # JupyterLab's rename on first save: the file moves and the session follows it
    hub.api("PATCH", server + "api/contents/Untitled.ipynb", {"path": "analysis.ipynb"}, token=token)
    hub.api("PATCH", server + f"api/sessions/{session['id']}", {"path": "analysis.ipynb"}, token=token)
    env = {"JUPYTERHUB_SERVICE_URL": hub.url + server, "JUPYTERHUB_API_TOKEN": token}
    client = Client(f"http://127.0.0.1:{hub.api_port}/services/gpupool/", token)
    connection_file = f"/run/user/kernel-{session['kernel']['id']}.json"

    promote = PromoteToTraining.current_notebook(connection_file=connection_file, env=env, client=client)
    assert promote.source_path == "analysis.ipynb"
    # a %%train cell submits a job of its own: never promoted with the rest, and the widget says so
    assert [c["source"] for c in promote.notebook["cells"]] == [
        "a = 1",
        "print(a)",
        "PromoteToTraining.current_notebook()",
    ]
    assert promote.source.value == (
        "Submits <code>analysis.ipynb</code>: code cells 1, 2, 4 of 4, as last saved;"
        " left out: 3 (%%train: it submits a job of its own)."
    )
    from gpupool.widgets.notebook import code_cells

    chosen = code_cells(promote.notebook, [1], leave_out="")
    assert [c["source"] for c in chosen] == ["print(a)"]
    kept = code_cells(promote.notebook, None, leave_out="PromoteToTraining.current_notebook()\n")
    assert [c["source"] for c in kept] == ["a = 1", "print(a)"]  # the calling cell is left out
    with pytest.raises(Exception, match="no notebook of this server runs this kernel"):
        PromoteToTraining.current_notebook(
            connection_file="kernel-0000aaaa-0000.json", env=env, client=client
        )
    with pytest.raises(Exception, match="JUPYTERHUB_SERVICE_URL is not set"):
        PromoteToTraining.current_notebook(connection_file=connection_file, env={}, client=client)


def test_promote_a_script_as_it_is_now(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('v1')")

    class Recorder:
        sent: dict = {}

        job = {
            "id": "0123456789ab",
            "name": "promoted",
            "project": "p",
            "gpus": 1,
            "state": "queued",
            "queue_position": 1,
            "runs": 0,
            "preemptions": 0,
            "gpu": [],
            "message": "",
        }

        def get(self, path):
            if path == "api/projects":
                return {"projects": [{"name": "p", "limit_milli": -1}]}
            if path.endswith("/logs?tail=200"):
                return {"lines": [], "output_notebook": None}
            return self.job

        def post(self, path, body):
            Recorder.sent = body
            return self.job

    promote = PromoteToTraining.from_script(str(script), client=Recorder())
    script.write_text("print('v2')")  # edited after promotion: the job keeps v1
    promote.project.value = "p"
    promote.submit()
    assert Recorder.sent["script"] == "print('v1')" and "code" not in Recorder.sent
    with pytest.raises(Exception, match="cannot read"):
        PromoteToTraining.from_script(str(tmp_path / "missing.py"), client=Recorder())


def test_the_sweep_field_says_how_many_jobs_and_refuses_what_the_hub_would(make_hub) -> None:
    """The promotion widget's sweep field (the syntax of %%train --sweep) is checked as it is
    typed, shows how many jobs Submit will send, and submits one job per combination that the
    sweep table then shows with each run's final metrics."""
    hub: Hub = make_hub(
        CONFIG.replace('"limit": 2', '"limit": 4') + "c.TrainPool.max_queued_per_user = 8\n",
        env={"GPUPOOL_CULLER": "0"},
    ).start()
    client = Client(f"http://127.0.0.1:{hub.api_port}/services/gpupool/", hub.user_token("ivy"))
    promote = PromoteToTraining(code="print(f'final loss={1 / (lr * batch):.4f}')", client=client)
    promote.gpus.value = 0.25
    for text, why in (
        ("lr=", "lr needs values separated by commas"),
        ("lr", "is not KEY=V1,V2"),
        ("lr=1 lr=2", "lr is given twice"),
        ("1x=1,2", "is not a parameter name"),
        ("a=1,2,3,4,5,6 b=1,2,3,4,5,6", "36 combinations, at most 20"),
        ("lr='0.1", "quotation"),
    ):
        promote.sweep.value = text
        assert promote.submit_button.disabled and why in promote.problems.value, (
            text,
            promote.problems.value,
        )
    promote.sweep.value = "lr=0.5,0.25 batch=2,4"
    assert not promote.submit_button.disabled
    assert "4 jobs: one per combination of lr, batch" in promote.problems.value
    assert promote.submit_button.description == "Submit 4 jobs to training"
    out = promote.submit()
    assert [j["name"] for j in out["jobs"]] == ["promoted-1", "promoted-2", "promoted-3", "promoted-4"]
    table = promote.monitor_box.children[0]
    assert "<th>lr</th>" in table.table.value and "<th>batch</th>" in table.table.value
    from tests.support.wait import until

    until(
        lambda: not table.refresh() or table.table.value.count("succeeded") >= 4,
        "four runs succeeded",
        timeout=120,
        every=0.5,
        detail=lambda: table.table.value,
    )
    assert "<th>loss</th>" in table.table.value and "<td>1</td>" in table.table.value  # 1 / (0.5 * 2)
    promote.sweep.value = ""
    assert promote.submit_button.description == "Submit to training"


def test_the_promotion_widget_offers_only_projects_the_user_may_submit_to() -> None:
    """Before, the Project list held every project of the hub; picking one the user is not a
    member of was refused only on submit."""

    class Hub:
        def get(self, path: str) -> dict:
            if path == "api/projects":
                return {
                    "projects": [
                        {"name": n, "may_submit": n == "lab", "limit_milli": -1} for n in ("lab", "secret")
                    ]
                }
            return {"gpus": []}

    widget = PromoteToTraining(code="print(1)", client=Hub())  # type: ignore[arg-type]
    assert list(widget.project.options) == ["lab"]
