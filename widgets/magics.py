"""IPython magics: `%gpupool` shows this workspace's status; `%%train` promotes a cell."""

from __future__ import annotations

import argparse
import json
import shlex
from typing import Any


def train_args(line: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="%%train", add_help=False)
    ap.add_argument("--project", required=True)
    ap.add_argument("--gpus", type=float, default=1.0)
    ap.add_argument("--name", default="cell")
    ap.add_argument("--priority", type=int, default=0)
    ap.add_argument("-p", "--param", action="append", default=[], metavar="KEY=JSON")
    ap.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2")
    args = ap.parse_args(shlex.split(line))
    args.sweep_spec = {}
    for item in args.sweep:  # one job per combination of the values (the hub checks the bounds)
        key, _, values = item.partition("=")
        args.sweep_spec[key] = [_value(v) for v in values.split(",")]
    args.parameters = {key: _value(value) for key, _, value in (p.partition("=") for p in args.param)}
    return args


def projects_help(data: dict) -> str:
    """The projects a user may submit to, with their guarantee and node pools (api/projects)."""
    lines = ["projects:"]
    for p in data.get("projects", []):
        pools = ", ".join(p.get("pools") or []) or "any GPU"
        lines.append(f"  {p['name']}: guarantee {p['guarantee_milli'] / 1000:g} GPUs, pools: {pools}")
    return "\n".join(lines)


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text  # a bare word is a string


def register(ipython: Any) -> None:
    from IPython.display import display

    from .client import Client, GPUPoolError
    from .jobs import JobMonitor
    from .status import WorkspaceStatus

    def gpupool(line: str = "") -> None:
        """%gpupool — the GPU share this workspace holds and the quota left."""
        display(WorkspaceStatus())

    def train(line: str, cell: str) -> None:
        """%%train --project P [--gpus 1] [--name N] [--priority 0] [-p key=value ...] [--sweep key=v1,v2 ...]
        Runs this cell as a train job in the shared pool and shows its progress; with --sweep,
        one job per combination of the values."""
        usage = ("usage: %%train --project P [--gpus 1] [--name N] [--priority 0] [-p key=value ...]"
                 " [--sweep key=v1,v2 ...]")
        if line.split()[:1] == ["--help"]:
            print(usage)
            try:
                print(projects_help(Client().get("api/projects")))
            except GPUPoolError as err:
                print(f"(projects unavailable: {err})")
            return
        try:
            args = train_args(line)
        except SystemExit:
            print(usage)
            return
        payload = {"project": args.project, "gpus": args.gpus, "name": args.name, "priority": args.priority,
                   "code": cell, "parameters": args.parameters}
        if args.sweep_spec:
            payload["sweep"] = args.sweep_spec
        try:
            job = Client().post("api/jobs", payload)
        except GPUPoolError as err:
            print(f"not submitted: {err}")
            return
        if "sweep" in job:  # GET api/sweeps/<id> gives each run's parameters and final metrics
            print(f"submitted sweep {job['sweep']}: {len(job['jobs'])} jobs to {args.project}")
            for run in job["jobs"]:
                display(JobMonitor(job_id=run["id"]))
            return
        print(f"submitted job {job['id']} to {args.project}")
        display(JobMonitor(job_id=job["id"]))

    ipython.register_magic_function(gpupool, "line", "gpupool")
    ipython.register_magic_function(train, "cell", "train")
