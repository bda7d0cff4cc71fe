"""Hibernation: a kernel's variables saved to its user's home, and brought back at the next start.

Runs inside the kernel, as the user (the culler asks the workspace's own Jupyter server, which
executes `save_shell` in each kernel; `%gpupool hibernate` calls it directly). What is kept:

* the user's variables (IPython's own names and `_`-names left out), pickled together in one
  pickle (protocol 5), so that two names for one object stay one object;
* numpy arrays and the arrays inside pandas objects as raw out-of-band buffers, one file each
  (no copy into the pickle; read back into writable memory);
* PyTorch tensors (when torch is imported) with `torch.save`, moved to the host first; on wake
  they go back to their device where it exists, else stay on the CPU (and the note says so);
* functions and classes defined in the notebook by value (cloudpickle); modules by name
  (re-imported on wake).

What is not kept is named with the reason (an open file, a generator, a socket, a thread, ...).
A restore is all or nothing: every file's size and sha256 is checked against the manifest and
the whole state is unpickled into a fresh dict before one name enters the kernel; a state of
another user, hub or gpupool version, or a format this code does not know, is refused.

On disk (`~/.gpupool/hibernate/<server>/<notebook hash>/`, 0700): each save writes a new
`gen-*` folder (every file fsynced, the manifest last), renames it into place, then switches the
`current` link to it with one rename and only then deletes older generations — a kill -9 at
any step leaves the previous state or none, never a mix. A restored state's link is renamed to
`restored` so a later kernel does not restore it a second time.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import re
import secrets
import shutil
import socket
import sys
import threading
import time
import types
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from gpupool.vocab.hibernate_wire import (
    HibernateAnswer,
    HibernateRequest,
    HibernationReport,
    KernelSaved,
    answer_of,
    saved_summary,
)

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

FORMAT = 1
ROOT = Path(".gpupool") / "hibernate"
CURRENT, RESTORED = "current", "restored"
MANIFEST, STATE = "manifest.json", "state.pkl"
MAX_MANIFEST_BYTES = 4 << 20
CHUNK = 64 << 20
SAFE = re.compile(r"[A-Za-z0-9._-]{1,64}")
ENV_REFUSED = "GPUPOOL_HIBERNATE_REFUSED"  # why saves are refused here (on Kubernetes: no claim)
ENV_NOTEBOOK = "JPY_SESSION_NAME"  # jupyter_server gives each kernel its notebook's path

# IPython's own names in user_ns: never the user's state
IPYTHON_NAMES = frozenset({"In", "Out", "exit", "quit", "get_ipython", "open"})


class Refused(Exception):
    """The state is not restored: the message says why (the kernel stays clean)."""


class TooBig(Exception):
    """The state is over its cap: nothing is written."""


@dataclass(frozen=True)
class Identity:
    """Whose state this is: a state is restored only by the same user of the same hub and gpupool."""

    user: str
    hub: str
    instance: str
    version: str

    @classmethod
    def from_env(cls, environ: MutableMapping[str, str] = os.environ) -> Identity:
        return cls(
            user=environ.get("JUPYTERHUB_USER", "") or _login(),
            hub=environ.get("GPUPOOL_HUB", ""),
            instance=environ.get("GPUPOOL_INSTANCE", ""),
            version=gpupool_version(),
        )


def _login() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def gpupool_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpupool")
    except PackageNotFoundError:
        return "0"


def state_dir(home: Path, server: str, notebook: str) -> Path:
    """Where a notebook's state lives: names the user chose are hashed, never used as paths."""
    srv = server if SAFE.fullmatch(server or "") and server not in (".", "..") else ""
    srv = srv or ("default" if not server else "s-" + hashlib.sha256(server.encode()).hexdigest()[:16])
    return home / ROOT / srv / ("nb-" + hashlib.sha256(notebook.encode()).hexdigest()[:24])


@dataclass
class Saved:
    path: Path
    names: list[str]
    skipped: dict[str, str]  # name -> why it was not kept
    bytes: int
    seconds: float

    def summary(self) -> KernelSaved:
        return {
            "ok": True,
            "path": str(self.path),
            "variables": len(self.names),
            "skipped": self.skipped,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
        }


@dataclass
class Restored:
    names: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    refused: str = ""
    saved_at: float = 0.0
    bytes: int = 0
    seconds: float = 0.0

    def message(self) -> str:
        if self.refused:
            return f"gpupool: your hibernated variables were not restored: {self.refused}. This is a clean kernel."
        when = time.strftime("%H:%M", time.localtime(self.saved_at)) if self.saved_at else "?"
        text = (
            f"gpupool: restored {len(self.names)} variable{'' if len(self.names) == 1 else 's'}"
            f" hibernated at {when} ({_size(self.bytes)}, {self.seconds:.1f} s)"
        )
        if self.skipped:
            text += "; not restored: " + ", ".join(
                f"`{n}` ({why})" for n, why in sorted(self.skipped.items())
            )
        for note in self.notes:
            text += f"; {note}"
        return text


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def why_not(value: object, err: BaseException | None = None) -> str:
    """In the user's words, why a value cannot be kept."""
    if isinstance(value, io.IOBase):
        return "an open file"
    if isinstance(value, types.GeneratorType | types.AsyncGeneratorType):
        return "a generator"
    if isinstance(value, types.CoroutineType):
        return "a coroutine"
    if isinstance(value, socket.socket):
        return "a socket"
    if isinstance(value, threading.Thread):
        return "a thread"
    if isinstance(value, type(threading.Lock()) | type(threading.RLock())):
        return "a lock"
    if err is not None:
        return f"cannot be saved: {type(err).__name__}: {str(err)[:120]}"
    return "cannot be saved"


class ShellEvents(Protocol):
    def register(self, event: str, function: Callable[..., None]) -> None: ...
    def unregister(self, event: str, function: Callable[..., None]) -> None: ...


class Shell(Protocol):
    """What hibernation uses of an IPython shell (the kernel's `get_ipython()`)."""

    user_ns: dict[str, object]  # the user's names: any Python objects
    events: ShellEvents


class FileEntry(TypedDict):
    """One file of a state, as its manifest lists it."""

    name: str
    size: int
    sha256: str


def user_variables(shell: Shell) -> dict[str, object]:
    """The user's own names of an IPython shell (what %who lists)."""
    hidden = getattr(shell, "user_ns_hidden", {})
    out = {}
    for name, value in shell.user_ns.items():
        if name.startswith("_") or name in IPYTHON_NAMES:
            continue
        if name in hidden and hidden[name] is value:
            continue
        out[name] = value
    return out


def _base_pickler() -> type[pickle.Pickler]:
    try:
        import cloudpickle  # functions and classes defined in the notebook, by value

        return cloudpickle.Pickler
    except ImportError:  # plain pickle: a function of the notebook is reported, not kept
        return pickle.Pickler


def _torch_tensor(obj: object) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


class _Writer:
    """Files of one generation: each written, hashed and fsynced; the total kept under a cap."""

    def __init__(self, folder: Path, cap_bytes: int, step: Callable[[str], None]) -> None:
        self.folder, self.cap, self.step = folder, cap_bytes, step
        self.files: list[FileEntry] = []
        self.total = 0

    def write(self, name: str, chunks: Iterable[memoryview | bytes]) -> None:
        digest, size = hashlib.sha256(), 0
        fd = os.open(self.folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                size += len(chunk)
                self._count(len(chunk))
                digest.update(chunk)
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        self.files.append({"name": name, "size": size, "sha256": digest.hexdigest()})
        self.step(f"file {name}")

    def _count(self, n: int) -> None:
        self.total += n
        if self.cap and self.total > self.cap:
            raise TooBig(f"the state is over the cap of {_size(self.cap)}")

    def buffer(self, buf: pickle.PickleBuffer) -> bool:
        raw = buf.raw()  # contiguous (protocol 5 hands out only those)
        self.write(f"buf-{len(self.files):06d}.bin", (raw[i : i + CHUNK] for i in range(0, len(raw), CHUNK)))
        return False  # out of band: not copied into the pickle

    def torch(self, tensor: Any) -> str:
        import torch

        name = f"tensor-{len(self.files):06d}.pt"
        data = io.BytesIO()
        torch.save(tensor.detach().to("cpu"), data)
        view = data.getbuffer()
        self.write(name, (view[i : i + CHUNK] for i in range(0, len(view), CHUNK)))
        return name


def _pickler(f: SupportsWrite[bytes], writer: _Writer | None) -> pickle.Pickler:
    """A pickler that keeps modules by name and tensors in torch's format; buffers go to files
    (or nowhere, when only testing whether a value can be pickled)."""
    base = _base_pickler()
    memo: dict[int, tuple[str, str, str, bool]] = {}  # id -> ("torch", file, device, requires_grad)

    class P(base):  # type: ignore[valid-type,misc]
        # obj: Any as in pickle's own signature (any object of the user's)
        def persistent_id(self, obj: Any) -> tuple[str, str] | tuple[str, str, str, bool] | None:
            if isinstance(obj, types.ModuleType):
                return ("module", obj.__name__)
            if _torch_tensor(obj):
                if id(obj) not in memo:
                    device = str(obj.device)
                    name = writer.torch(obj) if writer else ""
                    memo[id(obj)] = ("torch", name, device, obj.requires_grad)
                return memo[id(obj)]
            return None

    return P(f, protocol=5, buffer_callback=writer.buffer if writer else (lambda b: False))


def _pickle_problem(value: object) -> str | None:
    try:
        _pickler(_Null(), None).dump(value)
    except Exception as err:  # noqa: BLE001 - any failure: the value is named with the reason
        return why_not(value, err)
    return None


class _Null:
    def write(self, b: bytes) -> int:
        return len(b)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _no_step(_: str) -> None:
    pass


def save(
    variables: dict[str, object],
    folder: Path,
    ident: Identity,
    notebook: str = "",
    cap_bytes: int = 0,
    step: Callable[[str], None] = _no_step,
    clock: Callable[[], float] = time.time,
) -> Saved:
    """Write `variables` as a new generation under `folder` and make it the current one.
    TooBig (nothing changed) when over `cap_bytes`; the old state stays until the switch."""
    t0 = time.perf_counter()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder.parents[1], 0o700)  # ~/.gpupool/hibernate: the user's only
    gen = f"gen-{time.time_ns()}-{secrets.token_hex(4)}"
    tmp = folder / (gen + ".tmp")
    skipped = {name: why for name, value in variables.items() if (why := _unkept(value))}
    keep = {k: v for k, v in variables.items() if k not in skipped}
    try:
        tmp.mkdir(mode=0o700)
        step("tmp made")
        writer = _Writer(tmp, cap_bytes, step)
        body = io.BytesIO()
        try:
            _pickler(body, writer).dump(keep)
        except TooBig:
            raise
        except Exception:  # noqa: BLE001 - find which values fail, keep the others
            shutil.rmtree(tmp)
            tmp.mkdir(mode=0o700)
            for name, value in list(keep.items()):
                problem = _pickle_problem(value)
                if problem:
                    skipped[name] = problem
                    del keep[name]
            writer = _Writer(tmp, cap_bytes, step)
            body = io.BytesIO()
            _pickler(body, writer).dump(keep)
        view = body.getbuffer()
        writer.write(STATE, (view[i : i + CHUNK] for i in range(0, len(view), CHUNK)))
        manifest = {
            "format": FORMAT,
            "user": ident.user,
            "hub": ident.hub,
            "instance": ident.instance,
            "gpupool": ident.version,
            "notebook": notebook,
            "saved_at": clock(),
            "variables": sorted(keep),
            "skipped": skipped,
            "files": writer.files,
            "bytes": writer.total,
        }
        data = json.dumps(manifest).encode()
        fd = os.open(tmp / MANIFEST, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        step("manifest written")
        os.rename(tmp, folder / gen)
        _fsync_dir(folder)
        step("generation in place")
        link = folder / (CURRENT + ".new")
        link.unlink(missing_ok=True)
        os.symlink(gen, link)
        os.replace(link, folder / CURRENT)  # the commit point: one rename
        _fsync_dir(folder)
        step("current switched")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    (folder / RESTORED).unlink(missing_ok=True)  # the state woken last time is superseded now
    prune(folder, keep_gen=gen)
    step("old generations removed")
    return Saved(folder / gen, sorted(keep), skipped, writer.total, time.perf_counter() - t0)


def _unkept(value: object) -> str | None:
    """Values known to mean nothing in another process (cheap to tell before pickling)."""
    if isinstance(
        value,
        io.IOBase
        | types.GeneratorType
        | types.AsyncGeneratorType
        | types.CoroutineType
        | socket.socket
        | threading.Thread,
    ):
        return why_not(value)
    return None


def prune(folder: Path, keep_gen: str = "") -> None:
    """Remove every generation that no link points to (and leftovers of a killed save)."""
    linked = {keep_gen}
    for name in (CURRENT, RESTORED):
        try:
            linked.add(os.readlink(folder / name))
        except OSError:
            pass
    for entry in folder.iterdir():
        if entry.name.startswith("gen-") and entry.name not in linked and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)


def read_manifest(folder: Path, link: str = CURRENT) -> tuple[Path, dict[str, Any]] | None:
    """(generation, manifest) of the state `link` names; None when there is none. Refused when
    it is malformed."""
    try:
        gen = os.readlink(folder / link)
    except OSError:
        return None
    if not re.fullmatch(r"gen-\d+-[0-9a-f]{8}", gen):
        raise Refused(f"the state link points at {gen[:80]!r}, not at a state of gpupool")
    path = folder / gen
    try:
        fd = os.open(path / MANIFEST, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_MANIFEST_BYTES + 1)
    except OSError as err:
        raise Refused(f"its manifest cannot be read ({err.strerror})") from None
    if len(data) > MAX_MANIFEST_BYTES:
        raise Refused("its manifest is too large")
    try:
        manifest = json.loads(data)
    except ValueError:
        raise Refused("its manifest is truncated or corrupt") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list):
        raise Refused("its manifest is not a gpupool manifest")
    return path, manifest


def check_identity(manifest: dict[str, object], ident: Identity) -> None:
    if manifest.get("format") != FORMAT:
        raise Refused(
            f"it was written in format {manifest.get('format')!r}; this gpupool reads format {FORMAT}"
        )
    if manifest.get("user") != ident.user:
        raise Refused(f"it belongs to another user ({str(manifest.get('user'))[:40]!r})")
    if manifest.get("hub") != ident.hub or manifest.get("instance") != ident.instance:
        raise Refused("it was written under another hub (or a hub with a new database)")
    if manifest.get("gpupool") != ident.version:
        raise Refused(
            f"it was written by gpupool {str(manifest.get('gpupool'))[:40]}, this is gpupool {ident.version}"
        )


def _read_checked(path: Path, entry: object) -> bytearray:
    if (
        not isinstance(entry, dict)
        or not isinstance(entry.get("name"), str)
        or not re.fullmatch(r"(buf-\d{6}\.bin|tensor-\d{6}\.pt|state\.pkl)", entry["name"])
        or type(entry.get("size")) is not int
        or not isinstance(entry.get("sha256"), str)
    ):
        raise Refused("its manifest lists a file it should not")
    try:
        fd = os.open(path / entry["name"], os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as err:
        raise Refused(f"{entry['name']} is missing ({err.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        if os.fstat(f.fileno()).st_size != entry["size"]:
            raise Refused(f"{entry['name']} is truncated or has grown")
        data = bytearray(entry["size"])
        view = memoryview(data)
        digest, got = hashlib.sha256(), 0
        while got < len(data):
            n = f.readinto(view[got : got + CHUNK])
            if not n:
                raise Refused(f"{entry['name']} is truncated")
            digest.update(view[got : got + n])
            got += n
    if digest.hexdigest() != entry["sha256"]:
        raise Refused(f"{entry['name']} is corrupt (its checksum differs)")
    return data


def load(folder: Path, ident: Identity, link: str = CURRENT) -> tuple[dict[str, object], Restored] | None:
    """The saved variables (all of them, or Refused), and what to say; None when nothing is saved."""
    t0 = time.perf_counter()
    found = read_manifest(folder, link)
    if found is None:
        return None
    path, manifest = found
    check_identity(manifest, ident)
    files: dict[str, object] = {
        e["name"]: e for e in manifest["files"] if isinstance(e, dict) and isinstance(e.get("name"), str)
    }
    if STATE not in files:
        raise Refused("its manifest has no state file")
    # each buffer read and hashed on its own thread (hashlib and reads release the GIL): a wake
    # waits for the largest buffer, not for all of them one after another
    from concurrent.futures import ThreadPoolExecutor

    names = sorted(n for n in files if n.startswith("buf-"))
    with ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1))) as pool:
        buffers = list(pool.map(lambda n: _read_checked(path, files[n]), names))
    state = _read_checked(path, files[STATE])
    notes: list[str] = []
    tensors: dict[str, object] = {}

    def persistent_load(pid: object) -> object:
        import importlib

        if not isinstance(pid, tuple) or not pid:
            raise Refused("its state refers to something unknown")
        if pid[0] == "module":
            return importlib.import_module(pid[1])
        if pid[0] == "torch":
            _, name, device, grad = pid
            if name not in tensors:
                import torch

                data = _read_checked(path, files.get(name))
                t = torch.load(io.BytesIO(data), weights_only=True)
                if device != "cpu":
                    if device.startswith("cuda") and torch.cuda.is_available():
                        t = t.to("cuda")
                    else:
                        notes.append(f"a tensor from {device} is on the CPU now (no GPU here)")
                tensors[name] = t.requires_grad_(grad) if t.is_floating_point() else t
            return tensors[name]
        raise Refused(f"its state refers to {str(pid[0])[:40]!r}")

    class U(pickle.Unpickler):
        pass

    unpickler = U(io.BytesIO(state), buffers=buffers)
    unpickler.persistent_load = persistent_load  # type: ignore[method-assign]
    try:
        values = unpickler.load()
    except Refused:
        raise
    except Exception as err:  # noqa: BLE001 - a module gone, a class changed: nothing is restored
        raise Refused(f"it cannot be read back here ({type(err).__name__}: {str(err)[:160]})") from None
    if not isinstance(values, dict):
        raise Refused("its state is not a namespace")
    skipped: dict[object, object] = manifest["skipped"] if isinstance(manifest.get("skipped"), dict) else {}
    return values, Restored(
        names=sorted(values),
        skipped={str(k): str(v) for k, v in skipped.items()},
        notes=sorted(set(notes)),
        saved_at=float(manifest.get("saved_at") or 0.0),
        bytes=int(manifest.get("bytes") or 0),
        seconds=time.perf_counter() - t0,
    )


def restore_into(namespace: MutableMapping[str, object], folder: Path, ident: Identity) -> Restored | None:
    """Restore into `namespace` all or nothing; the state is then marked restored (not used twice).
    None when there is nothing to restore."""
    try:
        loaded = load(folder, ident)
    except Refused as err:
        return Restored(refused=str(err))
    if loaded is None:
        return None
    values, result = loaded
    namespace.update(values)
    os.replace(folder / CURRENT, folder / RESTORED)  # one rename: a second kernel starts clean
    return result


def usage(home: Path) -> int:
    """Bytes the user's hibernated states take (for the quota)."""
    total = 0
    for dirpath, _, files in os.walk(home / ROOT):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def expire(home: Path, keep_days: float, now: float | None = None) -> list[Path]:
    """Remove states older than `keep_days` (retention); the folders removed."""
    now = time.time() if now is None else now
    gone: list[Path] = []
    root = home / ROOT
    if not root.is_dir() or keep_days <= 0:
        return gone
    for server in root.iterdir():
        for nb in server.iterdir() if server.is_dir() and not server.is_symlink() else ():
            newest = max((e.lstat().st_mtime for e in nb.iterdir()), default=0.0)
            if now - newest > keep_days * 86400:
                shutil.rmtree(nb, ignore_errors=True)
                gone.append(nb)
    return gone


# -- in the kernel ---------------------------------------------------------------------------


def kernel_folder(environ: MutableMapping[str, str] = os.environ, home: Path | None = None) -> Path | None:
    """This kernel's state folder: by its notebook (None: no notebook known, nothing to key on)."""
    notebook = environ.get(ENV_NOTEBOOK, "")
    if not notebook:
        return None
    return state_dir(home or Path.home(), environ.get("JUPYTERHUB_SERVER_NAME", ""), notebook)


def save_shell(shell: Shell, cap_bytes: int = 0, quota_bytes: int = 0, keep_days: float = 0) -> KernelSaved:
    """Save this kernel's variables (what the workspace server runs in each kernel); a JSON-able
    summary, {"ok": False, "error": ...} when it could not."""
    folder = kernel_folder()
    if folder is None:
        return {"ok": False, "error": "this kernel has no notebook (JPY_SESSION_NAME unset)"}
    refused = os.environ.get(ENV_REFUSED, "")
    if refused:  # set by the spawner: this state would not outlive the server (spawner.kube_hibernate)
        return {"ok": False, "error": refused[:500]}
    if _waiting.get(id(shell)):
        # started, but no cell ran yet: its variables are still the ones saved before; saving
        # this empty kernel would overwrite them
        found = read_manifest(folder)
        size = int(found[1].get("bytes") or 0) if found else 0
        return {
            "ok": True,
            "variables": 0,
            "skipped": {},
            "bytes": size,
            "kept": "the state not woken yet",
            "notebook": os.environ.get(ENV_NOTEBOOK, ""),
        }
    home = Path.home()
    if keep_days:
        expire(home, keep_days)
    cap = cap_bytes
    if quota_bytes:
        mine = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.is_dir() else 0
        room = quota_bytes - (usage(home) - mine)
        if room <= 0:
            return {"ok": False, "error": f"your hibernation quota of {_size(quota_bytes)} is used up"}
        cap = min(cap, room) if cap else room
    try:
        saved = save(
            user_variables(shell), folder, Identity.from_env(), os.environ.get(ENV_NOTEBOOK, ""), cap
        )
    except (TooBig, OSError) as err:
        # whatever an earlier session left (a state refused at its wake) is older than what this
        # kernel held: never restore it in its place
        (folder / CURRENT).unlink(missing_ok=True)
        if isinstance(err, TooBig):
            return {"ok": False, "error": str(err)}
        return {"ok": False, "error": f"could not write the state: {err.strerror or err}"}
    # the notebook's name goes to the hub's record (what retention's warning names)
    return {**saved.summary(), "notebook": os.environ.get(ENV_NOTEBOOK, "")}


def save_json(shell: Shell, cap_bytes: int = 0, quota_bytes: int = 0, keep_days: float = 0) -> str:
    """save_shell's summary as JSON text (what the server extension reads back from the kernel)."""
    try:
        return json.dumps(save_shell(shell, cap_bytes, quota_bytes, keep_days))
    except Exception as err:  # noqa: BLE001 - reported to the culler, which then stops as before
        return json.dumps({"ok": False, "error": f"{type(err).__name__}: {str(err)[:200]}"})


DEFAULT_CAP_BYTES = (
    8 << 30
)  # c.IdleCuller.hibernate_max_gib's default (the kernel does not see the hub's config)
DEFAULT_QUOTA_BYTES = 32 << 30  # c.IdleCuller.hibernate_quota_gib's default


def own_kernel_id() -> str:
    """This kernel's id, from its connection file's name (kernel-<id>.json); "" when unknown."""
    try:
        from ipykernel.connect import get_connection_file

        name = Path(get_connection_file()).name
    except Exception:  # noqa: BLE001 - not an ipykernel: no id to leave out
        return ""
    return name.removeprefix("kernel-").removesuffix(".json")


def _post_json(
    url: str, body: Mapping[str, object], environ: MutableMapping[str, str], timeout: float, limit: int
) -> bytes:
    """POST `body` as JSON with the user's own token; at most `limit` bytes of the answer."""
    import urllib.request

    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={
            "Authorization": f"token {environ.get('JUPYTERHUB_API_TOKEN', '')}",
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read(limit)


def _post_own_server(
    path: str, body: Mapping[str, object], environ: MutableMapping[str, str], timeout: float
) -> object:  # the server's JSON, unchecked: readers check it (hibernate_wire.answer_of)
    url = environ.get("JUPYTERHUB_SERVICE_URL", "").rstrip("/") + "/" + path
    text = _post_json(url, body, environ, timeout, 1 << 20)
    return json.loads(text) if text else None


def _record_in_hub(body: HibernationReport, environ: MutableMapping[str, str]) -> bytes:
    """POST the hibernation to the gpupool API (api/hibernated) with the user's own token."""
    url = environ.get("GPUPOOL_API_URL", "").rstrip("/") + "/api/hibernated"
    return _post_json(url, dict(body), environ, 10.0, 1 << 16)


def hibernate_now(
    shell: Shell,
    environ: MutableMapping[str, str] = os.environ,
    post: Callable[[str, Mapping[str, object], MutableMapping[str, str], float], object] = _post_own_server,
    say: Callable[[str], None] = print,
    record: Callable[[HibernationReport, MutableMapping[str, str]], object] = _record_in_hub,
) -> bool:
    """`%gpupool hibernate`: save this kernel, ask the server to save its other kernels, then stop
    the server (jupyter_server's own /api/shutdown; the hub sees it gone and frees the share).
    Nothing is stopped unless every kernel was saved. True when the server was asked to stop."""
    if not environ.get("JUPYTERHUB_SERVICE_URL"):
        say("%gpupool hibernate: this kernel does not run in a JupyterHub server")
        return False
    mine = save_shell(shell, DEFAULT_CAP_BYTES, DEFAULT_QUOTA_BYTES)
    if not mine.get("ok"):
        say(f"%gpupool hibernate: this notebook could not be saved: {mine.get('error')}; nothing was stopped")
        return False
    ask: HibernateRequest = {
        "cap_bytes": DEFAULT_CAP_BYTES,
        "quota_bytes": DEFAULT_QUOTA_BYTES,
        "except": [own_kernel_id()],
    }
    try:
        others = post("gpupool/hibernate", dict(ask), environ, 600.0)
    except (OSError, ValueError) as err:
        say(f"%gpupool hibernate: the server could not save its other kernels ({err}); nothing was stopped")
        return False
    answer = answer_of(others) if others is not None else HibernateAnswer(ok=True)  # no body: no others
    if "error" in answer:  # an answer that is no HibernateAnswer: the others' state is unknown
        say(
            f"%gpupool hibernate: the server could not save its other kernels ({answer['error']}); nothing was stopped"
        )
        return False
    kernels = [mine, *answer.get("kernels", [])]
    failed = [k for k in kernels if not k["ok"]]
    if failed:
        say(
            f"%gpupool hibernate: {len(failed)} kernel(s) could not be saved ({failed[0].get('error')});"
            " nothing was stopped"
        )
        return False
    size = sum(k.get("bytes", 0) for k in kernels)
    lost = sorted({f"`{n}` ({why})" for k in kernels for n, why in (k.get("skipped") or {}).items()})
    say(
        f"gpupool: hibernated {len(kernels)} kernel{'' if len(kernels) == 1 else 's'} ({_size(size)});"
        " the server stops now and your variables come back when you start it and open the notebook"
        + (f"; not kept: {', '.join(lost)}" if lost else "")
    )
    hibernated = saved_summary(kernels)  # every kernel was saved: never None here
    if environ.get("GPUPOOL_API_URL") and hibernated is not None:
        report: HibernationReport = {
            "server": environ.get("JUPYTERHUB_SERVER_NAME", ""),
            "hibernated": hibernated,
        }
        try:  # the home page and the admins' list show it, as they show the culler's
            record(report, environ)
        except (OSError, ValueError) as err:
            say(
                f"gpupool: the hub did not record this hibernation ({err}); your variables are saved all the same"
            )
    try:
        post("api/shutdown", {}, environ, 5.0)
    except (OSError, ValueError):
        pass  # the server shuts this kernel down while answering: no answer is the normal case
    return True


def wake(shell: Shell, say: Callable[[str], None] = print) -> Restored | None:
    """At the kernel's first cell: bring back its notebook's hibernated variables, and say so."""
    folder = kernel_folder()
    if folder is None or not (folder / CURRENT).is_symlink():
        return None
    result = restore_into(shell.user_ns, folder, Identity.from_env())
    if result is not None:
        say(result.message())
    return result


_waiting: dict[int, bool] = {}  # shells whose state is restored at their first cell, which has not run yet


def install_wake(shell: Shell) -> None:
    """Register the wake on the shell's first cell (once); nothing when there is no state."""
    folder = kernel_folder()
    if folder is None or not (folder / CURRENT).is_symlink():
        return

    _waiting[id(shell)] = True

    def first_cell(*_: object) -> None:
        shell.events.unregister("pre_run_cell", first_cell)
        _waiting.pop(id(shell), None)
        try:
            wake(shell)
        except Exception as err:  # noqa: BLE001 - never break the user's cell
            print(f"gpupool: your hibernated variables were not restored: {err}", file=sys.stderr)

    shell.events.register("pre_run_cell", first_cell)
