"""Builds the JupyterLab extension (widgets/labextension) with JupyterLab's builder from npm whenever
the package is built (`pip install .`, `pip install -e .`, a wheel), and installs it with the
server extension's switch as data files: users install nothing else.

Everything else about the package is in pyproject.toml.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from setuptools import Command, setup
from setuptools.command.build import build

ROOT = Path(__file__).resolve().parent
LAB = ROOT / "widgets" / "labextension"
OUT = LAB / "build"  # written by the builder; never committed
NAME = "gpupool-lab"
BUILDER = ROOT / "node_modules" / "@jupyterlab" / "builder" / "lib" / "build-labextension.js"
SERVER_SWITCH = "widgets/labextension/jupyter-config/jupyter_server_config.d/gpupool.json"


def sources() -> list[Path]:
    return [p for d in ("src", "schema") for p in (LAB / d).rglob("*") if p.is_file()] + [
        LAB / "package.json"
    ]


def stale() -> bool:
    built = OUT / "package.json"
    return not built.exists() or max(p.stat().st_mtime for p in sources()) > built.stat().st_mtime


def core_path() -> str:
    # the JupyterLab the extension runs in: its staging package.json lists the shared core packages
    import jupyterlab

    return str(Path(jupyterlab.__file__).parent / "staging")


def data_files() -> list[tuple[str, list[str]]]:
    """Every built file under share/jupyter/labextensions/gpupool-lab/, folder by folder."""
    out: dict[str, list[str]] = {}
    for path in sorted(OUT.rglob("*")):
        if path.is_file():
            dest = Path("share/jupyter/labextensions", NAME, path.parent.relative_to(OUT))
            out.setdefault(dest.as_posix(), []).append(path.relative_to(ROOT).as_posix())
    return [*out.items(), ("etc/jupyter/jupyter_server_config.d", [SERVER_SWITCH])]


class BuildLabextension(Command):
    description = "build the JupyterLab extension with @jupyterlab/builder (npm)"
    user_options: list = []
    editable_mode = False

    def initialize_options(self) -> None:
        pass

    def finalize_options(self) -> None:
        pass

    def run(self) -> None:
        if stale():
            npm, node = shutil.which("npm"), shutil.which("node")
            if not (npm and node):
                raise SystemExit("building gpupool's JupyterLab extension needs Node >= 20 and npm on PATH")
            if not BUILDER.exists():
                subprocess.run(
                    [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=ROOT, check=True
                )
            shutil.rmtree(OUT, ignore_errors=True)
            subprocess.run([node, str(BUILDER), "--core-path", core_path(), str(LAB)], cwd=ROOT, check=True)
        files = data_files()
        self.distribution.data_files = files
        install_data = self.distribution.get_command_obj("install_data", create=False)
        if install_data is not None:
            install_data.data_files = files
        if self.editable_mode:
            # `pip install -e .` builds an editable wheel that skips data files (setuptools installs
            # them only for regular wheels): install them into that wheel's data folder here
            self.run_command("install_data")


class BuildWithLabextension(build):
    sub_commands = [("build_labextension", None), *build.sub_commands]


setup(cmdclass={"build": BuildWithLabextension, "build_labextension": BuildLabextension})
