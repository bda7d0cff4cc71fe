"""A train job's submission parsed in one place (gpupool.train.job_form): each field bounded,
checked against the caller's projects, the pools and the largest node, with the API's status and
a message naming the field; a good body becomes the JobRequest the back-end queues."""

from __future__ import annotations

import pytest

from gpupool.train.code import JobCode
from gpupool.train.config import TrainPool
from gpupool.train.job_form import JobRefused, parse_job

CFG = TrainPool(
    projects={
        "vision": {"guarantee": 2, "limit": 4, "users": ["ada"]},
        "open": {"guarantee": 1, "pools": ["dgx"]},
    },
    node_pools={"dgx": {"nodes": ["n1"]}, "ws": {"nodes": ["n2"]}},
)
PROJECTS, POOLS = CFG.project_table(), CFG.pool_table()


def parse(body: dict, user: str = "ada", largest: int = 8):
    return parse_job(body, user, (), False, CFG, PROJECTS, POOLS, largest)


def test_a_good_body_becomes_the_request_the_back_end_queues() -> None:
    form = parse({"project": "open", "gpus": 2, "name": "r1", "priority": 3, "pools": ["dgx"], "min_gpus": 1})
    job = form.job("ada", JobCode.script(b"print(1)"))
    assert (job.owner, job.project, job.name, job.num_gpu, job.gpu_milli) == ("ada", "open", "r1", 2, 1000)
    assert (job.priority, job.min_gpus, job.pools) == (3, 1, ("dgx",))
    assert form.runs == [("r1", None)]
    sweep = parse(
        {"project": "open", "gpus": 0.5, "code": "x", "sweep": {"lr": [1, 2]}, "parameters": {"b": 0}}
    )
    assert sweep.runs == [("job-1", {"b": 0, "lr": 1}), ("job-2", {"b": 0, "lr": 2})]


@pytest.mark.parametrize(
    ("body", "user", "status", "says"),
    [
        ({"project": "nope", "gpus": 1}, "ada", 400, "unknown project 'nope'"),
        (
            {"project": "vision", "gpus": 1},
            "bob",
            403,
            "you may not submit to project 'vision'; your projects: ['open']",
        ),
        ({"project": "open", "gpus": "lots"}, "ada", 400, "gpus: "),
        ({"project": "open", "gpus": 16}, "ada", 400, "no node has 16 GPUs (the largest has 8)"),
        ({"project": "vision", "gpus": 6}, "ada", 400, "project vision may use at most 4 GPUs"),
        ({"project": "open", "gpus": 1, "name": "-x"}, "ada", 400, "name: 1-40 letters"),
        ({"project": "open", "gpus": 1, "name": "x" * 41}, "ada", 400, "name: 1-40 letters"),
        ({"project": "open", "gpus": 0.5, "min_gpus": 1}, "ada", 400, "min_gpus: a whole number of GPUs"),
        ({"project": "open", "gpus": 2, "min_gpus": 3}, "ada", 400, "min_gpus must be between 1 and 2"),
        (
            {"project": "open", "gpus": 1, "pools": ["ws"]},
            "ada",
            400,
            "pools: a list of node pools of project open",
        ),
        ({"project": "open", "gpus": 1, "pools": ["dgx"] * 2}, "ada", 400, "pools: "),
        (
            {"project": "open", "gpus": 1, "script": "1", "sweep": {"a": [1]}},
            "ada",
            400,
            "only for code or notebook",
        ),
        ({"project": "open", "gpus": 1, "code": "1", "sweep": {"a": list(range(30))}}, "ada", 400, "sweep: "),
        ({"project": "open", "gpus": 1, "priority": True}, "ada", 400, "priority must be a number, got True"),
        (
            {"project": "open", "gpus": 1, "max_runtime_s": -1},
            "ada",
            400,
            "max_runtime_s must be between 0 and",
        ),
        ({"project": "open", "gpus": 1, "code": "x" * (2 << 20)}, "ada", 413, "code"),
    ],
)
def test_each_bad_field_is_refused_with_its_status_and_name(
    body: dict, user: str, status: int, says: str
) -> None:
    with pytest.raises(JobRefused) as err:
        parse(body, user)
    assert err.value.status == status and says in str(err.value), (err.value.status, str(err.value))
