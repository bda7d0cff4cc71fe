"""OCI image archives written from folders, with no registry and no container daemon: what
`ctr images import` reads (an OCI image layout in a tar: oci-layout, index.json, blobs).

A layer is a folder in overlayfs' upper-directory form (what a build step wrote, whiteouts as
0:0 character devices, opaque folders with the `trusted.overlay.opaque` xattr), turned into an
OCI layer tar: whiteouts become `.wh.<name>` files, opaque folders get `.wh..wh..opq`, as the
OCI image spec says. Layers stay uncompressed (the digest is also the diff id): containerd takes
them as they are, and nothing leaves this machine.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path

LAYER = "application/vnd.oci.image.layer.v1.tar"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"


@dataclass(frozen=True)
class Blob:
    path: Path
    digest: str  # sha256:…
    size: int


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def layer(folder: Path, out: Path) -> Blob:
    """An OCI layer tar of `folder` (an overlay upper directory or a whole root filesystem),
    `folder` left as it is (it may still serve as an overlay lower directory): overlay
    whiteouts become `.wh.` entries, written before their siblings as the spec asks."""
    tmp = out.with_name(out.name + ".part")
    h = hashlib.sha256()

    class Hashing(io.FileIO):
        def write(self, b) -> int:  # the digest as the bytes go out: no second read of the tar
            h.update(b)
            return super().write(b)

    with Hashing(tmp, "w") as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add(path: Path, arcname: str) -> None:
            info = tar.gettarinfo(str(path), arcname)
            info.uname = info.gname = ""
            info.mtime = int(info.mtime)
            if info.isreg():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            elif info.type in (tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE) and arcname.startswith(
                "dev/"
            ):
                return  # device nodes come from the runtime, never from an image
            else:
                tar.addfile(info)

        def marker(arcname: str) -> None:
            info = tarfile.TarInfo(arcname)
            tar.addfile(info)

        def walk(d: Path, rel: str) -> None:
            try:
                if os.getxattr(d, "trusted.overlay.opaque") == b"y":
                    marker(f"{rel}.wh..wh..opq" if rel else ".wh..wh..opq")
            except OSError:
                pass
            entries = sorted(os.scandir(d), key=lambda e: e.name)
            plain = []
            for e in entries:
                st = e.stat(follow_symlinks=False)
                if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                    marker(f"{rel}.wh.{e.name}")
                else:
                    plain.append(e)
            for e in plain:
                arc = f"{rel}{e.name}"
                add(Path(e.path), arc)
                if e.is_dir(follow_symlinks=False):
                    walk(Path(e.path), arc + "/")

        walk(folder, "")
    os.replace(tmp, out)
    return Blob(out, "sha256:" + h.hexdigest(), out.stat().st_size)


def _bytes_blob(data: bytes) -> tuple[str, bytes]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def archive(out: Path, name: str, layers: list[Blob], config: dict, history: list[str] | None = None) -> str:
    """Writes the image `name` (e.g. `gpupool.local/hub:abc`) with `layers` (bottom first) and
    the runtime `config` (Env, Entrypoint, Cmd, User, WorkingDir, ExposedPorts) as an OCI
    archive; returns the manifest digest."""
    cfg = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": [b.digest for b in layers]},
            "history": [{"created_by": h} for h in (history or [])],
        },
        sort_keys=True,
    ).encode()
    cfg_digest, _ = _bytes_blob(cfg)
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": {"mediaType": CONFIG, "digest": cfg_digest, "size": len(cfg)},
            "layers": [{"mediaType": LAYER, "digest": b.digest, "size": b.size} for b in layers],
        },
        sort_keys=True,
    ).encode()
    man_digest, _ = _bytes_blob(manifest)
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": MANIFEST,
                    "digest": man_digest,
                    "size": len(manifest),
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1],
                    },
                }
            ],
        }
    ).encode()
    tmp = out.with_name(out.name + ".part")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:

        def add_bytes(path: str, data: bytes) -> None:
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        add_bytes("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add_bytes("index.json", index)
        add_bytes(f"blobs/sha256/{cfg_digest[7:]}", cfg)
        add_bytes(f"blobs/sha256/{man_digest[7:]}", manifest)
        seen = set()
        for b in layers:
            if b.digest not in seen:
                seen.add(b.digest)
                tar.add(b.path, arcname=f"blobs/sha256/{b.digest[7:]}")
    os.replace(tmp, out)
    return man_digest
