"""Kubernetes tests without a cluster: schemas from ../shared/schemas beside the repository
(GPUPOOL_SHARED_DIR overrides) and a fake API server speaking the real REST and watch protocol,
kept only for what the real control plane cannot serve (pod logs: kwok runs no container; see
docs/kubernetes.md). The real control plane's tests are in tests/cluster."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from tests.k8s.fake_apiserver import Cluster, FakeAPIServer

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("GPUPOOL_SHARED_DIR", REPO.parent / "shared"))
SCHEMAS = SHARED / "schemas"


@pytest.fixture(scope="session")
def schemas() -> Path:
    if not SCHEMAS.exists():
        if os.environ.get("CI"):
            pytest.fail(f"schemas missing at {SCHEMAS}")
        pytest.skip("shared schemas not present")
    return SCHEMAS


@pytest.fixture(scope="session")
def fake_api() -> Iterator[FakeAPIServer]:
    api = FakeAPIServer().start()
    yield api
    api.stop()


@pytest.fixture
def apiserver(fake_api: FakeAPIServer) -> FakeAPIServer:
    fake_api.reset()
    return fake_api


@pytest.fixture
def cluster(apiserver: FakeAPIServer) -> Cluster:
    return Cluster(apiserver)


@pytest.fixture
async def api_client(apiserver: FakeAPIServer) -> AsyncIterator[client.ApiClient]:
    async with client.ApiClient(client.Configuration(host=apiserver.url)) as c:
        yield c
