"""The cluster build script (`make cluster`): an optional component that does not build is
reported and never fails the build of the plane (its own tests then skip, or fail in CI)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.cluster import build

pytestmark = pytest.mark.skipif(not shutil.which("go"), reason="go is not installed")


def test_an_optional_component_that_fails_to_build_is_reported_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # a real wrapper module whose tool Go cannot find (as a proxy refusal or a compile error ends)
    (tmp_path / "go" / "broken").mkdir(parents=True)
    (tmp_path / "go" / "broken" / "go.mod").write_text(
        "module gpupool.test/cluster/broken\n\ngo 1.25\n\ntool example.invalid/nothing/cmd/nothing\n"
    )
    (tmp_path / "go" / "broken" / "go.sum").write_text("")
    monkeypatch.setattr(build, "GO_DIR", tmp_path / "go")
    monkeypatch.setattr(build, "COMPONENTS", ())
    monkeypatch.setattr(build, "OPTIONAL", (build.Component("broken", ("nothing",)),))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("GOPROXY", "off")  # nothing to fetch: the failure is Go's own, at once

    assert build.main([]) == 0
    err = capsys.readouterr().err
    assert "not built: broken" in err and "building broken failed" in err and "example.invalid" in err, err
    assert build.main(["--check"]) == 1  # and --check still says it is missing
    with pytest.raises(RuntimeError, match="building broken failed"):
        build.optional("broken")
