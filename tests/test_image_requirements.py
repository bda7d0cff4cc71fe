"""The hub and single-user images install gpupool's requirements in a layer before gpupool's own
(helm/hub-image, helm/singleuser-image): that layer stays in docker's build cache (and
tests/cluster/images.py's) while the requirements do, so a change to gpupool rebuilds a few MiB,
not the whole environment. gpupool's wheel goes in with --no-deps (pip's walk of every installed
package's requirements took minutes of the build), so the list must be pyproject.toml's: a
requirement it missed would be missing from the image."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.cluster.images import instructions

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def requirement_layer(dockerfile: Path) -> list[Requirement]:
    """The requirements of the last stage's first RUN that installs named packages with pip (not
    a wheel), in the order written."""
    runs = [rest for word, rest in instructions(dockerfile.read_text()) if word in ("RUN", "FROM")]
    last_stage = runs[max(i for i, rest in enumerate(runs) if rest.startswith(("${BASE}", "$BASE"))) :]
    for rest in last_stage:
        cmd = rest.partition("pip install")[2]
        words = re.findall(r'"([^"]+)"', cmd)
        if words and not any("$" in w for w in words):
            return [Requirement(w) for w in words]
    raise AssertionError(f"{dockerfile}: no pip install of named requirements before gpupool's wheel")


def by_name(reqs: list[Requirement]) -> dict[str, str]:
    return {canonicalize_name(r.name) + str(sorted(r.extras)): str(r.specifier) for r in reqs}


@pytest.mark.parametrize(
    ("image", "extras", "pinned"),
    [
        ("hub-image", ["kubernetes", "postgres", "culler"], {}),
        # the single-user server's JupyterHub is the hub's own version (z2jh 4.4.0's 5.5.0)
        ("singleuser-image", [], {"jupyterhub": "==5.5.0"}),
    ],
)
def test_the_images_requirement_layer_is_pyprojects_requirements(
    image: str, extras: list[str], pinned: dict[str, str]
) -> None:
    declared = [Requirement(r) for r in PYPROJECT["dependencies"]]
    for extra in extras:
        declared += [Requirement(r) for r in PYPROJECT["optional-dependencies"][extra]]
    expected = by_name(declared)
    for name, spec in pinned.items():
        expected[name + "[]"] = spec
    dockerfile = REPO / "helm" / image / "Dockerfile"
    assert by_name(requirement_layer(dockerfile)) == expected
    # and gpupool's wheel comes after, alone
    text = dockerfile.read_text()
    wheel = 'pip install --no-deps "$(ls /tmp/wheels/gpupool-*.whl)' + (
        f"[{','.join(extras)}]" if extras else ""
    )
    assert text.index(wheel) > text.index('"numpy>=1.26"')
