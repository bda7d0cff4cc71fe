"""docs/openapi.yaml against the live embedded hub: schemathesis sends a bounded number of
generated requests to every documented endpoint, as an admin user, then follows the links
between endpoints (submit a job -> read it, its log, cancel it, read it again) in its stateful
phase; the culler's report endpoint also as the culler service. No answer may be a 5xx, and
every status and error body must be one the description documents. Jobs it submits never run
(the train GPUs it may use do not exist)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from gpupool.idle_culler.service import service_definition
from tests.hubtools import REPO, Hub

pytestmark = pytest.mark.hub
CULLER_TOKEN = "test-culler-token-0123456789abcdef"
_, CULLER_ROLE = service_definition("test-culler", "", {})
CONFIG = f"""
c.JupyterHub.services.append({{"name": "test-culler", "api_token": "{CULLER_TOKEN}"}})
c.JupyterHub.load_roles.append({json.dumps({**CULLER_ROLE, "name": "test-culler", "services": ["test-culler"]})})
c.TrainPool.tick_s = 1
c.TrainPool.train_gpus = [99]
c.TrainPool.max_queued_per_user = 1000
c.TrainPool.max_active_per_user = 1000
c.TrainPool.max_active_per_project = 100000
c.TrainPool.max_submissions_per_minute = 100000
c.TrainPool.projects = {{"open": {{"guarantee": 1}}, "closed": {{"guarantee": 1, "users": ["someone-else"]}}}}
"""
EXAMPLES = 25  # per endpoint (and stateful scenarios): a bounded run that fits `make test`
STEPS = 6  # calls in one stateful scenario
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"


def for_this_hub(tmp_path: Path) -> Path:
    """docs/openapi.yaml with this hub's projects and one kind of submission (a command), so that
    the stateful phase's submissions are accepted and the links to the job they made are used."""
    spec = yaml.safe_load((REPO / "docs" / "openapi.yaml").read_text())
    sub = spec["components"]["schemas"]["JobSubmission"]
    sub["properties"] = {
        "project": {"type": "string", "enum": ["open"]},
        "gpus": {"type": "integer", "minimum": 1, "maximum": 2},
        "name": sub["properties"]["name"],
        "priority": sub["properties"]["priority"],
        "command": {
            "type": "array",
            "items": {"type": "string", "minLength": 1, "maxLength": 64, "pattern": "^[a-z]+$"},
            "minItems": 1,
            "maxItems": 4,
        },
    }
    sub["required"], sub["additionalProperties"] = ["project", "gpus", "command"], False
    path = tmp_path / "openapi-this-hub.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def schemathesis(
    cli: str,
    hub: Hub,
    token: str,
    tmp_path: Path,
    name: str,
    *extra: str,
    spec: Path = REPO / "docs" / "openapi.yaml",
) -> tuple[int, str]:
    config = tmp_path / "schemathesis.toml"
    config.write_text(f"[phases.stateful]\nmax-steps = {STEPS}\n")
    report = tmp_path / f"{name}.xml"
    run = subprocess.run(
        [
            cli,
            "--config-file",
            str(config),
            "run",
            str(spec),
            "--url",
            f"{hub.url}/services/gpupool",
            "-H",
            f"Authorization: token {token}",
            "--max-examples",
            str(EXAMPLES),
            "--seed",
            "16",
            "--checks",
            CHECKS,
            *extra,
            "--report",
            "junit",
            "--report-junit-path",
            str(report),
            "--request-timeout",
            "30",
            "--continue-on-failure",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,  # its cache stays out of the clone
    )
    print(f"--- {name}\n" + run.stdout[-3000:])
    tests = ET.parse(report).getroot() if report.exists() else None
    counts = {k: int(tests.get(k, 0)) for k in ("tests", "failures", "errors")} if tests is not None else {}
    print(f"--- {name}: junit {counts}")
    return run.returncode, run.stdout[-8000:] + run.stderr[-2000:]


def test_every_documented_endpoint_answers_as_documented(make_hub, tmp_path: Path) -> None:
    cli = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    if cli is None:
        pytest.skip("schemathesis is not installed (make venv installs the test extras)")
    hub: Hub = make_hub(CONFIG, env={"GPUPOOL_CULLER": "0"}).start()
    hub.api("POST", "/hub/api/users/boss", {"admin": True})
    token = hub.user_token("boss")
    code, out = schemathesis(cli, hub, token, tmp_path, "admin", "--phases", "examples,coverage,fuzzing")
    assert code == 0, out + hub.tail(30)
    # sequences along the links: submit -> read, its log, cancel -> read, cancel again
    code, out = schemathesis(
        cli, hub, token, tmp_path, "stateful", "--phases", "stateful", spec=for_this_hub(tmp_path)
    )
    assert code == 0, out + hub.tail(30)
    # the report only the culler may post: every malformed report is a 400, never a 500
    code, out = schemathesis(
        cli,
        hub,
        CULLER_TOKEN,
        tmp_path,
        "culler",
        "--phases",
        "examples,coverage,fuzzing",
        "--include-path",
        "/api/culler/report",
    )
    assert code == 0, out + hub.tail(30)
