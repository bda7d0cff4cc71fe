"""The cluster build script (`make cluster`): an optional component that does not build is
reported and never fails the build of the plane (its own tests then skip, or fail in CI)."""

from __future__ import annotations

import shutil
import threading
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


def test_a_second_builder_waits_for_the_first_and_compiles_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a background `make cluster` holds the component while the cluster tests' fixture asks for
    # it: the fixture must wait and use that build, never compile the same pins beside it (on two
    # cores that doubles a cold build). The module cannot build at all (GOPROXY=off, a tool Go
    # cannot find): a second builder that ran Go instead of waiting fails at once.
    (tmp_path / "go" / "busy").mkdir(parents=True)
    (tmp_path / "go" / "busy" / "go.mod").write_text(
        "module gpupool.test/cluster/busy\n\ngo 1.25\n\ntool example.invalid/nothing/cmd/nothing\n"
    )
    (tmp_path / "go" / "busy" / "go.sum").write_text("")
    monkeypatch.setattr(build, "GO_DIR", tmp_path / "go")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("GOPROXY", "off")
    component, version = build.Component("busy", ("nothing",)), build.go_version()
    said: list[str] = []
    waiting = threading.Event()
    result: list[Path | BaseException] = []

    def log(line: str) -> None:
        said.append(line)
        waiting.set()

    def second() -> None:
        try:
            result.append(build.build(component, version, log=log))
        except BaseException as err:  # noqa: BLE001 - handed to the test's thread
            result.append(err)

    with build.build_lock(component, version):  # the first builder, at work
        waiter = threading.Thread(target=second)
        waiter.start()
        while waiter.is_alive() and not waiting.wait(0.05):  # it waits, or runs Go and ends
            pass
        assert waiting.is_set() and not result, result
        out = build.bin_dir(component, version)  # the first builder's result, whole
        out.mkdir(parents=True)
        (out / ".complete").write_text(version)
    waiter.join(timeout=30)
    assert result == [out]
    assert said == ["waiting for another build of busy on this machine to finish"]
