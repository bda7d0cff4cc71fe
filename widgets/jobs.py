"""PromoteToTraining and JobMonitor: send notebook code to the training pool and watch it."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from html import escape
from typing import Any
from urllib.parse import quote

import ipywidgets as w

from gpupool.train.sweep import SweepError
from gpupool.vocab.job_wire import CodeKind, JobView, job_body
from gpupool.vocab.priority import PRIORITY_MAX, PRIORITY_MIN
from gpupool.vocab.states import UNFINISHED, JobState
from gpupool.widgets.ansi import log_box
from gpupool.widgets.client import Client, GPUPoolError
from gpupool.widgets.sweep import SweepTable, parse_sweep_field

STATE_COLOURS: dict[str, str] = {  # by JobState
    JobState.QUEUED: "#b58900",
    JobState.RUNNING: "#268bd2",
    JobState.PREEMPTING: "#cb4b16",
    JobState.SUCCEEDED: "#2aa198",
    JobState.FAILED: "#dc322f",
    JobState.CANCELLED: "#839496",
}


def offered_projects(projects: list[dict[str, Any]]) -> list[str]:
    """The projects the promotion widget offers: those the user may submit to (api/projects says
    so per project). Before, it offered every project, and a pick not theirs was refused on submit."""
    return [p["name"] for p in projects if p.get("may_submit", True)]


# The monitor's columns, header and cells alike. Every cell is aligned left and to the top, the
# header's too: a browser centres <th> by default and JupyterLab's rendered HTML aligns cells
# right, so headers stood off their columns (a job's cell holds two lines, its header one word).
JOB_COLUMNS = ("job", "project", "GPUs", "state", "GPU", "runs", "note")
CELL_STYLE = "text-align:left;vertical-align:top;padding:2px 8px"


def job_row(job: JobView) -> str:
    """One job as an HTML table row: pure, so tests read what users see. A queued job says why it
    waits (the API's wait_reason), a preempted one when and from where it goes on."""
    colour = STATE_COLOURS.get(job["state"], "#000")
    where = ", ".join(f"{g['node']} GPU {g['gpus']}" for g in job.get("gpu", [])) or "—"
    why = job.get("wait_reason") or (
        f"#{job['queue_position']} in queue" if job.get("queue_position") else ""
    )
    forecast = job.get("eta")
    eta = forecast.get("text") if forecast and job["state"] == JobState.QUEUED else ""
    if eta:  # when the forward simulation of the scheduler expects it to start (gpupool.pool.eta)
        why = f"{eta}; {why}" if why else eta
    runs = (
        "not started"
        if not job["runs"]
        else f"run {job['runs']}" + (f", preempted {job['preemptions']}×" if job["preemptions"] else "")
    )
    # a cancelled job says who cancelled it (an admin's cancel too), a failed one why ("killed: over
    # its 8 GiB memory limit"), not an earlier preemption
    ended = job["state"] in (JobState.CANCELLED, JobState.FAILED)
    note = (job.get("message") if ended else job.get("preemption") or job.get("message")) or ""
    state = f"<b style='color:{colour}'>{escape(job['state'])}</b>" + (
        f"<br><small>{escape(why)}</small>" if why else ""
    )
    cells = (  # one per JOB_COLUMNS entry, in its order
        f"<code>{escape(job['id'])}</code> {escape(job['name'])}",
        escape(job["project"]),
        f"{job['gpus']:g}",
        state,
        escape(where),
        escape(runs),
        escape(note),
    )
    return "<tr>" + "".join(f"<td style='{CELL_STYLE}'>{cell}</td>" for cell in cells) + "</tr>"


def job_table(jobs: list[JobView]) -> str:
    """The job monitor's table: one header row over the same columns as every job's row."""
    head = "".join(f"<th style='{CELL_STYLE}'>{name}</th>" for name in JOB_COLUMNS)
    return (
        "<table class='gpupool-jobs' style='border-collapse:collapse;table-layout:auto'>"
        f"<thead><tr>{head}</tr></thead><tbody>" + "".join(job_row(j) for j in jobs) + "</tbody></table>"
    )


GPU_SIZES = (0.25, 0.5, 1, 2, 4, 8)


def gpu_choices(pool: Mapping[str, object]) -> list[float]:
    """The GPU counts a job can get on one node of this pool (a job never spans nodes)."""
    per_node: dict[str, int] = {}
    gpus = pool.get("gpus") if isinstance(pool, Mapping) else None
    for gpu in gpus if isinstance(gpus, list) else []:
        node = str(gpu.get("node", "")) if isinstance(gpu, Mapping) else ""
        per_node[node] = per_node.get(node, 0) + 1
    biggest = max(per_node.values(), default=0)
    if not biggest:
        return list(GPU_SIZES)
    return [x for x in GPU_SIZES if x <= biggest] + ([biggest] if biggest not in GPU_SIZES else [])


def validate_choices(
    project: str, gpus: float, projects: list[dict[str, Any]], params_text: str
) -> tuple[list[str], dict[str, object]]:
    """Problems a user can fix before submitting, and the parsed parameters."""
    problems = []
    known = {p["name"]: p for p in projects}
    if project not in known:
        problems.append(f"choose a project: {', '.join(sorted(known)) or 'none is configured'}")
    elif known[project]["limit_milli"] >= 0 and gpus * 1000 > known[project]["limit_milli"]:
        problems.append(f"project {project} may use at most {known[project]['limit_milli'] / 1000:g} GPUs")
    if gpus <= 0:
        problems.append("ask for more than 0 GPUs")
    params: dict[str, object] = {}
    if params_text.strip():
        try:
            params = json.loads(params_text)
            if not isinstance(params, dict):
                raise ValueError("not an object")
        except ValueError:
            problems.append('parameters must be a JSON object, e.g. {"lr": 0.01, "epochs": 3}')
    return problems, params


def output_link(path: str, env: Mapping[str, str] | None = None) -> str:
    """A link that opens the executed notebook in this JupyterLab, when it lies under HOME."""
    env = os.environ if env is None else env
    home, prefix = env.get("HOME", ""), env.get("JUPYTERHUB_SERVICE_PREFIX", "")
    # with an account per user the jobs live outside the home, linked from it as ~/gpupool-jobs
    link = os.path.join(home, "gpupool-jobs") if home else ""
    if (
        link
        and os.path.islink(link)
        and os.path.commonpath([os.path.realpath(link), path]) == os.path.realpath(link)
    ):
        path = os.path.join(link, os.path.relpath(path, os.path.realpath(link)))
    if home and prefix and os.path.commonpath([home, path]) == os.path.abspath(home):
        rel = os.path.relpath(path, home)
        return (
            f"Executed notebook: <a href='{escape(prefix)}lab/tree/{escape(quote(rel))}' target='_blank'>"
            f"{escape(rel)}</a>"
        )
    return f"Executed notebook: <code>{escape(path)}</code>"


class JobMonitor(w.VBox):
    """The user's jobs (or one job) with state, why it waits, GPU, preemptions; for one job also
    its log tail (colours rendered, scrolled to the last line) and a Cancel button.

    It follows by itself (a thread reads the API every `interval` seconds) until every job shown
    has ended, then reads once more for the final log and output link; those reads are not user
    activity (gpupool.widgets.quiet)."""

    def __init__(
        self,
        client: Client | None = None,
        job_id: str | None = None,
        follow: bool = True,
        interval: float = 2.0,
        **kwargs: Any,
    ) -> None:
        self.client, self.job_id, self.interval = client, job_id, interval
        self.table, self.message, self.status = w.HTML(), w.HTML(), w.HTML()
        self.log_lines: list[str] = []
        self.log_view = w.HTML(log_box([]), layout=w.Layout(width="100%"))
        self.cancel_button = w.Button(description="Cancel job", icon="stop", button_style="danger")
        self.cancel_button.on_click(lambda _: self.cancel())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # all jobs: no Cancel button (it would cancel nothing); one job: Cancel and its log
        one = [w.HBox([self.cancel_button, self.status]), self.log_view] if job_id else [self.status]
        super().__init__([self.table, self.message, *one], **kwargs)
        jobs = self.refresh()
        if follow and any(j["state"] in UNFINISHED for j in jobs):
            self.follow()

    @property
    def api(self) -> Client:
        return self.client or Client()

    def follow(self) -> None:
        self._thread = threading.Thread(target=self._follow, name="gpupool-job-monitor", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        from gpupool.widgets.quiet import background

        failures = 0
        with background():  # what this thread sends is not user activity
            self.status.value = f"<small style='color:#777'>following: read every {self.interval:g} s</small>"
            while not self._stop.wait(self.interval):
                jobs = self.refresh()
                failures = failures + 1 if not jobs else 0
                if (jobs and not any(j["state"] in UNFINISHED for j in jobs)) or failures >= 30:
                    break
        self.status.value = (
            ""
            if failures < 30
            else "<small style='color:#b00'>stopped following: the API did not answer</small>"
        )

    def close(self) -> None:
        self._stop.set()
        super().close()

    def refresh(self) -> list[JobView]:
        try:
            jobs = (
                [self.api.get(f"api/jobs/{self.job_id}")] if self.job_id else self.api.get("api/jobs")["jobs"]
            )
            if self.job_id:
                logs = self.api.get(f"api/jobs/{self.job_id}/logs?tail=200")
                if logs["lines"] != self.log_lines:
                    self.log_lines = list(logs["lines"])
                    self.log_view.value = log_box(self.log_lines)
                self.message.value = output_link(logs["output_notebook"]) if logs["output_notebook"] else ""
        except GPUPoolError as err:
            self.message.value = f"<span style='color:#b00'>{escape(str(err))}</span>"
            return []
        self.table.value = job_table(jobs)
        if self.job_id and jobs:  # an ended job has nothing to cancel: no button, not a dead one
            self.cancel_button.layout.display = "" if jobs[0]["state"] in UNFINISHED else "none"
            self.cancel_button.disabled = jobs[0]["state"] not in UNFINISHED
        return jobs

    def cancel(self) -> None:
        try:
            self.api.request("DELETE", f"api/jobs/{self.job_id}")
        except GPUPoolError as err:
            self.message.value = f"<span style='color:#b00'>{escape(str(err))}</span>"
            return
        self.refresh()


class PromoteToTraining(w.VBox):
    """Choose project, GPUs, priority and parameters; Submit sends `code` to the training pool."""

    def __init__(
        self,
        code: str | list[str] | None = None,
        notebook: dict[str, Any] | None = None,
        client: Client | None = None,
        script: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.client, self.code, self.notebook, self.script = client, code, notebook, script
        try:
            self.projects = self.api.get("api/projects")["projects"]
        except GPUPoolError as err:
            self.projects = []
            kwargs.setdefault("children", [w.HTML(f"<span style='color:#b00'>{escape(str(err))}</span>")])
        names = offered_projects(self.projects)
        try:
            choices = gpu_choices(self.api.get("api/pool"))
        except GPUPoolError:
            choices = list(GPU_SIZES)
        label = {"style": {"description_width": "7em"}}  # long enough for every label: none is cut
        self.project = w.Dropdown(options=names, description="Project", **label)
        self.gpus = w.Dropdown(
            options=choices, value=1 if 1 in choices else choices[-1], description="GPUs", **label
        )
        self.priority = w.IntSlider(
            value=0, min=PRIORITY_MIN, max=PRIORITY_MAX, description="Priority", **label
        )
        self.name = w.Text(value="promoted", description="Name", **label)
        self.params = w.Text(placeholder='{"lr": 0.01}', description="Parameters", **label)
        # one job per combination, as %%train --sweep: KEY=V1,V2 items separated by spaces
        self.sweep = w.Text(placeholder="lr=0.1,0.01 batch=32,64", description="Sweep", **label)
        self.problems = w.HTML()
        self.submit_button = w.Button(
            description="Submit to training",
            icon="rocket",
            button_style="primary",
            layout=w.Layout(width="auto"),
        )
        self.submit_button.on_click(lambda _: self.submit())
        self.monitor_box = w.VBox()
        self.source = w.HTML()  # what is submitted (current_notebook: the notebook and its cells)
        for widget in (self.project, self.gpus, self.params, self.sweep):
            widget.observe(lambda _: self.check(), names="value")
        super().__init__(
            [
                self.source,
                self.project,
                self.gpus,
                self.priority,
                self.name,
                self.params,
                self.sweep,
                self.problems,
                self.submit_button,
                self.monitor_box,
            ],
            **kwargs,
        )
        self.check()

    @classmethod
    def from_script(cls, path: str, **kwargs: Any) -> PromoteToTraining:
        """Promote a Python script (read now: later edits do not change the job)."""
        try:
            with open(path) as f:
                source = f.read()
        except OSError as err:
            raise GPUPoolError(f"cannot read {path}: {err.strerror}") from None
        return cls(script=source, **kwargs)

    @classmethod
    def current_notebook(
        cls,
        cells: list[int] | None = None,
        connection_file: str | None = None,
        env: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> PromoteToTraining:
        """Promote the notebook this kernel runs, as last saved, without the cell that calls this.

            PromoteToTraining.current_notebook()              # every other code cell
            PromoteToTraining.current_notebook(cells=[0, 2])  # the 1st and 3rd code cells

        The notebook is found by this kernel's id through the Jupyter server's sessions API, so a
        notebook renamed since it started (JupyterLab's rename on first save) is found too."""
        from gpupool.widgets.notebook import current_notebook, promoted_cells

        caller = ""
        if connection_file is None:
            from ipykernel import get_connection_file
            from IPython import get_ipython

            connection_file = get_connection_file()
            shell = get_ipython()
            caller = shell.history_manager.input_hist_raw[-1] if shell is not None else ""
        path, nb = current_notebook(connection_file, env)
        chosen, which = promoted_cells(nb, cells, leave_out=caller)
        widget = cls(notebook={**nb, "cells": chosen}, **kwargs)
        widget.source_path = path
        widget.source.value = (
            f"Submits <code>{escape(path)}</code>: {escape(which)}."  # before anything is sent
        )
        return widget

    @property
    def api(self) -> Client:
        return self.client or Client()

    def check(self) -> tuple[list[str], dict[str, object]]:
        problems, params = validate_choices(
            self.project.value or "", float(self.gpus.value), self.projects, self.params.value
        )
        self.sweep_spec: dict[str, list[object]] = {}
        runs = 1
        try:
            self.sweep_spec, runs = parse_sweep_field(self.sweep.value)
        except SweepError as err:
            problems.append(str(err))
        if self.sweep_spec and self.script is not None:
            problems.append(
                "sweep: only for code or a notebook (their parameters get the values), not a script"
            )
        self.problems.value = "".join(f"<div style='color:#b00'>{escape(p)}</div>" for p in problems)
        if self.sweep_spec and not problems:  # how many jobs, before anything is submitted
            names = ", ".join(self.sweep_spec)
            self.problems.value = f"<div>{runs} jobs: one per combination of {escape(names)}</div>"
        self.submit_button.description = (
            f"Submit {runs} jobs to training" if self.sweep_spec else "Submit to training"
        )
        self.submit_button.disabled = bool(problems)
        return problems, params

    def submit(self) -> dict[str, object] | None:
        problems, params = self.check()
        if problems:
            return None
        kind: CodeKind = (
            "script" if self.script is not None else "notebook" if self.notebook is not None else "code"
        )
        what = {"script": self.script, "notebook": self.notebook, "code": self.code}[kind]
        body = job_body(
            self.project.value,
            self.gpus.value,
            self.name.value,
            self.priority.value,
            params,
            kind,
            what,
            sweep=self.sweep_spec,
        )
        self.submit_button.disabled = True
        self.problems.value = "<i>submitting…</i>"
        try:
            job = self.api.post("api/jobs", body)
        except GPUPoolError as err:
            self.problems.value = f"<span style='color:#b00'>{escape(str(err))}</span>"
            self.submit_button.disabled = False
            return None
        if "sweep" in job:  # its runs side by side, with their final metrics
            self.problems.value = (
                f"Submitted sweep <code>{escape(str(job['sweep']))}</code>: {len(job['jobs'])} jobs."
            )
            self.monitor_box.children = [SweepTable(str(job["sweep"]), self.client)]
            return job
        self.problems.value = f"Submitted job <code>{escape(job['id'])}</code>."
        self.monitor_box.children = [JobMonitor(client=self.client, job_id=job["id"])]
        return job
