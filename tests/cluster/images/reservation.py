"""KAI's reservation pod program (cmd/resourcereservation), as far as it can go without NVML:
once, annotate this pod with the UUID of the GPU it was given (`run.ai/reserve_for_gpu_index`),
then stay up holding the device until KAI deletes the pod. KAI asks NVML for that UUID; here the
device plugin's NVIDIA_VISIBLE_DEVICES says it. Standard library only."""

import json
import os
import signal
import ssl
import sys
import urllib.request

ANNOTATION = "run.ai/reserve_for_gpu_index"
SA = "/var/run/secrets/kubernetes.io/serviceaccount"


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    devices = [d for d in os.environ.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if d]
    if len(devices) != 1:
        print(f"found {len(devices)} devices, 1 was expected", file=sys.stderr)
        return 1
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
    url = (
        f"https://{host}:{port}/api/v1/namespaces/{os.environ['POD_NAMESPACE']}/pods/{os.environ['POD_NAME']}"
    )
    with open(f"{SA}/token") as f:
        headers = {"Authorization": f"Bearer {f.read().strip()}"}
    ctx = ssl.create_default_context(cafile=f"{SA}/ca.crt")
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), context=ctx, timeout=30) as r:
        pod = json.load(r)
    if ANNOTATION not in (pod["metadata"].get("annotations") or {}):
        body = json.dumps({"metadata": {"annotations": {ANNOTATION: devices[0]}}}).encode()
        req = urllib.request.Request(
            url,
            data=body,
            method="PATCH",
            headers={**headers, "Content-Type": "application/merge-patch+json"},
        )
        urllib.request.urlopen(req, context=ctx, timeout=30).close()
        print(f"pod annotated with GPU {devices[0]}", flush=True)
    signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
