"""One import namespace: the design card's folders install only as `gpupool.*`.

A module loaded under two names is two modules (two SQLAlchemy metadata, two registries of
placement policies, two copies of every traitlets class); a top-level `widgets` shadows a user's own
folder. These tests fail when either comes back, or when the four folders import in a circle."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import importlib.util
import pkgutil
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = {
    "hub_ext": "gpupool",
    "spawner": "gpupool.spawner",
    "idle_culler": "gpupool.idle_culler",
    "widgets": "gpupool.widgets",
}
# The wiring at the top of the package: it names every part (the hub set-up starts the culler
# service, `%load_ext gpupool` loads the widgets); nothing below may import it back.
WIRING = {
    "gpupool",
    "gpupool.wiring.setup",
    "gpupool.wiring.cli",
    "gpupool.wiring.embedded",
    "gpupool.wiring.embedded_config",
    "gpupool.wiring.stop_jobs",  # `gpupool stop-jobs`: reads the embedded hub's settings as `up` does
}
# imported only inside the hub (they read `c` from jupyterhub_config.py when imported)
SKIP = {"gpupool.wiring.embedded_config"}


def all_modules() -> list[str]:
    # the three subpackages live in their own folders, so each is walked from its own path
    names = []
    for top in FOLDERS.values():
        pkg = importlib.import_module(top)
        names.append(top)
        for info in pkgutil.walk_packages(pkg.__path__, f"{top}."):
            if info.name not in SKIP and info.name not in names and not info.name.endswith("__main__"):
                names.append(info.name)
    return names


def module_files() -> dict[str, list[str]]:
    """Every loaded module whose file is in one of the four folders, by file."""
    by_file: dict[str, list[str]] = {}
    roots = tuple(str(REPO / f) + "/" for f in FOLDERS)
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        if f and f.startswith(roots):
            by_file.setdefault(f, []).append(name)
    return by_file


def test_every_module_imports_once_under_gpupool():
    names = all_modules()
    assert "gpupool.spawner.local" in names and "gpupool.idle_culler.policy" in names
    for name in names:
        importlib.import_module(name)
    loaded = module_files()
    doubled = {f: n for f, n in loaded.items() if len(n) > 1}
    foreign = {f: n for f, n in loaded.items() if not all(x.startswith("gpupool") for x in n)}
    assert not doubled, f"modules loaded under two names: {doubled}"
    assert not foreign, f"modules loaded outside gpupool: {foreign}"
    from gpupool.store.models import Base

    tables = [
        m
        for m in list(sys.modules.values())
        if getattr(m, "Base", None) is not None
        and hasattr(m.Base, "metadata")
        and m.__name__.startswith("gpupool")
    ]
    assert {id(m.Base.metadata) for m in tables} == {id(Base.metadata)}


def test_the_folders_are_not_importable_by_their_own_names():
    # as a user's kernel or the hub sees it: outside the clone (pytest itself has the clone on its path)
    probe = "import importlib.util as u; print([n for n in FOLDERS if u.find_spec(n)])".replace(
        "FOLDERS", repr(list(FOLDERS))
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd="/", check=True)
    assert out.stdout.strip() == "[]"


def test_wheel_installs_nothing_but_gpupool(tmp_path):
    had_build = (REPO / "build").exists()
    try:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "-q",
                "-w",
                str(tmp_path),
                str(REPO),
            ],
            check=True,
            capture_output=True,
            cwd=tmp_path,
        )
    finally:
        if not had_build:  # pip builds in the source tree
            shutil.rmtree(REPO / "build", ignore_errors=True)
    (wheel,) = tmp_path.glob("gpupool-*.whl")
    tops = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith((".dist-info", ".data"))} == {"gpupool"}
    files = set(zipfile.ZipFile(wheel).namelist())
    # the JupyterLab extension, built from widgets/labextension, and its server side's switch
    data = "gpupool-0.1.0.data/data/"
    assert {
        data + "share/jupyter/labextensions/gpupool-lab/package.json",
        data + "etc/jupyter/jupyter_server_config.d/gpupool.json",
    } <= files
    assert any(
        f.startswith(data + "share/jupyter/labextensions/gpupool-lab/static/remoteEntry.") for f in files
    )
    assert not any("labextension" in f for f in files if f.startswith("gpupool/"))
    for expected in (
        "gpupool/spawner/local.py",
        "gpupool/idle_culler/__main__.py",
        "gpupool/widgets/magics.py",
        "gpupool/gpu/startup/sitecustomize.py",
        "gpupool/templates/home.html",
        # gpupool's own pages and fragments (gpupool.hub.templating renders them)
        "gpupool/templates/gpupool-spawn-form.html",
        "gpupool/templates/gpupool-extend.html",
        "gpupool/templates/gpupool-plot.html",
        "gpupool/templates/gpupool-usage-plot.html",
        # alembic's environment and revisions: the hub upgrades its database from these
        "gpupool/store/migrations/env.py",
        "gpupool/store/migrations/script.py.mako",
        "gpupool/store/migrations/versions/0001_baseline.py",
    ):
        assert expected in files
    # every module of the four folders, sub-packages included (a package missing from
    # pyproject's list installs from a checkout but not from the wheel the images install)
    folders = {
        "hub_ext": "gpupool",
        "spawner": "gpupool/spawner",
        "idle_culler": "gpupool/idle_culler",
        "widgets": "gpupool/widgets",
    }
    for folder, prefix in folders.items():
        for module in (REPO / folder).rglob("*.py"):
            rel = module.relative_to(REPO / folder).as_posix()
            if "labextension" in rel or (
                folder == "hub_ext" and rel.split("/")[0] in ("spawner", "idle_culler", "widgets")
            ):
                continue
            assert f"{prefix}/{rel}" in files, f"{folder}/{rel} is not in the wheel"


def test_spawners_are_jupyterhub_entry_points():
    from jupyterhub.app import JupyterHub

    eps = {ep.name: ep for ep in importlib.metadata.entry_points(group="jupyterhub.spawners")}
    from gpupool.spawner import GPULocalProcessSpawner, GPUSimpleLocalProcessSpawner
    from gpupool.spawner.kube import GPUKubeSpawner

    assert eps["gpupool-local"].load() is GPULocalProcessSpawner
    assert eps["gpupool-simple"].load() is GPUSimpleLocalProcessSpawner
    assert eps["gpupool-kubernetes"].load() is GPUKubeSpawner
    # JupyterHub itself resolves the short name
    assert JupyterHub(spawner_class="gpupool-local").spawner_class is GPULocalProcessSpawner


def test_load_ext_gpupool_registers_the_magics():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        shell.run_line_magic("load_ext", "gpupool")
        assert "gpupool" in shell.magics_manager.magics["line"]
        assert "train" in shell.magics_manager.magics["cell"]
    finally:
        InteractiveShell.clear_instance()


def test_culler_runs_as_a_gpupool_module():
    out = subprocess.run(
        [sys.executable, "-m", "gpupool.idle_culler", "--help"], capture_output=True, text=True, cwd="/"
    )
    assert out.returncode == 0 and "python -m gpupool.idle_culler" in out.stdout


def _imports(path: Path, module: str) -> set[str]:
    pkg = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from gpupool import tasks` imports the module gpupool.hub.tasks
            subs = [
                f"{target}.{a.name}"
                for a in node.names
                if target.startswith("gpupool") and _is_module(f"{target}.{a.name}")
            ]
            found.update(subs or [target])
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {f for f in found if f.startswith("gpupool")}


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # the parent is a module, so `name` is an attribute
        return False


def _part(module: str) -> str:
    for sub in ("spawner", "idle_culler", "widgets"):
        if module == f"gpupool.{sub}" or module.startswith(f"gpupool.{sub}."):
            return sub
    return "wiring" if module in WIRING else "core"


def test_imports_point_one_way():
    """wiring -> spawner, idle_culler, widgets -> core; the three never import each other."""
    allowed = {
        "wiring": {"core", "spawner", "idle_culler", "widgets"},
        "spawner": {"core"},
        "idle_culler": {"core"},
        "widgets": {"core"},
        "core": set(),
    }
    wrong = []
    for folder, top in FOLDERS.items():
        for path in (REPO / folder).rglob("*.py"):
            rel = path.relative_to(REPO / folder).with_suffix("").parts
            rel = rel[:-1] if rel[-1] == "__init__" else rel
            module = ".".join((top, *rel))
            for target in _imports(path, module):
                a, b = _part(module), _part(target)
                if a != b and b not in allowed[a]:
                    wrong.append(f"{path.relative_to(REPO)} ({a}) imports {target} ({b})")
    assert not wrong, "\n".join(wrong)
