"""The one way tests build a train job to submit: a JobRequest (what the API builds) whose code
is the command line given, with its files. Every argument by name: a positional call is what
once let two fields (a project and a name, GPUs and milli-GPUs) swap unnoticed.

    svc.submit(job_request(owner="ann", project="lab", name="sweep", command=UNTIL_TOLD), now=0)
    job_request(owner="ann", project="lab", name="e", num_gpu=4, command=cmd, min_gpus=1)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpupool.train.code import JobCode
from gpupool.train.request import JobRequest


def job_request(
    *,
    owner: str,
    project: str,
    name: str,
    command: Sequence[str],
    files: Mapping[str, bytes] | None = None,
    num_gpu: int = 1,
    gpu_milli: int = 1000,
    priority: int = 0,
    min_runtime_s: float = 0.0,
    max_runtime_s: float = 0.0,
    min_gpus: int = 0,
    pools: tuple[str, ...] = (),
) -> JobRequest:
    """A job of `num_gpu` GPUs (`gpu_milli` of each; 1000 is a whole one) that runs `command`
    in its folder, where `files` (name -> content) are written first."""
    return JobRequest(
        owner=owner,
        project=project,
        name=name,
        num_gpu=num_gpu,
        gpu_milli=gpu_milli,
        code=JobCode.command(command, files),
        priority=priority,
        min_runtime_s=min_runtime_s,
        max_runtime_s=max_runtime_s,
        min_gpus=min_gpus,
        pools=pools,
    )
