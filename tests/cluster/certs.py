"""Certificates and keys for a throw-away control plane, made at test time (never committed):
a CA, the API server's serving certificate (127.0.0.1, the host's address and the `kubernetes`
Service's names, so pods on the real node can check it too), an admin client certificate (group
system:masters) and the service-account signing key pair. `issue` signs more (the real node's
kubelet and kube-proxy) with the same CA."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path
    ca_key: Path | None = None

    def issue(
        self,
        folder: Path,
        name: str,
        cn: str,
        org: str | None = None,
        server_ips: tuple[str, ...] = (),
        server_names: tuple[str, ...] = (),
    ) -> tuple[Path, Path]:
        """A client certificate for `cn` (group `org`), or a serving one when `server_ips` or
        `server_names` are given; returns (certificate, key) written under `folder`."""
        ca_key = serialization.load_pem_private_key(self.ca_key.read_bytes(), None)
        ca_name = x509.load_pem_x509_certificate(self.ca.read_bytes()).subject
        key = ec.generate_private_key(ec.SECP256R1())
        server = bool(server_ips or server_names)
        cert = _sign(_name(cn, org), key, ca_name, ca_key, server=server, ips=server_ips, names=server_names)
        folder.mkdir(parents=True, exist_ok=True)
        crt, key_file = folder / f"{name}.crt", folder / f"{name}.key"
        crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(_pem_key(key))
        key_file.chmod(0o600)
        return crt, key_file


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _pem_key(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _sign(
    subject: x509.Name,
    key,
    ca_name: x509.Name,
    ca_key,
    *,
    ca: bool = False,
    server: bool = False,
    days: int = 2,
    ips: tuple[str, ...] = (),
    names: tuple[str, ...] = (),
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    b = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        b = b.add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )
    else:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        b = b.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if server:
        b = b.add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips] + [x509.DNSName(n) for n in names]
            ),
            critical=False,
        )
    return b.sign(ca_key, hashes.SHA256())


API_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


def make_certs(folder: Path, api_ips: tuple[str, ...] = ("127.0.0.1",)) -> Certs:
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("gpupool-test-ca")
    files = Certs(
        *(
            folder / n
            for n in (
                "ca.crt",
                "server.crt",
                "server.key",
                "admin.crt",
                "admin.key",
                "sa.key",
                "sa.pub",
                "ca.key",
            )
        )
    )
    files.ca.write_bytes(
        _sign(ca_name, ca_key, ca_name, ca_key, ca=True).public_bytes(serialization.Encoding.PEM)
    )
    for cert, key_file, subject, server in (
        (files.server_cert, files.server_key, _name("kube-apiserver"), True),
        (files.admin_cert, files.admin_key, _name("admin", "system:masters"), False),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        signed = _sign(
            subject,
            key,
            ca_name,
            ca_key,
            server=server,
            ips=api_ips if server else (),
            names=API_NAMES if server else (),
        )
        cert.write_bytes(signed.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(_pem_key(key))
    sa = rsa.generate_private_key(
        public_exponent=65537, key_size=2048
    )  # RS256: what service-account tokens use
    files.sa_key.write_bytes(_pem_key(sa))
    files.sa_pub.write_bytes(
        sa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    files.ca_key.write_bytes(_pem_key(ca_key))
    for f in (files.server_key, files.admin_key, files.sa_key, files.ca_key):
        f.chmod(0o600)
    return files
