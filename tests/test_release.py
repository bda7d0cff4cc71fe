"""What a release hands users: the sdist and wheel `python -m build` makes, the wheel installed into a
fresh virtualenv on a machine without Node (JupyterLab lists the prebuilt extension as enabled,
JupyterHub finds the spawners), and the metadata that ties the pieces to one version."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
# the dev venv's own bin folder: python, pip, uv, but no node or npm (those are in /usr/bin and
# ./node_modules/.bin, both left off)
VENV_BIN = str(Path(sys.executable).parent)


def _no_node_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "JUPYTER"))}
    env.update(PATH=VENV_BIN, **extra)
    assert shutil.which("node", path=env["PATH"]) is None and shutil.which("npm", path=env["PATH"]) is None
    return env


def test_classifiers_are_pypis_and_name_the_prebuilt_lab_extension():
    from trove_classifiers import classifiers

    ours = PYPROJECT["project"]["classifiers"]
    assert not [c for c in ours if c not in classifiers], "PyPI refuses an upload with unknown classifiers"
    # how JupyterLab's extension manager and PyPI's search find a prebuilt extension
    assert "Framework :: Jupyter :: JupyterLab :: Extensions :: Prebuilt" in ours


def test_one_version_everywhere():
    lab = json.loads((REPO / "widgets/labextension/package.json").read_text())
    assert lab["version"] == VERSION  # what `jupyter labextension list` shows
    assert f"## [{VERSION}]" in (REPO / "CHANGELOG.md").read_text()
    assert (
        "BSD 3-Clause" in (REPO / "LICENSE").read_text() and PYPROJECT["project"]["license"] == "BSD-3-Clause"
    )


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """The sdist, made from the checkout as `python -m build` makes it, and the wheel made from that
    sdist with Node off PATH (as pip does for `pip install gpupool-X.tar.gz` on a machine without it)."""
    out = tmp_path_factory.mktemp("dist")
    # the checkout's extension build is made fresh by `make venv` (the sdist's own build step would
    # make it again with Node were it stale)
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--sdist", "-o", str(out), str(REPO)],
        check=True,
        capture_output=True,
    )
    (sdist,) = out.glob(f"gpupool-{VERSION}.tar.gz")
    with tarfile.open(sdist) as tar:
        tar.extractall(out / "src", filter="data")
    src = out / "src" / f"gpupool-{VERSION}"
    built = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--wheel", "-o", str(out), str(src)],
        capture_output=True,
        text=True,
        env=_no_node_env(),
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = out.glob(f"gpupool-{VERSION}-py3-none-any.whl")
    yield {"sdist": sdist, "wheel": wheel}


@pytest.mark.release
def test_sdist_holds_the_built_extension_and_no_half_test_suite(dist):
    names = {n.split("/", 1)[1] for n in tarfile.open(dist["sdist"]).getnames() if "/" in n}
    assert {"LICENSE", "CHANGELOG.md", "SECURITY.md", "setup.py", "package-lock.json"} <= names
    assert "widgets/labextension/build/package.json" in names
    assert any(n.startswith("widgets/labextension/build/static/remoteEntry.") for n in names)
    assert not any(n.startswith(("tests/", "helm/", "benchmarks/")) for n in names)


@pytest.mark.release
def test_wheel_installs_without_node_and_jupyter_finds_both_sides(dist, tmp_path):
    wheel = dist["wheel"]
    files = set(zipfile.ZipFile(wheel).namelist())
    data = f"gpupool-{VERSION}.data/data/share/jupyter/labextensions/gpupool-lab/"
    assert {
        data + "package.json",
        data + "install.json",
        f"gpupool-{VERSION}.dist-info/licenses/LICENSE",
    } <= files
    meta = zipfile.ZipFile(wheel).read(f"gpupool-{VERSION}.dist-info/METADATA").decode()
    assert "Classifier: Framework :: Jupyter :: JupyterLab :: Extensions :: Prebuilt" in meta

    # a fresh venv, the tested set of dependencies (uv: seconds from its cache, where pip takes minutes)
    venv = tmp_path / "venv"
    env = _no_node_env(HOME=str(tmp_path))  # no user-level Jupyter folders either
    env.pop("XDG_CACHE_HOME", None)
    env["UV_CACHE_DIR"] = os.environ.get("UV_CACHE_DIR") or str(Path.home() / ".cache" / "uv")
    env["UV_PYTHON_DOWNLOADS"] = "never"  # the interpreter running the tests, never one uv fetches
    subprocess.run(
        [f"{VENV_BIN}/uv", "venv", "-q", "--python", sys.executable, str(venv)], check=True, env=env
    )
    subprocess.run(
        [
            f"{VENV_BIN}/uv",
            "pip",
            "install",
            "-q",
            "--python",
            str(venv / "bin" / "python"),
            "-c",
            str(REPO / "requirements" / "constraints.txt"),
            f"{wheel}[kubernetes]",
        ],
        check=True,
        env=env,
    )
    env["PATH"] = str(venv / "bin")
    assert shutil.which("node", path=env["PATH"]) is None

    listed = subprocess.run(
        [str(venv / "bin" / "jupyter"), "labextension", "list"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    line = next((x for x in (listed.stdout + listed.stderr).splitlines() if "gpupool-lab" in x), "")
    # "gpupool-lab v0.1.0 enabled OK (python, gpupool)": installed by the Python package, nothing to build
    assert f"gpupool-lab v{VERSION}" in line and "enabled" in line and "OK" in line, (
        listed.stdout + listed.stderr
    )
    assert "(python, gpupool)" in line
    server = subprocess.run(
        [str(venv / "bin" / "jupyter"), "server", "extension", "list"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert "gpupool.widgets.labserver" in server.stdout + server.stderr
    assert "enabled" in next(x for x in (server.stdout + server.stderr).splitlines() if "labserver" in x)

    # JupyterHub resolves the short names, from the installed wheel (not the checkout)
    probe = (
        "import gpupool, jupyterhub.app as a; from traitlets import import_item;"
        "print(gpupool.__file__);"
        "[print(n, a.JupyterHub(spawner_class=n).spawner_class.__name__) "
        "for n in ('gpupool-local', 'gpupool-simple', 'gpupool-kubernetes')]"
    )
    ran = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    lines = ran.stdout.splitlines()
    assert lines[0].startswith(str(venv))
    assert lines[1:] == [
        "gpupool-local GPULocalProcessSpawner",
        "gpupool-simple GPUSimpleLocalProcessSpawner",
        "gpupool-kubernetes GPUKubeSpawner",
    ]
