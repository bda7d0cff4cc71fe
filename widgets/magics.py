"""IPython magics: `%gpupool` shows this workspace's status; `%%train` promotes a cell."""

from __future__ import annotations

import argparse
import json
import shlex
from typing import Any

from gpupool.vocab.job_wire import job_body
from gpupool.vocab.priority import PRIORITY_MAX, PRIORITY_MIN


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one plain line for the user, not argparse's exit and stderr
        raise ValueError(message)


def _priority(text: str) -> int:
    if not text.lstrip("-").isdigit() or len(text) > 5 or not PRIORITY_MIN <= int(text) <= PRIORITY_MAX:
        raise argparse.ArgumentTypeError(
            f"a whole number from {PRIORITY_MIN} to {PRIORITY_MAX}, not {text[:20]!r}"
        )
    return int(text)


def train_parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="%%train",
        add_help=False,
        description="Run this cell as a train job in the shared pool and follow it below.",
    )
    ap.add_argument("--project", required=True, help="the training project whose quota the job uses")
    ap.add_argument(
        "--gpus", type=float, default=1.0, help="GPUs for the job: 0.25, 0.5, 1, 2, ... (default 1)"
    )
    ap.add_argument("--name", default="cell", help="a name for the job (default: cell)")
    ap.add_argument(
        "--priority",
        type=_priority,
        default=0,
        help=f"{PRIORITY_MIN}..{PRIORITY_MAX} within the project, higher first (default 0)",
    )
    ap.add_argument(
        "-p",
        "--param",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="a parameter set before the cell runs, e.g. -p lr=0.01 -p tag=baseline",
    )
    ap.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="one job per combination of the values, e.g. --sweep lr=0.1,0.01 --sweep batch=32,64",
    )
    ap.add_argument(
        "--pool",
        action="append",
        default=[],
        metavar="NODE_POOL",
        help="run only on these of the project's node pools, in this order, e.g. --pool dgx",
    )
    ap.add_argument("-h", "--help", action="store_true", help="this help, with your projects")
    return ap


def train_args(line: str) -> argparse.Namespace:
    args = train_parser().parse_args(shlex.split(line))
    params = {}
    for item in args.param:
        key, _, value = item.partition("=")
        try:
            params[key] = json.loads(value)
        except ValueError:
            params[key] = value  # a bare word is a string
    args.parameters = params
    from gpupool.widgets.sweep import sweep_spec  # the widget's sweep field reads the same syntax

    args.sweep_spec = sweep_spec(args.sweep)  # one job per combination (the hub checks the bounds)
    return args


def _gpus(milli: int) -> str:
    text = f"{milli / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{text} GPU" if milli <= 1000 else f"{text} GPUs"


def projects_text(projects: list[dict[str, Any]]) -> str:
    """The projects a user may submit to, with what each has free within its guarantee."""
    if not projects:
        return "No training projects are configured on this hub (ask an admin: c.TrainPool.projects)."
    width = max(len(p["name"]) for p in projects)
    lines = ["Your projects (--project NAME):"]
    for p in projects:
        free = max(0, p["guarantee_milli"] - p["used_milli"])
        limit = f", at most {_gpus(p['limit_milli'])}" if p.get("limit_milli", -1) >= 0 else ""
        per_pool = ", ".join(
            f"{g['pool']} {_gpus(g['guarantee_milli']).split()[0]}" for g in p.get("pool_guarantees") or []
        )
        per_pool = f" ({per_pool})" if per_pool else ""
        lines.append(
            f"  {p['name']:<{width}}  {_gpus(p['guarantee_milli'])} guaranteed{per_pool},"
            f" {_gpus(free)} of them free"
            f" now{limit}; {p.get('queued', 0)} queued{_pools(p)}"
            f"{'' if p.get('may_submit', True) else ' (members only: not open to you)'}"
        )
    return "\n".join(lines)


def _pools(project: dict[str, Any]) -> str:
    pools = project.get("pools") or []
    return f"; GPUs from {', '.join(pools)}" if pools else ""


def train_help(projects: list[dict[str, Any]] | None) -> str:
    text = train_parser().format_help().rstrip()
    if projects is not None:
        text += "\n\n" + projects_text(projects)
    return text + "\n\nExample:\n  %%train --project NAME --gpus 1 -p epochs=3"


def demo_gpu_use(words: list[str], client: Any = None) -> str:
    """`%gpupool gpu busy|idle`: what the culling demo's culler reads as this workspace's GPU use."""
    import os

    from gpupool.widgets.client import Client, GPUPoolError

    if words not in (["busy"], ["idle"]):
        return "%gpupool gpu busy (the GPU computes) or %gpupool gpu idle (it does not)"
    server = os.environ.get("JUPYTERHUB_SERVER_NAME", "")
    try:
        (client or Client()).post("api/demo/gpu-use", {"server": server, "busy": words[0] == "busy"})
    except GPUPoolError as err:
        return f"%gpupool gpu: {err}"
    if words[0] == "busy":
        return "this workspace's GPU now counts as busy (100 %): the culler neither parks nor stops it for idleness"
    return (
        "this workspace's GPU now counts as idle: after 2 min it is parked (a cell brings it back),"
        " as the demo's culler decides at its next pass"
    )


def register(ipython: Any) -> None:
    from IPython.display import display

    from gpupool.widgets.client import Client, GPUPoolError
    from gpupool.widgets.jobs import JobMonitor
    from gpupool.widgets.status import live_view
    from gpupool.widgets.sweep import SweepTable

    def gpupool(line: str = "") -> None:
        """%gpupool — this workspace's GPU share, its use, when it stops, the quota and the train projects.
        JupyterLab keeps it current while the tab is visible; reading it is not user activity.
        %gpupool hibernate — save the variables of this server's kernels to your home and stop
        the server (its GPU share is freed); they come back when you start it and open the notebook.
        %gpupool gpu busy|idle — in the culling demo (gpupool up --demo-culling): say what this
        workspace's GPU does, as the culler will see it."""
        words = line.split()
        if words[:1] == ["gpu"]:
            print(demo_gpu_use(words[1:]))
            return
        if words == ["hibernate"]:
            from gpupool.gpu.hibernate import hibernate_now
            from gpupool.widgets.hibernation import asked_hub

            on, why = asked_hub()  # where it is off for the user's group, nothing is saved
            if not on:
                print(f"%gpupool hibernate: {why}; nothing was saved or stopped")
                return
            hibernate_now(ipython)
            return
        if words:
            print(
                f"%gpupool: unknown {line.strip()[:40]!r}; use %gpupool, %gpupool hibernate, or %gpupool gpu busy|idle in the demo"
            )
            return
        display(live_view(), raw=True)

    def train(line: str, cell: str | None = None) -> None:
        """%%train --project P [--gpus 1] [--name N] [--priority 0] [-p key=value ...] [--sweep key=v1,v2 ...]
        Runs this cell as a train job in the shared pool and shows its progress; with --sweep, one
        job per combination of the values (%%train --help)."""
        try:
            wants_help = bool({"-h", "--help"} & set(shlex.split(line)))
            args = None if wants_help else train_args(line)
        except ValueError as err:
            print(f"%%train: {err}; see %%train --help")
            return
        if (
            args is None or cell is None
        ):  # `%train --help` works as a line too (IPython refuses an empty %%cell)
            try:
                projects = Client().get("api/projects")["projects"]
            except GPUPoolError:
                projects = None
            print(train_help(projects))
            return
        payload = job_body(
            args.project,
            args.gpus,
            args.name,
            args.priority,
            args.parameters,
            "code",
            cell,
            sweep=args.sweep_spec,
            pools=args.pool,
        )
        try:
            job = Client().post("api/jobs", payload)
        except GPUPoolError as err:
            print(f"not submitted: {err}")
            return
        if "sweep" in job:  # its runs together: parameters and final metrics (api/sweeps/<id>)
            print(f"submitted sweep {job['sweep']}: {len(job['jobs'])} jobs to {args.project}")
            display(SweepTable(job["sweep"]))
            return
        print(f"submitted job {job['id']} to {args.project}")
        display(JobMonitor(job_id=job["id"]))

    ipython.register_magic_function(gpupool, "line", "gpupool")
    ipython.register_magic_function(train, "line_cell", "train")
