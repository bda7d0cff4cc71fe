"""The users' Python environment in a system prefix, for a root hub whose installation is private.

A clone in root's home (mode 0700) holds the hub's virtualenv and, with `make venv`'s editable
install, gpupool's own code: the `jupyter-<name>` accounts cannot read either, so they could run
neither a server nor a train job. As TLJH does (`/opt/tljh/user`), `gpupool up` then puts the
users' environment under a system prefix, `/opt/gpupool/<install key>/`, owned by root and
readable (never writable) by every account:

- `site-packages/`: the hub's packages (hard links where the file is already readable by all, else
  copies) and a copy of gpupool's own code in place of the editable install's finder, which
  points into the clone;
- `share/jupyter`, `etc/jupyter`: JupyterLab's and gpupool's extensions and switches;
- `env/`: a venv of the system's Python (same minor version, same ABI) that reads `site-packages/`.

The install key names the installation (a hash of the hub's prefix), so every hub of one clone
shares one copy. The copy is remade when its content hash — gpupool's code, and the names, sizes
and times of the installed packages — differs from the hub's: a `git pull` or `pip install`
shows at the next start. Workspaces and jobs take every file from here (wrap.py and the start-up
hook through GPUPOOL_USER_PACKAGE), never from the clone.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = "/opt/gpupool"
STATE_ROOT = "/var/lib/gpupool"  # a root hub's state when ./state is in a private folder
STAMP = "content-hash"
PACKAGE_VAR = "GPUPOOL_USER_PACKAGE"  # the gpupool package workspaces and jobs take files from
# gpupool's packages as they install (pyproject's package-dir): top level first
PACKAGES = ("gpupool", "gpupool.spawner", "gpupool.idle_culler", "gpupool.widgets")
JUPYTER_FOLDERS = (("share", "jupyter"), ("etc", "jupyter"))


class SystemEnvError(Exception):
    """The users' environment could not be put in the system prefix: the message says why."""


def install_key(prefix: str | None = None) -> str:
    """One key per installation (the hub's Python prefix, links resolved)."""
    real = os.path.realpath(prefix or sys.prefix)
    return hashlib.sha256(real.encode()).hexdigest()[:12]


def package_dirs() -> dict[str, Path]:
    """Where each of gpupool's packages is read from now (the clone's folders with an editable
    install)."""
    import importlib

    return {name: Path(importlib.import_module(name).__path__[0]) for name in PACKAGES}


def _source_files(folder: Path):
    for path in sorted(folder.rglob("*")):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        yield path


def content_hash(purelib: str | None = None, prefix: str | None = None) -> str:
    """What the copy must match: gpupool's code (contents) and the installed packages and Jupyter
    folders (names, sizes, times of their top-level entries: a pip install changes them)."""
    digest = hashlib.sha256()
    for name, folder in package_dirs().items():
        for path in _source_files(folder):
            digest.update(f"{name}/{path.relative_to(folder)}\0".encode())
            digest.update(path.read_bytes())
    tops = [Path(purelib or sysconfig.get_paths()["purelib"])]
    tops += [Path(prefix or sys.prefix, *parts) for parts in JUPYTER_FOLDERS]
    for top in tops:
        if not top.is_dir():
            continue
        for entry in sorted(os.scandir(top), key=lambda e: e.name):
            st = entry.stat(follow_symlinks=False)
            digest.update(f"{top.name}/{entry.name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return digest.hexdigest()


def _is_editable_finder(name: str) -> bool:
    return name.startswith("__editable__") and "gpupool" in name


def _mirror(src: Path, dst: Path) -> None:
    """`src` into the new folder `dst`: folders made 0755; a file readable by all is hard linked
    (no copy of a GB of packages), any other copied 0644 (0755 if executable); links kept."""
    dst.mkdir(mode=0o755)
    os.chmod(dst, 0o755)
    for entry in os.scandir(src):
        if src.name == "site-packages" and _is_editable_finder(entry.name):
            continue  # points into the clone: gpupool's code is copied instead
        target = dst / entry.name
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), target)
        elif entry.is_dir(follow_symlinks=False):
            _mirror(Path(entry.path), target)
        elif entry.is_file(follow_symlinks=False):
            st = entry.stat(follow_symlinks=False)
            if st.st_mode & stat.S_IROTH and st.st_uid == 0 and not st.st_mode & 0o022:
                try:
                    os.link(entry.path, target)
                    continue
                except OSError:
                    pass  # another file system: copy
            shutil.copyfile(entry.path, target)
            os.chmod(target, 0o755 if st.st_mode & stat.S_IXUSR else 0o644)


def _copy_package(src: Path, dst: Path) -> None:
    dst.mkdir(mode=0o755, exist_ok=True)
    os.chmod(dst, 0o755)
    for entry in os.scandir(src):
        if entry.name == "__pycache__" or entry.is_symlink():
            continue
        target = dst / entry.name
        if entry.is_dir():
            if not target.exists():  # a subpackage mapped from elsewhere is copied on its own
                _copy_package(Path(entry.path), target)
        elif entry.is_file():
            shutil.copyfile(entry.path, target)
            os.chmod(target, 0o644)


def _system_python() -> str:
    minor = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (f"/usr/bin/python{minor}", f"/usr/local/bin/python{minor}"):
        if os.access(candidate, os.X_OK):
            from gpupool.host.accounts import unreachable

            if not unreachable([candidate]):
                return candidate
    raise SystemEnvError(f"no system Python {minor} that other accounts can run (/usr/bin/python{minor})")


def _check_root_folder(root: Path) -> None:
    """The prefix's folder is root's and no one else may write it: files there run as every user."""
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise SystemEnvError(
            f"{root} must be a folder of root's that others cannot write (it is mode"
            f" {oct(st.st_mode & 0o777)}, owner uid {st.st_uid}); move it away"
        )


def _build(final: Path, work: Path, digest: str) -> None:
    purelib = Path(sysconfig.get_paths()["purelib"])
    work.mkdir(mode=0o755)
    site = work / "site-packages"
    _mirror(purelib, site)
    for name, folder in package_dirs().items():
        _copy_package(folder, site.joinpath(*name.split(".")))
    for parts in JUPYTER_FOLDERS:
        src = Path(sys.prefix, *parts)
        if src.is_dir():
            (work / parts[0]).mkdir(mode=0o755, exist_ok=True)
            _mirror(src, work.joinpath(*parts))
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(site / "gpupool")], capture_output=True, timeout=300
    )
    env = work / "env"
    subprocess.run(
        [_system_python(), "-m", "venv", "--without-pip", str(env)],
        check=True,
        timeout=120,
        capture_output=True,
    )
    minor = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (env / "lib" / minor / "site-packages" / "gpupool-users.pth").write_text(
        f"import site; site.addsitedir({str(final / 'site-packages')!r})\n"
    )
    (env / "bin" / "jupyterhub-singleuser").write_text(
        f"#!{final / 'env' / 'bin' / 'python'}\nimport sys\nfrom jupyterhub.singleuser import main\nsys.exit(main())\n"
    )
    for path in (env, *env.rglob("*")):
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() or path.parent.name == "bin" else 0o644)
    for parts in JUPYTER_FOLDERS:  # Jupyter looks under the interpreter's prefix
        if work.joinpath(*parts).is_dir():
            (env / parts[0]).mkdir(mode=0o755, exist_ok=True)
            (env.joinpath(*parts)).symlink_to(final.joinpath(*parts), target_is_directory=True)
    (work / STAMP).write_text(digest + "\n")
    os.chmod(work / STAMP, 0o644)


def ensure(root: str = ROOT, key: str | None = None) -> Path:
    """The users' environment of this installation under `root` (made or remade now when its
    content hash differs); returns its folder (`<root>/<key>`: `env/bin/python`,
    `site-packages/gpupool`). SystemEnvError when it cannot be made."""
    if os.geteuid() != 0:
        raise SystemEnvError("only root may install the users' environment in a system prefix")
    top = Path(root)
    _check_root_folder(top)
    key = key or install_key()
    final = top / key
    digest = content_hash()
    with open(os.open(top / f".{key}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two hubs of one clone starting at once build it once
        try:
            if (final / STAMP).read_text().strip() == digest:
                return final
        except OSError:
            pass
        work, old = top / f".{key}.new-{os.getpid()}", top / f".{key}.old-{os.getpid()}"
        for leftover in (work, old):
            shutil.rmtree(leftover, ignore_errors=True)
        try:
            _build(final, work, digest)
        except (OSError, subprocess.SubprocessError) as err:
            shutil.rmtree(work, ignore_errors=True)
            raise SystemEnvError(f"could not install the users' environment in {final}: {err}") from None
        if final.exists():
            final.rename(old)
        work.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    return final


def default_state(cwd: str | None = None, euid: int | None = None, state_root: str = STATE_ROOT) -> str:
    """Where `gpupool up` keeps its state (databases, homes, job folders) when not told: ./state;
    as root, when the accounts could not pass through to ./state (a clone in root's home), the
    system's state folder of this installation, /var/lib/gpupool/<install key>/state."""
    from gpupool.host.accounts import unreachable

    local = os.path.join(cwd or os.getcwd(), "state")
    euid = os.geteuid() if euid is None else euid
    if euid != 0 or not unreachable([os.path.dirname(local)]):
        return local
    return os.path.join(state_root, install_key(), "state")


def prepare_state_root(state: str, state_root: str = STATE_ROOT) -> None:
    """The system state folder's parents are root's, passable by the accounts, writable by none."""
    if os.path.commonpath([state, state_root]) == state_root:
        _check_root_folder(Path(state_root))
        _check_root_folder(Path(state).parent)


def clean(root: str = ROOT, state_root: str = STATE_ROOT, key: str | None = None) -> list[str]:
    """`make clean`: this installation's users' environment and system state folder go; returns
    what was removed."""
    key = key or install_key()
    gone = []
    for folder in (Path(root) / key, Path(state_root) / key):
        if folder.exists():
            shutil.rmtree(folder)
            gone.append(str(folder))
    (Path(root) / f".{key}.lock").unlink(missing_ok=True)
    return gone


if __name__ == "__main__":  # `make clean`
    for folder in clean():
        print(f"removed {folder}")
