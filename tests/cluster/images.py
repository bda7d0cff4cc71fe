"""Container images built on this machine, with no registry and no container daemon, from the
same Dockerfiles an admin gives `docker build` (helm/hub-image, helm/singleuser-image,
helm/node-agent-image), then imported into the real node's containerd.

A small Dockerfile interpreter: FROM (AS), ARG, ENV, RUN (with BuildKit's
`--mount=type=cache,target=…` and `--mount=…,from=<stage>,source=…,target=…`), COPY (--from,
--chown), WORKDIR, USER, ENTRYPOINT, CMD, EXPOSE, LABEL. Each RUN and COPY makes a layer in an
overlay mount of the layers below it, inside a private mount namespace (`unshare`), chrooted;
layers are cached under ~/.cache/gpupool/images by a key of their parent and their instruction
(a COPY's: its files' content), as docker's build cache is, so a rebuild redoes only what
changed.

Base images nobody can pull here are built locally as equivalents (BASES): `debian:bookworm-slim`
is debootstrap's minbase of Debian bookworm; `python:3.12-*bookworm` is that plus Debian's
Python (3.11) and pip; z2jh's hub image `quay.io/jupyterhub/k8s-hub:4.4.0` is built from that
release's own recipe (../shared/charts/jupyterhub-4.4.0-images/hub), and CHP's image from
tests/cluster/images/. A stage named in `stages` (the hub's `wheel` stage, which needs Node 20)
is a folder built here instead, by the same command.

    python -m tests.cluster.images hub        # build one, print its name and size
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from tests.cluster import build, oci

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent / "images"
SHARED = Path(os.environ.get("GPUPOOL_SHARED_DIR", REPO.parent / "shared"))  # as tests/k8s/conftest.py
MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
BUILD_CA = (
    "/run/build/ca-certificates.crt"  # where RUN steps find the host's CA bundle (a tmpfs, not a layer)
)
# what RUN steps are told about it: build-time settings, as docker build's proxy variables are
BUILD_ENV = {
    k: BUILD_CA
    for k in (
        "SSL_CERT_FILE",
        "PIP_CERT",
        "REQUESTS_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "CURL_CA_BUNDLE",
        "GIT_SSL_CAINFO",
    )
}
RECIPE_VERSION = "1"  # bump to rebuild every layer (a change in how layers are made)


# debian:*-slim's apt and dpkg settings (debuerreotype's): downloaded packages deleted after
# installing, no package indexes cached, no documentation, manuals or translations installed
_CLEAN = (
    "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"
)
SLIM = {
    "etc/apt/apt.conf.d/docker-clean": f'DPkg::Post-Invoke {{ "{_CLEAN}"; }};\nAPT::Update::Post-Invoke {{ "{_CLEAN}"; }};\n'
    'Dir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\n',
    "etc/apt/apt.conf.d/docker-no-languages": 'Acquire::Languages "none";\n',
    "etc/apt/apt.conf.d/docker-autoremove-suggests": 'Apt::AutoRemove::SuggestsImportant "false";\n',
    "etc/dpkg/dpkg.cfg.d/docker": "".join(
        f"path-exclude /usr/share/{p}/*\n"
        for p in ("doc", "man", "groff", "info", "lintian", "linda", "locale")
    )
    + "path-include /usr/share/doc/*/copyright\n",
}


def cache() -> Path:
    return build.cache_root() / "images"


@dataclass(frozen=True)
class Layer:
    key: str

    @property
    def folder(self) -> Path:
        return cache() / "layers" / self.key

    @property
    def fs(self) -> Path:
        return self.folder / "fs"

    def blob(self) -> oci.Blob:
        """The layer as an OCI tar (made once, kept beside the folder)."""
        tar, meta = self.folder / "layer.tar", self.folder / "layer.json"
        if not meta.exists():
            blob = oci.layer(self.fs, tar)
            meta.write_text(json.dumps({"digest": blob.digest, "size": blob.size}))
        m = json.loads(meta.read_text())
        return oci.Blob(tar, m["digest"], m["size"])


@dataclass
class Image:
    """A stage being built, or built: its layers (bottom first) and runtime configuration."""

    layers: list[Layer] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=lambda: {"PATH": DEFAULT_PATH})
    user: str = ""
    workdir: str = "/"
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    exposed: list[str] = field(default_factory=list)
    history: list[str] = field(default_factory=list)
    root: Path | None = None  # a folder standing in for a stage (`stages`): COPY --from reads it

    @property
    def key(self) -> str:
        if self.root is not None:  # a folder standing in for a stage: its path is keyed by its inputs
            return _hash("root", str(self.root))
        return self.layers[-1].key if self.layers else "empty"

    def config(self) -> dict:
        cfg: dict = {"Env": [f"{k}={v}" for k, v in self.env.items()], "WorkingDir": self.workdir}
        if self.user:
            cfg["User"] = self.user
        if self.entrypoint is not None:
            cfg["Entrypoint"] = self.entrypoint
        if self.cmd is not None:
            cfg["Cmd"] = self.cmd
        if self.exposed:
            cfg["ExposedPorts"] = {p if "/" in p else f"{p}/tcp": {} for p in self.exposed}
        return cfg


# --- Dockerfile parsing ---------------------------------------------------------------------
def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) pairs: continuation lines joined, comments (also inside a continued
    instruction, as docker drops them) and parser directives left out."""
    out, buf = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or (not stripped and not buf):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    if buf.strip():
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def expand(text: str, variables: dict[str, str]) -> str:
    """`$VAR`, `${VAR}` and `${VAR:-default}` as docker expands them in instructions."""

    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(3)
        default = m.group(2)
        value = variables.get(name, "")
        return value if value or default is None else default

    return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)", sub, text)


def _pairs(rest: str) -> list[tuple[str, str | None]]:
    """ARG/ENV/LABEL words: `k=v k2="v 2"`, or ENV's old `k v` form."""
    words = shlex.split(rest)
    if words and "=" not in words[0]:
        return [(words[0], " ".join(words[1:]) if len(words) > 1 else None)]
    return [(w.split("=", 1)[0], w.split("=", 1)[1] if "=" in w else None) for w in words]


def _exec_form(rest: str) -> list[str] | None:
    if rest.startswith("["):
        return json.loads(rest)
    return None


def _flags(rest: str) -> tuple[dict[str, list[str]], str]:
    flags: dict[str, list[str]] = {}
    while rest.startswith("--"):
        word, _, rest = rest.partition(" ")
        name, _, value = word[2:].partition("=")
        flags.setdefault(name, []).append(value)
        rest = rest.lstrip()
    return flags, rest


def _hash(*parts: str) -> str:
    return hashlib.sha256("\0".join((RECIPE_VERSION, *parts)).encode()).hexdigest()[:24]


def tree_hash(paths: list[Path]) -> str:
    """Content, names and modes of files (folders walked): what a COPY's cache key covers."""
    h = hashlib.sha256()
    for top in paths:
        items = [top] if not top.is_dir() else sorted(p for p in top.rglob("*"))
        for p in items:
            rel = p.relative_to(top.parent).as_posix()
            st = p.lstat()
            h.update(f"{rel}\0{st.st_mode}\0".encode())
            if p.is_symlink():
                h.update(os.readlink(p).encode())
            elif p.is_file():
                h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def _mount_readonly(image: Image) -> str:
    """Shell lines that mount `image`'s layers read-only at $S (an overlay needs two or more)."""
    if len(image.layers) == 1:
        return f'S=$(mktemp -d); mount --bind -o ro {shlex.quote(str(image.layers[0].fs))} "$S"'
    lowers = ":".join(str(layer.fs) for layer in reversed(image.layers))
    return f'S=$(mktemp -d); mount -t overlay overlay -o ro,lowerdir={shlex.quote(lowers)} "$S"'


# --- building ----------------------------------------------------------------------------
class Builder:
    def __init__(self, log: Callable[[str], None] = print) -> None:
        self.log = log
        self.built: dict[str, Image] = {}  # base images built in this process, by reference

    # bases ------------------------------------------------------------------------------
    def base(self, ref: str) -> Image:
        if ref in self.built:
            return self.built[ref]
        if ref == "scratch":
            image = Image()
        elif ref == f"debian:{SUITE}-slim":
            image = self._debootstrap()
        elif ref in BASES:
            dockerfile, context, target = BASES[ref]()
            image = self.dockerfile(dockerfile, context, target=target)
        else:
            raise RuntimeError(
                f"no local equivalent of the base image {ref!r} (known: {', '.join(sorted(BASES))})"
            )
        self.built[ref] = image
        return image

    def _debootstrap(self) -> Image:
        """debian:bookworm-slim's equivalent: debootstrap's minbase of the suite."""
        if not shutil.which("debootstrap"):
            raise RuntimeError(
                "debootstrap is missing (apt-get install debootstrap): it makes the images' Debian base"
            )
        key = _hash("debootstrap", SUITE, MIRROR, "minbase", json.dumps(SLIM))
        layer = Layer(key)
        if (layer.folder / ".complete").exists():
            os.utime(layer.folder / ".complete")
        else:
            start = time.monotonic()
            self._fresh(layer)
            proc = subprocess.run(
                ["debootstrap", "--variant=minbase", SUITE, str(layer.fs), MIRROR],
                capture_output=True,
                text=True,
            )
            if proc.returncode:
                raise RuntimeError(f"debootstrap failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
            # what the docker image trims and keeps: no apt lists or caches; a resolv.conf to mount over
            for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "var/cache/apt"):
                for p in (layer.fs / junk).glob("*"):
                    if p.is_file():
                        p.unlink()
            for path, text in SLIM.items():  # and what its -slim variant configures apt and dpkg with
                (layer.fs / path).write_text(text)
            share = layer.fs / "usr/share"
            for p in [
                *share.glob("man/*"),
                *share.glob("info/*"),
                *share.glob("locale/*"),
                *share.glob("doc/*/*"),
            ]:
                if p.name == "copyright":  # what those dpkg excludes would have kept out
                    continue
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
            (layer.fs / "etc/resolv.conf").write_text("")
            (layer.fs / "etc/hostname").write_text("")
            # apt in a container: no daemons started by package scripts
            (layer.fs / "usr/sbin/policy-rc.d").write_text("#!/bin/sh\nexit 101\n")
            (layer.fs / "usr/sbin/policy-rc.d").chmod(0o755)
            self._done(layer, start, "debootstrap")
        return Image(layers=[layer], history=[f"debootstrap --variant=minbase {SUITE}"])

    # layers ------------------------------------------------------------------------------
    def _fresh(self, layer: Layer) -> None:
        shutil.rmtree(layer.folder, ignore_errors=True)
        layer.fs.mkdir(parents=True)

    def _done(self, layer: Layer, start: float, what: str) -> None:
        (layer.folder / ".complete").write_text(what + "\n")
        self.log(f"  layer {layer.key[:12]} in {time.monotonic() - start:.0f} s: {what[:100]}")

    def _in_namespace(self, image: Image, upper: Path, body: str, env: dict[str, str] | None = None) -> None:
        """Runs the shell `body` in a private mount namespace where $M is the overlay of
        `image`'s layers with `upper` on top (and /proc, /dev, resolv.conf mounted in it)."""
        work, merged = upper.parent / "work", upper.parent / "merged"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        merged.mkdir(exist_ok=True)
        empty = cache() / "empty"  # the lower layer of a stage FROM scratch
        empty.mkdir(parents=True, exist_ok=True)
        lowers = ":".join(str(layer.fs) for layer in reversed(image.layers)) or str(empty)
        ca = ""
        if HOST_CA.exists():  # this machine's TLS trust (a proxy's CA, say), for the build only
            ca = f'if [ -d "$M/run" ]; then mkdir -p "$M/run/build" && cp {shlex.quote(str(HOST_CA))} "$M{BUILD_CA}"; fi\n'
        script = f"""set -e
M={shlex.quote(str(merged))}
mount -t overlay overlay -o {shlex.quote(f"lowerdir={lowers},upperdir={upper},workdir={work}")} "$M"
if [ -d "$M/proc" ]; then mount -t proc proc "$M/proc"; fi
if [ -d "$M/dev" ]; then mount --rbind /dev "$M/dev"; fi
if [ -e "$M/etc/resolv.conf" ]; then mount --bind /etc/resolv.conf "$M/etc/resolv.conf"; fi
if [ -d "$M/run" ]; then mount -t tmpfs tmpfs "$M/run"; fi
{ca}{body}
"""
        proc = subprocess.run(
            ["unshare", "--mount", "--pid", "--fork", "--propagation", "private", "sh", "-c", script],
            env={"PATH": DEFAULT_PATH, **(env or {})},
            capture_output=True,
            text=True,
        )
        shutil.rmtree(work, ignore_errors=True)
        if proc.returncode:
            raise RuntimeError(f"exit {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")

    def _step(self, image: Image, key: str, what: str, body: str, env: dict[str, str] | None = None) -> Image:
        layer = Layer(key)
        if (layer.folder / ".complete").exists():
            os.utime(layer.folder / ".complete")  # in use: prune() keeps it
        else:
            start = time.monotonic()
            self._fresh(layer)
            try:
                self._in_namespace(image, layer.fs, body, env)
            except RuntimeError as err:
                raise RuntimeError(f"{what[:200]} failed: {err}") from None
            # a RUN's mount points and what the overlay's own bookkeeping left
            for p in ("proc", "dev"):
                d = layer.fs / p
                if d.is_dir() and not any(d.iterdir()):
                    d.rmdir()
            self._done(layer, start, what)
        return replace(image, layers=[*image.layers, layer], history=[*image.history, what])

    def run(
        self,
        image: Image,
        command: str | list[str],
        mounts: list[dict[str, str]],
        stages: dict[str, Image],
        variables: dict[str, str],
    ) -> Image:
        argv = command if isinstance(command, list) else ["/bin/sh", "-c", command]
        env = {**image.env}
        env.update({k: v for k, v in variables.items() if k not in env})
        binds, key_parts = [], []
        for m in mounts:
            target = m.get("target") or m.get("dst") or m.get("destination")
            if m.get("from"):  # a path of another stage, e.g. the wheels of a build stage
                src_stage = stages[m["from"]]
                binds.append(("stage", src_stage, m.get("source", "/"), target))
                key_parts.append(f"from={src_stage.key}:{m.get('source')}:{target}")
            elif m.get("type") == "cache":
                folder = (
                    cache()
                    / "build-cache"
                    / hashlib.sha256((m.get("id") or target).encode()).hexdigest()[:16]
                )
                folder.mkdir(parents=True, exist_ok=True)
                binds.append(("dir", folder, "", target))
            else:
                raise RuntimeError(f"RUN --mount {m} is not supported here")
        lines = []
        for kind, src, sub, target in binds:
            t = shlex.quote(target)
            lines.append(f'mkdir -p "$M"{t}')
            if kind == "dir":
                lines.append(f'mount --bind {shlex.quote(str(src))} "$M"{t}')
            elif src.root is not None:
                lines.append(f'mount --bind {shlex.quote(str(src.root) + sub)} "$M"{t}')
            else:  # the other stage's merged layers, read-only
                lines.append(_mount_readonly(src))
                lines.append(f'mount --bind "$S"{shlex.quote(sub)} "$M"{t}')
        user = image.user or "root"
        spec = f"--userspec={shlex.quote(user)} " if user not in ("root", "0", "0:0") else ""
        run_env = {**env, **(BUILD_ENV if HOST_CA.exists() else {})}
        env_words = " ".join(shlex.quote(f"{k}={v}") for k, v in run_env.items())
        inner = shlex.quote(f'cd {shlex.quote(image.workdir)} && exec "$@"')
        lines.append(
            f'chroot {spec}"$M" /usr/bin/env -i {env_words} sh -c {inner} sh '
            + " ".join(shlex.quote(a) for a in argv)
        )
        key = _hash(
            image.key,
            "RUN",
            json.dumps(argv),
            json.dumps(sorted(env.items())),
            user,
            image.workdir,
            *key_parts,
            *[f"{k}:{t}" for k, _, _, t in binds],
        )
        return self._step(
            image,
            key,
            "RUN " + (command if isinstance(command, str) else json.dumps(command)),
            "\n".join(lines),
        )

    def copy(
        self,
        image: Image,
        sources: list[Path],
        dest: str,
        chown: str,
        from_root: Path | None,
        from_image: Image | None,
        what: str,
    ) -> Image:
        many = len(sources) > 1 or dest.endswith("/")
        lines = []
        if from_image is not None and from_image.root is None:
            lines.append(_mount_readonly(from_image))
            srcs = [f'"$S"{shlex.quote(str(s))}' for s in sources]
            key_src = from_image.key + json.dumps([str(s) for s in sources])
        else:
            root = from_root
            paths = [Path(str(root) + str(s)) if root is not None else s for s in sources]
            for p in paths:
                if not p.exists() and not p.is_symlink():
                    raise RuntimeError(f"{what}: {p} does not exist")
            srcs = [shlex.quote(str(p)) for p in paths]
            key_src = tree_hash(paths)
        d = shlex.quote(dest)
        target = f'"$M"{d}'
        if many:
            lines.append(f"mkdir -p {target}")
        else:
            lines.append(f'mkdir -p "$(dirname {target})"')
        for s in srcs:
            # a folder's content goes into dest; a file goes to dest (or into it when dest is a folder)
            lines.append(
                f"if [ -d {s} ] && [ ! -L {s} ]; then mkdir -p {target} && cp -a {s}/. {target}/; "
                f"else cp -a {s} {target}; fi"
            )
        if chown:
            lines.append(f'chroot "$M" chown -R {shlex.quote(chown)} {d}')
        key = _hash(image.key, "COPY", key_src, dest, chown)
        return self._step(image, key, what, "\n".join(lines))

    # Dockerfiles -------------------------------------------------------------------------
    def dockerfile(
        self,
        path: Path,
        context: Path,
        args: dict[str, str] | None = None,
        target: str | None = None,
        stages: dict[str, Path] | None = None,
    ) -> Image:
        """Builds `path` with `context`; returns its `target` stage (the last by default).
        `stages` maps stage names to folders that stand in for them (built elsewhere)."""
        args = dict(args or {})
        steps = instructions(path.read_text())
        global_args: dict[str, str] = {}
        # stages: (name, [(instr, rest)]); ARGs before the first FROM are global
        parsed: list[tuple[str, str, list[tuple[str, str]]]] = []
        for word, rest in steps:
            if word == "FROM":
                m = re.match(r"(?:--platform=\S+\s+)?(\S+)(?:\s+(?:AS|as)\s+(\S+))?$", rest)
                parsed.append((m.group(2) or str(len(parsed)), m.group(1), []))
            elif not parsed:
                if word == "ARG":
                    for k, v in _pairs(rest):
                        global_args[k] = args.get(k, v or "")
            else:
                parsed[-1][2].append((word, rest))
        wanted = target or parsed[-1][0]
        done: dict[str, Image] = {}
        overrides = {name: Image(root=folder) for name, folder in (stages or {}).items()}

        def stage(name: str) -> Image:
            if name in overrides:
                return overrides[name]
            if name in done:
                return done[name]
            _, ref, body = next(p for p in parsed if p[0] == name)
            ref = expand(ref, global_args)
            image = stage(ref) if any(p[0] == ref for p in parsed) else self.base(ref)
            variables = dict(global_args)
            for word, rest in body:
                image = self.instruction(image, word, rest, variables, args, context, stage, path)
            done[name] = image
            return image

        return stage(wanted)

    def instruction(
        self,
        image: Image,
        word: str,
        rest: str,
        variables: dict[str, str],
        args: dict[str, str],
        context: Path,
        stage: Callable[[str], Image],
        path: Path,
    ) -> Image:
        scope = {**variables, **image.env}
        if word == "ARG":
            for k, v in _pairs(rest):
                variables[k] = args.get(k, expand(v, scope) if v is not None else variables.get(k, ""))
        elif word == "ENV":
            env = dict(image.env)
            for k, v in _pairs(rest):
                env[k] = expand(v or "", {**scope, **env})
            image = replace(image, env=env)
        elif word == "WORKDIR":
            wd = expand(rest, scope)
            wd = wd if wd.startswith("/") else str(Path(image.workdir) / wd)
            image = self._step(
                image, _hash(image.key, "WORKDIR", wd), f"WORKDIR {wd}", f'mkdir -p "$M"{shlex.quote(wd)}'
            )
            image = replace(image, workdir=wd)
        elif word == "USER":
            image = replace(image, user=expand(rest, scope))
        elif word == "ENTRYPOINT":
            image = replace(image, entrypoint=_exec_form(rest) or ["/bin/sh", "-c", rest], cmd=None)
        elif word == "CMD":
            image = replace(image, cmd=_exec_form(rest) or ["/bin/sh", "-c", rest])
        elif word == "EXPOSE":
            image = replace(image, exposed=[*image.exposed, *expand(rest, scope).split()])
        elif word in ("LABEL", "MAINTAINER", "SHELL", "STOPSIGNAL", "HEALTHCHECK", "VOLUME", "ONBUILD"):
            pass  # no effect on the files or the runtime config the tests use
        elif word == "RUN":
            flags, cmd = _flags(rest)
            mounts = [
                dict(kv.split("=", 1) for kv in expand(m, scope).split(",")) for m in flags.get("mount", [])
            ]
            command = _exec_form(cmd) or cmd
            stages_by_name = {m["from"]: stage(m["from"]) for m in mounts if m.get("from")}
            image = self.run(image, command, mounts, stages_by_name, variables)
        elif word == "COPY" or word == "ADD":
            flags, spec = _flags(rest)
            words = _exec_form(spec) or shlex.split(expand(spec, scope))
            *srcs, dest = words
            if dest == "." or not dest.startswith("/"):
                dest = str(Path(image.workdir) / dest) + ("/" if dest.endswith(("/", ".")) else "")
            chown = expand(flags.get("chown", [""])[0], scope)
            if flags.get("from"):
                other = stage(flags["from"][0])
                image = self.copy(
                    image, [Path(s) for s in srcs], dest, chown, other.root, other, f"{word} {rest}"
                )
            else:
                found: list[Path] = []
                for s in srcs:
                    matches = (
                        sorted(context.glob(s.lstrip("/"))) if any(c in s for c in "*?[") else [context / s]
                    )
                    found += matches
                image = self.copy(image, found, dest, chown, None, None, f"{word} {rest}")
        else:
            raise RuntimeError(f"{path}: the instruction {word} is not supported by this builder")
        return image

    # output ------------------------------------------------------------------------------
    def export(self, image: Image, name: str) -> Path:
        """The image as an OCI archive under the cache (made once per name)."""
        out = cache() / "archives" / (name.replace("/", "_").replace(":", "_") + ".tar")
        if out.exists():
            os.utime(out)
        else:
            out.parent.mkdir(parents=True, exist_ok=True)
            start = time.monotonic()
            oci.archive(out, name, [layer.blob() for layer in image.layers], image.config(), image.history)
            self.log(
                f"  archive {name}: {out.stat().st_size / 2**20:.0f} MiB in {time.monotonic() - start:.0f} s"
            )
        return out


# --- the project's images ----------------------------------------------------------------
def _python_base(full: bool) -> tuple[Path, Path, str | None]:
    return HERE / ("python-bookworm.Dockerfile" if full else "python-slim-bookworm.Dockerfile"), HERE, None


def _k8s_hub() -> tuple[Path, Path, str | None]:
    folder = SHARED / "charts" / "jupyterhub-4.4.0-images" / "hub"
    if not folder.exists():
        raise RuntimeError(
            f"z2jh's hub image recipe is missing: {folder} (the shared charts folder beside the checkout)"
        )
    return folder / "Dockerfile", folder, None


# images nobody can pull here, and the local recipe standing in for each
BASES: dict[str, Callable[[], tuple[Path, Path, str | None]]] = {
    "python:3.12-bookworm": lambda: _python_base(True),
    "python:3.12-slim-bookworm": lambda: _python_base(False),
    "quay.io/jupyterhub/k8s-hub:4.4.0": _k8s_hub,
}


def wheel_stage(log: Callable[[str], None] = print) -> Path:
    """What the Dockerfiles' `wheel` stage makes (gpupool's wheel with its JupyterLab extension
    built, in /wheels), made here by the same `pip wheel` with the checkout's Node tools; cached
    by the package's sources."""
    sources = [
        REPO / p
        for p in (
            "pyproject.toml",
            "setup.py",
            "hub_ext",
            "spawner",
            "idle_culler",
            "widgets",
            "README.md",
            "package-lock.json",
        )
    ]
    sources = [p for p in sources if p.exists()]
    key = hashlib.sha256(tree_hash_filtered(sources).encode()).hexdigest()[:16]
    root = cache() / "wheels" / key
    if (root / ".complete").exists():
        os.utime(root / ".complete")
        return root
    start = time.monotonic()
    shutil.rmtree(root, ignore_errors=True)
    (root / "wheels").mkdir(parents=True)
    had_build = (REPO / "build").exists()
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "-q",
                "-w",
                str(root / "wheels"),
                str(REPO),
            ],
            capture_output=True,
            text=True,
            cwd=root,
        )
    finally:
        if not had_build:  # setuptools builds in the source tree
            shutil.rmtree(REPO / "build", ignore_errors=True)
    if proc.returncode:
        raise RuntimeError(f"building gpupool's wheel failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    (root / ".complete").touch()
    log(f"  gpupool wheel in {time.monotonic() - start:.0f} s")
    return root


def tree_hash_filtered(paths: list[Path]) -> str:
    """tree_hash without build outputs and caches (a built extension, __pycache__)."""
    h = hashlib.sha256()
    for top in paths:
        items = [top] if top.is_file() else sorted(top.rglob("*"))
        for p in items:
            rel = p.relative_to(REPO).as_posix()
            if "__pycache__" in rel or "/build/" in rel or rel.endswith("/build") or "node_modules" in rel:
                continue
            if p.is_file():
                h.update(rel.encode() + b"\0" + hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


@dataclass(frozen=True)
class Recipe:
    name: str
    dockerfile: Path
    context: Path
    wheel: bool = False  # its `wheel` stage is gpupool's wheel, built here


RECIPES = {
    "hub": Recipe("hub", REPO / "helm" / "hub-image" / "Dockerfile", REPO, wheel=True),
    "singleuser": Recipe("singleuser", REPO / "helm" / "singleuser-image" / "Dockerfile", REPO, wheel=True),
    "node-agent": Recipe("node-agent", REPO / "helm" / "node-agent-image" / "Dockerfile", REPO, wheel=True),
    # context: CHP from npm (chp_context)
    "chp": Recipe("chp", HERE / "chp.Dockerfile", Path()),
    "reservation": Recipe("reservation", HERE / "reservation.Dockerfile", HERE),
    # context: the folder of tests/cluster/go/coredns's build (build.optional("coredns"))
    "coredns": Recipe("coredns", HERE / "coredns.Dockerfile", Path()),
}


@contextlib.contextmanager
def build_lock(log: Callable[[str], None]) -> Iterator[None]:
    """One build at a time on this machine (two would share layer folders)."""
    path = cache() / "build.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log("waiting for another image build on this machine to finish")
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def image(name: str, builder: Builder | None = None, context: Path | None = None) -> tuple[str, Path]:
    """Builds the project's image `name` (RECIPES) if its inputs changed; returns its reference
    (`gpupool.local/<name>:<key>`) and its OCI archive."""
    builder = builder or Builder()
    with build_lock(builder.log):
        return _image(name, builder, context)


def _image(name: str, builder: Builder, context: Path | None) -> tuple[str, Path]:
    recipe = RECIPES[name]
    stages = {"wheel": wheel_stage(builder.log)} if recipe.wheel else None
    if name == "chp":
        context = chp_context(builder.log)
    built = builder.dockerfile(recipe.dockerfile, context or recipe.context, stages=stages)
    ref = f"gpupool.local/{name}:{built.key[:16]}"
    return ref, builder.export(built, ref)


CHP_VERSION = "5.2.0"  # what z2jh 4.4.0's proxy.chp.image.tag names


def chp_context(log: Callable[[str], None] = print) -> Path:
    """The CHP image's build context: configurable-http-proxy and its dependencies from npm
    (pure JavaScript), installed with this checkout's npm; cached by version."""
    ctx = cache() / "contexts" / f"chp-{CHP_VERSION}"
    if (ctx / ".complete").exists():
        return ctx
    shutil.rmtree(ctx, ignore_errors=True)
    (ctx / "chp").mkdir(parents=True)
    (ctx / "chp" / "package.json").write_text(
        json.dumps({"private": True, "dependencies": {"configurable-http-proxy": CHP_VERSION}})
    )
    proc = subprocess.run(
        ["npm", "install", "--omit=dev", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=ctx / "chp",
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        raise RuntimeError(
            f"npm install configurable-http-proxy@{CHP_VERSION} failed:\n{proc.stderr[-2000:]}"
        )
    shutil.copy(HERE / "chp.Dockerfile", ctx / "Dockerfile")
    (ctx / ".complete").touch()
    log(f"  configurable-http-proxy {CHP_VERSION} from npm")
    return ctx


def pause_image() -> tuple[str, Path]:
    """The pod sandbox image: Debian's static `catatonit -P` (podman's pause process)."""
    out = cache() / "archives" / "pause.tar"
    ref = "gpupool.local/pause:catatonit"
    if out.exists():
        return ref, out
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["apt-get", "download", "catatonit"], cwd=tmp, check=True, capture_output=True)
        deb = next(Path(tmp).glob("catatonit_*.deb"))
        subprocess.run(["dpkg-deb", "-x", str(deb), f"{tmp}/x"], check=True)
        root = Path(tmp, "rootfs")
        root.mkdir()
        shutil.copy2(f"{tmp}/x/usr/bin/catatonit", root / "catatonit")
        blob = oci.layer(root, Path(tmp, "layer.tar"))
        out.parent.mkdir(parents=True, exist_ok=True)
        oci.archive(out, ref, [blob], {"Entrypoint": ["/catatonit", "-P"], "User": "65535:65535"})
    return ref, out


UNUSED_FOR_S = 6 * 3600  # a layer no build used for this long is an old change's
ARCHIVE_UNUSED_S = 3600
KEEP_PER_IMAGE = 2  # the newest archives of each image stay whatever their age


def stale_archives(archives: list[tuple[str, float]], now: float) -> list[str]:
    """Which image archives (file name, last use) go: all but the newest KEEP_PER_IMAGE of each
    image, once unused for ARCHIVE_UNUSED_S. Each change to gpupool exports a new hub and
    single-user archive (1.4 GB together); kept for a day, a working day's commits filled a
    developer's disk (38 GB of the image cache on this project's VM)."""
    by_image: dict[str, list[tuple[float, str]]] = {}
    for name, used in archives:
        image = name.rsplit("_", 1)[0] if name.startswith("gpupool.local_") else name
        by_image.setdefault(image, []).append((used, name))
    stale = []
    for found in by_image.values():
        for used, name in sorted(found, reverse=True)[KEEP_PER_IMAGE:]:
            if now - used >= ARCHIVE_UNUSED_S:
                stale.append(name)
    return sorted(stale)


def prune(log: Callable[[str], None] = print) -> None:
    """Removes layers and wheels no build has used for UNUSED_FOR_S, and image archives as
    `stale_archives` says: each change to gpupool makes new top layers and archives (hundreds of
    MiB for the hub and single-user images). By age and recency, not by what this checkout
    builds: other checkouts on the machine share the cache."""
    with build_lock(log):
        now = time.time()
        cutoff = now - UNUSED_FOR_S
        freed = 0
        for marker in [*cache().glob("layers/*/.complete"), *cache().glob("wheels/*/.complete")]:
            if marker.stat().st_mtime < cutoff:
                freed += sum(
                    p.stat().st_size for p in marker.parent.rglob("*") if p.is_file() and not p.is_symlink()
                )
                shutil.rmtree(marker.parent, ignore_errors=True)
        archives = {a.name: a for a in cache().glob("archives/*.tar")}
        for name in stale_archives([(n, a.stat().st_mtime) for n, a in archives.items()], now):
            freed += archives[name].stat().st_size
            archives[name].unlink()
            archives[name].with_suffix(".imported").unlink(missing_ok=True)
        for partial in cache().glob("layers/*"):  # a build killed midway left no .complete
            if not (partial / ".complete").exists() and partial.stat().st_mtime < cutoff:
                shutil.rmtree(partial, ignore_errors=True)
        if freed:
            log(f"  image cache: freed {freed / 2**20:.0f} MiB of old builds")


def main(argv: list[str]) -> int:
    for name in argv or list(RECIPES):
        start = time.monotonic()
        ref, path = image(name)
        print(f"{ref}: {path} ({path.stat().st_size / 2**20:.0f} MiB, {time.monotonic() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
