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
    args = ap.parse_args(shlex.split(line))
    params = {}
    for item in args.param:
        key, _, value = item.partition("=")
        try:
            params[key] = json.loads(value)
        except ValueError:
            params[key] = value  # a bare word is a string
    args.parameters = params
    return args


def register(ipython: Any) -> None:
    from IPython.display import display

    from .client import Client, GPUPoolError
    from .jobs import JobMonitor
    from .status import WorkspaceStatus

    def gpupool(line: str = "") -> None:
        """%gpupool — the GPU share this workspace holds and the quota left."""
        display(WorkspaceStatus())

    def train(line: str, cell: str) -> None:
        """%%train --project P [--gpus 1] [--name N] [--priority 0] [-p key=value ...]
        Runs this cell as a train job in the shared pool and shows its progress."""
        try:
            args = train_args(line)
        except SystemExit:
            print("usage: %%train --project P [--gpus 1] [--name N] [--priority 0] [-p key=value ...]")
            return
        try:
            job = Client().post("api/jobs", {"project": args.project, "gpus": args.gpus, "name": args.name,
                                             "priority": args.priority, "code": cell,
                                             "parameters": args.parameters})
        except GPUPoolError as err:
            print(f"not submitted: {err}")
            return
        print(f"submitted job {job['id']} to {args.project}")
        display(JobMonitor(job_id=job["id"]))

    ipython.register_magic_function(gpupool, "line", "gpupool")
    ipython.register_magic_function(train, "cell", "train")
