"""`python -m gpupool.idle_culler`: the culler service as a traitlets Application, like
jupyterhub-idle-culler: c.IdleCuller settings from the hub (its environment), a config file
(`--config`) and command-line flags, in that order (the later wins).

The hub starts it (`gpupool.configure(c, culler=True)`) with its settings in the environment;
an admin may start one by hand too (`--once --dry-run` shows what a pass would do) or keep an
arbiter hook in its own config file.
"""

from __future__ import annotations

import json
import logging
import os

from traitlets import Bool, Unicode
from traitlets.config import Application, Config

from gpupool.idle_culler.config import IdleCuller

CONFIG_ENV = "GPUPOOL_CULLER_CONFIG"  # the hub's c.IdleCuller settings, as JSON (service_definition)


class CullerApp(Application):
    name = "gpupool-idle-culler"
    description = "python -m gpupool.idle_culler: GPU-aware idle culling of JupyterHub workspaces"
    classes = [IdleCuller]

    config_file = Unicode(
        "",
        config=True,
        help="""A Python config file (c.IdleCuller... lines) loaded
        over the hub's settings. Example: --config=/etc/gpupool/culler_config.py""",
    )
    gpupool_url = Unicode(
        "",
        config=True,
        help="""URL of the gpupool API service (the hub passes it).
        Example: --gpupool-url=http://127.0.0.1:8095/services/gpupool/""",
    )
    hub_api = Unicode(
        os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api"),
        config=True,
        help="""JupyterHub's API URL (default: $JUPYTERHUB_API_URL, which the hub sets for its
        services). Example: --hub-api=http://hub:8081/hub/api""",
    )
    clock_file = Unicode(
        os.environ.get("GPUPOOL_CULLER_CLOCK", ""),
        config=True,
        help="""Read the time from this file (tests travel in time with it; default:
        $GPUPOOL_CULLER_CLOCK). Example: --clock-file=/tmp/culler-clock""",
    )
    once = Bool(False, config=True, help="""One pass, then exit. Example: --once""")
    generate_config = Bool(
        False,
        config=True,
        help="""Print a config file with every option, then exit. Example: --generate-config""",
    )

    aliases = {
        "config": "CullerApp.config_file",
        "gpupool-url": "CullerApp.gpupool_url",
        "hub-api": "CullerApp.hub_api",
        "clock-file": "CullerApp.clock_file",
        "interval": "IdleCuller.interval_s",
        "idle-limit": "IdleCuller.idle_limit_s",
        "sampler": "IdleCuller.sampler",
        "sampler-arg": "IdleCuller.sampler_arg",
        "concurrency": "IdleCuller.concurrency",
        "metrics-port": "IdleCuller.metrics_port",
        "arbiter": "IdleCuller.arbiter",
        "log-level": "Application.log_level",
    }
    flags = {
        "once": ({"CullerApp": {"once": True}}, "One pass, then exit."),
        "dry-run": ({"IdleCuller": {"dry_run": True}}, "Only report: cull nothing."),
        "generate-config": ({"CullerApp": {"generate_config": True}}, "Print a config file, then exit."),
    }

    def initialize(self, argv: list[str] | None = None) -> None:
        self.parse_command_line(argv)
        hub = json.loads(os.environ.get(CONFIG_ENV) or "{}")
        if hub:  # under the file and the command line
            self.update_config(Config({"IdleCuller": hub}))
        if self.config_file:
            self.load_config_file(self.config_file)  # traitlets re-applies the command line over it

    def settings(self) -> IdleCuller:
        """The culler's settings (checked: a bad value raises TraitError here)."""
        return IdleCuller(parent=self)

    def start(self) -> None:
        self.exit(self.run())

    def run(self) -> int:
        """Print the config file, or cull; the exit status."""
        if self.generate_config:  # each setting once: the old names of renamed options left out
            old = tuple(
                f"# c.IdleCuller.{name} = "
                for name, trait in IdleCuller.class_own_traits(config=True).items()
                if trait.metadata.get("deprecated")
            )
            blocks = self.generate_config_file().split("\n\n")
            print("\n\n".join(b for b in blocks if not any(line.startswith(old) for line in b.splitlines())))
            return 0
        if not self.gpupool_url:
            self.log.critical("--gpupool-url is required (the hub passes it when it starts the culler)")
            return 2
        from gpupool.idle_culler.service import run

        logging.basicConfig(level=logging.INFO, format="[%(levelname).1s %(asctime)s culler] %(message)s")
        return run(self.settings(), self.gpupool_url, self.hub_api, self.once, self.clock_file or None)


def main(argv: list[str] | None = None) -> int:
    app = CullerApp()
    app.initialize(argv)
    return app.run()


__all__ = ["CONFIG_ENV", "CullerApp", "main"]
