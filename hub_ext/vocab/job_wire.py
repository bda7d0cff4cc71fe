"""The JSON body of `POST api/jobs` (a train job), typed once: the widget's Submit button and
`%%train` build it with `job_body`, the hub's API (gpupool.api.jobs) checks every key of it
with bounds, as it does for any other client (docs/openapi.yaml says the same). Stdlib only."""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

CodeKind = Literal["code", "script", "notebook"]  # the three ways a job carries what it runs


class JobBody(TypedDict):
    project: str
    gpus: float | str  # 0.25, "0.25" or "1/4": the hub parses it (gpupool.pool.units)
    name: str
    priority: int
    parameters: dict[str, object]  # the values the code's parameters cell gets
    code: NotRequired[list[str] | str]  # a notebook's cells, or one cell
    script: NotRequired[str]  # a Python file's text
    notebook: NotRequired[dict[str, Any]]  # an .ipynb, whole
    sweep: NotRequired[dict[str, list[Any]]]  # one job per combination of these values
    pools: NotRequired[list[str]]  # only these of the project's node pools, in this order


def job_body(
    project: str,
    gpus: float | str,
    name: str,
    priority: int,
    parameters: dict[str, Any],
    kind: CodeKind,
    what: Any,
    sweep: dict[str, list[object]] | None = None,
    pools: list[str] | None = None,
) -> JobBody:
    """The body for one submission: `what` is the code, the script or the notebook (`kind`)."""
    body = JobBody(project=project, gpus=gpus, name=name, priority=priority, parameters=parameters)
    if kind == "script":
        body["script"] = what
    elif kind == "notebook":
        body["notebook"] = what
    else:
        body["code"] = what
    if sweep:
        body["sweep"] = sweep
    if pools:
        body["pools"] = pools
    return body


class JobEstimate(TypedDict):
    """When a queued job should start, and why then (gpupool.train.estimates, .kai_estimates)."""

    start: float | None  # None: no start in sight, or after a run of unknown length
    in_s: float | None
    error_s: NotRequired[float | None]  # give or take
    after: str  # what it waits for ("now": nothing)
    basis: str  # what the forecast rests on
    reason: NotRequired[str]  # KAI-Scheduler's reason for the order (on Kubernetes)
    text: str  # all of it in plain words


class JobPlace(TypedDict):
    node: str
    gpus: list[int]
    milli: int


class JobRecord(TypedDict):
    """A train job's row as the API shows it (gpupool.store.jobs.TrainJob.to_json)."""

    id: str
    owner: str
    project: str
    name: str
    gpus: float
    num_gpu: int
    gpu_milli: int
    priority: int
    command: list[str]
    state: str  # a gpupool.vocab.states.JobState
    submitted: float
    started: float | None
    finished: float | None
    preemptions: int
    runs: int
    exit_code: int | None
    message: str
    workdir: str
    min_runtime_s: float
    max_runtime_s: float


class JobView(JobRecord):
    """`GET api/jobs` lists these ({"jobs": [...]}), `GET api/jobs/ID` answers one; the widgets'
    job table and JupyterLab's status item read them (gpupool.widgets.jobs, .summary)."""

    queue_position: int | None
    wait_reason: str  # plain words; "" unless queued
    eta: JobEstimate | None  # None unless queued
    preemption: str  # the last one in one line; "" if never preempted
    gpu: list[JobPlace]  # where it runs now


class JobList(TypedDict):
    jobs: list[JobView]


class SweepJob(JobRecord):
    queue_position: int | None


class SweepRun(TypedDict):
    job: SweepJob
    parameters: dict[str, object]  # the values this run got: JSON the user wrote
    metrics: dict[str, float]  # its final printed metrics


class SweepView(TypedDict):
    """`GET api/sweeps/ID`: a sweep's runs; the widgets' sweep table reads it (gpupool.widgets.sweep)."""

    sweep: str
    parameters: list[str]  # every parameter's name, sorted
    runs: list[SweepRun]
