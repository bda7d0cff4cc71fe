"""Builds the JupyterLab extension (widgets/labextension) with JupyterLab's builder from npm whenever
the package is built from a checkout (`pip install .`, `pip install -e .`, a wheel, an sdist), and
installs it with the server extension's switch as data files: users install nothing else.

The sdist carries the built extension (`python -m build` makes the sdist first, which builds it),
and a build from an sdist uses it as it is, as hatch-jupyter-builder's `skip-if-exists` does: a
wheel made from the sdist, or `pip install gpupool-X.tar.gz`, needs no Node. The wheel itself holds
the built extension (a "prebuilt" JupyterLab extension): installing it needs neither.

Everything else about the package is in pyproject.toml (which says why setuptools, not hatchling).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from setuptools import Command, setup
from setuptools.command.build import build
from setuptools.command.sdist import sdist

ROOT = Path(__file__).resolve().parent
LAB = ROOT / "widgets" / "labextension"
OUT = LAB / "build"  # written by the builder; never committed
NAME = "gpupool-lab"
BUILDER = ROOT / "node_modules" / "@jupyterlab" / "builder" / "lib" / "build-labextension.js"
SERVER_SWITCH = "widgets/labextension/jupyter-config/jupyter_server_config.d/gpupool.json"
# tells `jupyter labextension list` (and JupyterLab's extension manager) which Python package
# installed the extension and how to remove it
INSTALL_JSON = "widgets/labextension/install.json"


def sources() -> list[Path]:
    return [p for d in ("src", "schema") for p in (LAB / d).rglob("*") if p.is_file()] + [
        LAB / "package.json"
    ]


def from_sdist() -> bool:
    # an unpacked sdist has PKG-INFO at its root; a checkout does not
    return (ROOT / "PKG-INFO").exists()


def stale() -> bool:
    built = OUT / "package.json"
    if from_sdist() and built.exists():
        return False  # built when the sdist was made: no Node where it is installed
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
    out[f"share/jupyter/labextensions/{NAME}"].append(INSTALL_JSON)
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


class SdistWithLabextension(sdist):
    # the sdist holds the built extension (MANIFEST.in), so it is built (if stale) before the file list
    def run(self) -> None:
        self.run_command("build_labextension")
        super().run()


setup(
    cmdclass={
        "build": BuildWithLabextension,
        "build_labextension": BuildLabextension,
        "sdist": SdistWithLabextension,
    }
)
