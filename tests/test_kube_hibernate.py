"""Hibernation on Kubernetes: the pod keeps its state on the user's claim, and wakes through the
image's start-up hook; a pod whose home is on its own disk has its saves refused, with the reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kubernetes_asyncio.client import (
    V1Container,
    V1EnvVar,
    V1PersistentVolumeClaimVolumeSource,
    V1Pod,
    V1PodSpec,
    V1Volume,
    V1VolumeMount,
)

from gpupool.gpu import hibernate as h
from gpupool.spawner.kube_hibernate import ENV_REFUSED, apply_hibernate, state_claim

HOME = "/home/jovyan"
HOOK = "/opt/conda/lib/python3.12/site-packages/gpupool/gpu/startup"


def pod(mounts: list[tuple[str, str]], volumes: dict[str, str | None], env: list | None = None) -> V1Pod:
    """mounts: (path, volume); volumes: name -> claim (None: an emptyDir)."""
    return V1Pod(
        spec=V1PodSpec(
            containers=[
                V1Container(
                    name="notebook",
                    env=env,
                    volume_mounts=[V1VolumeMount(mount_path=p, name=n) for p, n in mounts],
                )
            ],
            volumes=[
                V1Volume(
                    name=n,
                    persistent_volume_claim=V1PersistentVolumeClaimVolumeSource(claim_name=c) if c else None,
                    empty_dir={} if c is None else None,
                )
                for n, c in volumes.items()
            ],
        )
    )


def env_of(p: V1Pod) -> dict[str, str]:
    return {e.name: e.value for e in p.spec.containers[0].env}


def test_the_state_is_on_the_claim_mounted_at_the_home() -> None:
    """z2jh's default: the user's claim at the home; the deepest mount decides."""
    assert state_claim(pod([(HOME, "home")], {"home": "claim-ada"}), HOME) == "claim-ada"
    assert state_claim(pod([("/home/jovyan/", "home")], {"home": "claim-ada"}), HOME) == "claim-ada"
    # an emptyDir over ~/.gpupool hides the claim: the state would go with the pod
    hidden = pod([(HOME, "home"), (HOME + "/.gpupool", "scratch")], {"home": "claim-ada", "scratch": None})
    assert state_claim(hidden, HOME) is None
    # only a sibling of the home is on a claim, or /home/jovyanx is not /home/jovyan
    assert state_claim(pod([("/data", "d")], {"d": "claim-ada"}), HOME) is None
    assert state_claim(pod([("/home/jovyanx", "d")], {"d": "claim-ada"}), HOME) is None
    assert state_claim(pod([], {}), HOME) is None
    assert state_claim(pod([(HOME, "home")], {"home": "claim-ada"}), "relative") is None


def test_the_pod_gets_the_image_hook_first_and_keeps_its_own_pythonpath() -> None:
    p = apply_hibernate(
        pod([(HOME, "home")], {"home": "claim-ada"}, [V1EnvVar(name="PYTHONPATH", value="/srv/lib")]),
        HOME,
        HOOK,
    )
    env = env_of(p)
    assert env["PYTHONPATH"] == f"{HOOK}:/srv/lib"
    assert ENV_REFUSED not in env
    assert [e.name for e in p.spec.containers[0].env].count("PYTHONPATH") == 1
    # applied twice (a hook re-run) it does not stack the hook
    assert env_of(apply_hibernate(p, HOME, HOOK))["PYTHONPATH"] == f"{HOOK}:/srv/lib"


def test_a_home_on_the_pods_own_disk_is_marked_with_the_reason() -> None:
    env = env_of(apply_hibernate(pod([(HOME, "home")], {"home": None}), HOME, HOOK))
    assert env["PYTHONPATH"] == HOOK  # waking still works for a state the user copied there
    assert "pod's own disk" in env[ENV_REFUSED] and "singleuser.storage" in env[ENV_REFUSED]


SAVE = """
import json
from gpupool.gpu import hibernate as h
class Shell:
    user_ns = {"x": 41}
print(h.save_json(Shell()))
"""


def test_a_refused_pod_saves_nothing_and_says_why(tmp_path: Path) -> None:
    """What the culler's hibernate call gets from a kernel in such a pod: no state, the reason (it
    then stops the server as before, and says why)."""
    base = {**os.environ, "HOME": str(tmp_path), "JPY_SESSION_NAME": "a.ipynb"}
    ok = subprocess.run([sys.executable, "-c", SAVE], env=base, capture_output=True, text=True, timeout=60)
    assert '"ok": true' in ok.stdout, ok.stderr
    refused = subprocess.run(
        [sys.executable, "-c", SAVE],
        env={**base, ENV_REFUSED: "on the pod's own disk", "JPY_SESSION_NAME": "b.ipynb"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert '"ok": false' in refused.stdout and "pod's own disk" in refused.stdout, refused.stderr
    assert h.read_manifest(h.state_dir(tmp_path, "", "b.ipynb")) is None
