"""Kueue's controller manager as a local process against the test control plane.

Kueue is deployed as its own manifests deploy it, with two changes a process outside the
cluster needs: its webhooks (admission and the CRDs' v1beta1 <-> v1beta2 conversion) are
called by URL on 127.0.0.1 instead of through a Service, and the serving certificate is made
here. Kueue's internal certificate management stays on (with it off, v0.15 reads its metrics
certificate from a fixed /etc/kueue path): it finds our certificate valid in its Secret, so it
keeps it and injects our CA into the webhook configurations and CRDs, as in a cluster.

Only Kueue's Job webhooks differ from its manifests in one more way: they see Jobs labelled
with a queue name only (objectSelector), so the rest of the session's Jobs never depend on
this process. Kueue ignores unlabelled Jobs anyway (manageJobsWithoutQueueName is off).
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import subprocess
from pathlib import Path

import httpx
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.cluster import build
from tests.cluster.plane import ControlPlane, free_port
from tests.cluster.resources import Resources

NAMESPACE = "kueue-system"
SERVICE = "kueue-webhook-service"  # only names the certificate: nothing resolves it
SECRET = "kueue-webhook-server-cert"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# the CRDs Kueue's kustomization gives a conversion webhook (and its cert rotator injects into)
CONVERTED = ("localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters")


def module_dir() -> Path:
    return build.module_dir("kueue", "sigs.k8s.io/kueue")


def _cert(subject: str, key, issuer: x509.Name, issuer_key, sans: list, *, ca: bool) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    b = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer if not ca else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        # the rotator renews what expires within 90 days: a year keeps ours
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
    )
    if ca:
        b = b.add_extension(
            x509.KeyUsage(True, False, True, False, False, True, True, False, False), critical=True
        )
    else:
        b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def make_webhook_certs(folder: Path) -> dict[str, bytes]:
    """The Secret's four entries as Kueue's rotator checks them: a CA valid for the name
    `kueue-ca` (its RSA key in PKCS#1, which it parses), and a serving certificate for the
    Service name and for 127.0.0.1 (what the API server connects to). tls.* also go to `folder`."""
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca = _cert("kueue-ca", ca_key, None, ca_key, [x509.DNSName("kueue-ca")], ca=True)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cert = _cert(
        f"{SERVICE}.{NAMESPACE}.svc",
        key,
        ca.subject,
        ca_key,
        [x509.DNSName(f"{SERVICE}.{NAMESPACE}.svc"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
        ca=False,
    )
    pem = serialization.Encoding.PEM
    data = {
        "ca.crt": ca.public_bytes(pem),
        "ca.key": ca_key.private_bytes(
            pem, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
        ),
        "tls.crt": cert.public_bytes(pem),
        "tls.key": key.private_bytes(
            pem, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
        ),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tls.crt", "tls.key"):
        (folder / name).write_bytes(data[name])
    (folder / "tls.key").chmod(0o600)
    return data


def crds(webhook: str, ca_bundle: str) -> list[dict]:
    """Kueue's CRDs from its module, the converted ones calling the webhook by URL."""
    out = []
    for f in sorted((module_dir() / "config/components/crd/bases").glob("kueue.x-k8s.io_*.yaml")):
        crd = yaml.safe_load(f.read_text())
        if crd["spec"]["names"]["plural"] in CONVERTED:
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "conversionReviewVersions": ["v1"],
                    "clientConfig": {"url": f"{webhook}/convert", "caBundle": ca_bundle},
                },
            }
        out.append(crd)
    return out


def webhook_configurations(webhook: str, ca_bundle: str) -> list[dict]:
    """Kueue's own webhook configurations (its module's manifests, named as its kustomization
    names them), for Kueue's objects and batch Jobs only: the integrations enabled here."""
    out = []
    for doc in yaml.safe_load_all((module_dir() / "config/components/webhook/manifests.yaml").read_text()):
        if not doc:
            continue
        hooks = []
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            if "-kueue-x-k8s-io-" not in path and "-batch-v1-job" not in path:
                continue
            hook["clientConfig"] = {"url": webhook + path, "caBundle": ca_bundle}
            if "-batch-v1-job" in path:
                hook["objectSelector"] = {"matchExpressions": [{"key": QUEUE_LABEL, "operator": "Exists"}]}
            hooks.append(hook)
        doc["metadata"] = {"name": "kueue-" + doc["metadata"]["name"]}
        doc["webhooks"] = hooks
        out.append(doc)
    return out


def configuration(folder: Path, webhook_port: int, health_port: int) -> Path:
    path = folder / "kueue-config.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "config.kueue.x-k8s.io/v1beta2",
                "kind": "Configuration",
                "namespace": NAMESPACE,
                "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
                "metrics": {"bindAddress": "0"},  # no metrics server
                "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(folder / "certs")},
                "leaderElection": {"leaderElect": False},
                "internalCertManagement": {
                    "enable": True,
                    "webhookServiceName": SERVICE,
                    "webhookSecretName": SECRET,
                },
                "integrations": {"frameworks": ["batch/job"]},
                # on by default since v0.9, it serves an aggregated API on a fixed port (8082)
                "featureGates": {"VisibilityOnDemand": False},
            }
        )
    )
    return path


def start(plane: ControlPlane, binary: Path, folder: Path, timeout: float = 90.0) -> subprocess.Popen:
    """Installs Kueue's CRDs, webhooks and Secret on `plane`, starts the controller manager and
    waits until it is ready (certificates injected, webhook server serving). It joins the
    plane's processes: it stops with the plane, its log is kueue.log beside theirs."""
    folder.mkdir(parents=True, exist_ok=True)
    webhook_port, health_port = free_port(), free_port()
    webhook = f"https://127.0.0.1:{webhook_port}"
    certs = make_webhook_certs(folder / "certs")
    ca_bundle = base64.b64encode(certs["ca.crt"]).decode()
    with plane.client() as http:
        res = Resources(http)
        res.apply_all(
            crds(webhook, ca_bundle)
            + webhook_configurations(webhook, ca_bundle)
            + [
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": SECRET, "namespace": NAMESPACE},
                    "data": {k: base64.b64encode(v).decode() for k, v in certs.items()},
                },
            ]
        )
    config = configuration(folder, webhook_port, health_port)
    plane._spawn(
        "kueue", [binary, f"--config={config}", f"--kubeconfig={plane.kubeconfig}", "--zap-log-level=2"]
    )
    ready = f"http://127.0.0.1:{health_port}/readyz"
    plane._wait(lambda: httpx.get(ready, timeout=1).status_code == 200, "kueue", timeout)
    return plane.procs["kueue"]


def stop(plane: ControlPlane) -> None:
    """Kueue goes, and with it the webhooks that would call it: what is left of the plane works
    without it (Kueue's own objects can no longer be converted; nothing else needs them)."""
    plane.stop_process("kueue")
    with plane.client() as http:
        for kind in ("mutating", "validating"):
            http.delete(
                f"/apis/admissionregistration.k8s.io/v1/{kind}webhookconfigurations/kueue-{kind}-webhook-configuration"
            )


def condition(obj: dict | None, kind: str) -> dict:
    return next(
        (c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c["type"] == kind), {}
    )
