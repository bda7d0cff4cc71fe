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
    parameters: dict[str, Any]  # the values the code's parameters cell gets
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
    sweep: dict[str, list[Any]] | None = None,
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
