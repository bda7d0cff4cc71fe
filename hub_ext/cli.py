"""`gpupool` command line: `up` runs the embedded hub, `simulate` the pool simulator."""

from __future__ import annotations

import argparse
import os
import sys

from traitlets import TraitError
from traitlets.config import Application, Config

from .config import GPUPool

HERE = os.path.dirname(os.path.abspath(__file__))


def config_classes() -> list[type]:
    """Every configurable class an admin may set in a gpupool config file."""
    from .parking import GPUParking
    from .train.config import TrainPool

    classes: list[type] = [GPUPool, TrainPool, GPUParking]
    try:
        from gpupool.idle_culler.config import config_classes as culler_classes
    except ImportError:  # the culler is optional
        culler_classes = None
    if culler_classes is not None:
        classes += culler_classes()
    return classes


class _ConfigWriter(Application):
    name = "gpupool"
    description = "gpupool configuration"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.classes = config_classes()


def generate_config(path: str) -> None:
    text = _ConfigWriter().generate_config_file()
    header = (
        "# gpupool configuration: every option with its help text and an example.\n"
        "# Use it with `gpupool up --config THIS_FILE`, or paste the settings into your\n"
        "# jupyterhub_config.py before `gpupool.configure(c)`.\n\n"
    )
    if os.path.exists(path):
        raise SystemExit(f"gpupool: {path} exists; remove it or pick another name")
    with open(path, "w") as f:
        f.write(header + text)
    print(f"wrote {path}")


def check_config(path: str) -> Config:
    """Load and validate an admin's config so a mistake stops `up` with a clear message."""
    from .embedded import load_user_config

    c = Config()
    load_user_config(c, path)
    from .setup import validate

    try:
        validate(c)
    except (TraitError, ValueError) as err:
        raise SystemExit(f"gpupool: invalid configuration in {path}: {err}") from None
    return c


def up(args: argparse.Namespace) -> int:
    if args.generate_config:
        generate_config(args.generate_config)
        return 0
    state = os.path.abspath(args.state)
    os.makedirs(state, exist_ok=True)
    config = os.path.abspath(args.config) if args.config else ""
    check_config(config)
    from .embedded import chp_command, demo_password

    env = dict(os.environ, GPUPOOL_STATE_DIR=state, GPUPOOL_CONFIG=config, GPUPOOL_PORT=str(args.port),
               GPUPOOL_CHP=chp_command())
    password = demo_password(state)
    print(
        f"gpupool: embedded hub on http://127.0.0.1:{args.port}\n"
        f"  log in with any user name and the password: {password}\n"
        f"  (user 'admin' is an admin; state lives in {state})\n",
        flush=True,
    )
    argv = [sys.executable, "-m", "jupyterhub", "-f", os.path.join(HERE, "embedded_config.py")]
    os.chdir(state)
    os.execvpe(argv[0], argv, env)
    return 0  # not reached


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["simulate"]:
        from .sim.cli import main as simulate

        return simulate(argv[1:])
    parser = argparse.ArgumentParser(prog="gpupool", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="run the embedded hub on this machine")
    p_up.add_argument("--config", default="", help="a gpupool config file (c.GPUPool... settings)")
    p_up.add_argument("--generate-config", nargs="?", const="gpupool_config.py", default="",
                      metavar="FILE", help="write a commented config file and exit")
    p_up.add_argument("--state", default="state", help="folder for databases and homes (default ./state)")
    p_up.add_argument("--port", type=int, default=8000, help="public port (default 8000)")
    sub.add_parser("simulate", help="run the pool simulator (gpupool simulate --help)")
    args = parser.parse_args(argv)
    if args.command == "up":
        return up(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
