"""docs/openapi.yaml against the live embedded hub: schemathesis sends a bounded number of
generated requests to every documented endpoint, as an admin user; no answer may be a 5xx,
and every status and error body must be one the description documents. Jobs it submits
never run (the train GPUs it may use do not exist)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hubtools import REPO, Hub

pytestmark = pytest.mark.hub
CONFIG = """
c.TrainPool.tick_s = 1
c.TrainPool.train_gpus = [99]
c.TrainPool.max_queued_per_user = 1000
c.TrainPool.projects = {"open": {"guarantee": 1}, "closed": {"guarantee": 1, "users": ["someone-else"]}}
"""
EXAMPLES = 25  # per endpoint: a bounded run that fits `make test`


def test_every_documented_endpoint_answers_as_documented(make_hub, tmp_path: Path) -> None:
    cli = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    if cli is None:
        pytest.skip("schemathesis is not installed (make venv installs the test extras)")
    hub: Hub = make_hub(CONFIG, env={"GPUPOOL_CULLER": "0"}).start()
    hub.api("POST", "/hub/api/users/boss", {"admin": True})
    token = hub.user_token("boss")
    report = tmp_path / "junit.xml"
    run = subprocess.run(
        [cli, "run", str(REPO / "docs" / "openapi.yaml"), "--url", f"{hub.url}/services/gpupool",
         "-H", f"Authorization: token {token}", "--max-examples", str(EXAMPLES), "--seed", "16",
         "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,"
                     "response_schema_conformance",
         "--phases", "examples,coverage,fuzzing", "--report", "junit", "--report-junit-path", str(report),
         "--request-timeout", "30", "--continue-on-failure"],
        capture_output=True, text=True, timeout=900,
    )
    print(run.stdout[-4000:])
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:] + hub.tail(30)
