"""docs/options.md, the options reference, is what docs/options_reference.py generates from the
traits today, and it covers every option an admin can set: each class `gpupool up
--generate-config` writes, each spawner JupyterHub finds by its entry point, every option of theirs,
with its help text and an example."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "docs" / "options.md"


def _generator():
    spec = importlib.util.spec_from_file_location("options_reference", REPO / "docs" / "options_reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sections(text: str) -> dict[str, str]:
    """`c.Class.option` -> the text of its section."""
    parts = re.split(r"^### `(c\.\w+\.\w+)`\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_reference_is_up_to_date():
    # a process of its own: the generator imports every module of the package, and defaults read
    # from the environment are shown as without it (a hub's JUPYTERHUB_API_URL must not leak in)
    env = {**os.environ, "JUPYTERHUB_API_URL": "http://elsewhere:1/hub/api"}
    done = subprocess.run(
        [sys.executable, str(REPO / "docs" / "options_reference.py"), "--check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr or "run python docs/options_reference.py"


def test_every_option_an_admin_can_set_is_in_the_reference():
    from gpupool.wiring.cli import config_classes

    sections = _sections(REFERENCE.read_text())
    shown = _generator()._default  # the default, with the hub's own Python named, not its path
    classes = list(config_classes())
    classes += [
        ep.load() for ep in entry_points(group="jupyterhub.spawners") if ep.value.startswith("gpupool.")
    ]
    assert len(classes) >= 10
    for cls in classes:
        ours = {
            name
            for name, trait in cls.class_traits(config=True).items()
            if trait.this_class.__module__.startswith("gpupool.")
        }
        assert ours, cls
        for name in ours:
            key = f"c.{cls.__name__}.{name}"
            assert key in sections, f"{key} is missing from docs/options.md"
            section = sections[key]
            trait = cls.class_traits()[name]
            assert f"default: `{shown(trait)}`" in section, key
            assert "Example" in section, f"{key}: its help has no example"
    # the spawners' own option, which a mixin that is no Configurable declares
    assert "c.GPUKubeSpawner.ready_poll_s" in sections
    assert "c.GPULocalProcessSpawner.ready_poll_s" in sections
    # the help's `Example::` block is a fenced block MyST renders as code, not a paragraph
    assert (
        "```python\nc.GPUPool.allowed_fractions = [0.1, 0.25, 0.5, 1, 2]\n```"
        in sections["c.GPUPool.allowed_fractions"]
    )


def test_the_generator_walks_every_package_that_installs():
    """A new sub-package folder (package-dir in pyproject) must be walked, or its classes would
    silently be left out."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = pyproject["tool"]["setuptools"]["packages"]
    walked = set(_generator().modules())
    missing = [p for p in packages if p not in walked]
    assert not missing, f"not walked by docs/options_reference.py: {missing}"
