"""Hibernation's saver and restorer (gpupool.gpu.hibernate): a namespace comes back exactly or
not at all, with the names it could not keep and why; foreign, truncated and corrupt states are
refused; a kill -9 at any step of a save leaves the old state or none."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from gpupool.gpu import hibernate as h

ME = h.Identity(user="ada", hub="hubkey", instance="inst1", version="1.0")


def folder(tmp_path: Path) -> Path:
    return h.state_dir(tmp_path, "", "work/analysis.ipynb")


def make_fn():
    def scale(x):  # defined "in the notebook": cloudpickle keeps it by value
        return 3 * x

    return scale


class Point:
    def __init__(self, x: int) -> None:
        self.x = x


def test_round_trip_keeps_values_aliases_and_names_what_it_cannot(tmp_path: Path) -> None:
    arr = np.arange(1_000_000, dtype=np.float32).reshape(1000, 1000)
    shared = [1, 2, 3]
    f = open(tmp_path / "log.txt", "w")  # noqa: SIM115 - an open file is what the test keeps open
    gen = (i for i in range(3))
    ns = {
        "arr": arr,
        "view_of_same": {"a": arr},
        "shared": shared,
        "again": shared,
        "text": "héllo",
        "p": Point(7),
        "np": np,
        "scale": make_fn(),
        "f": f,
        "gen": gen,
        "lock": threading.Lock(),
    }
    saved = h.save(ns, folder(tmp_path), ME, "work/analysis.ipynb")
    assert saved.skipped == {"f": "an open file", "gen": "a generator", "lock": "a lock"}
    assert saved.bytes >= arr.nbytes

    out: dict = {}
    result = h.restore_into(out, folder(tmp_path), ME)
    f.close()
    assert result is not None and not result.refused
    assert sorted(out) == ["again", "arr", "np", "p", "scale", "shared", "text", "view_of_same"]
    assert np.array_equal(out["arr"], arr) and out["arr"].flags.writeable
    assert out["view_of_same"]["a"] is out["arr"]  # one object under two names stays one
    assert out["again"] is out["shared"]
    assert out["p"].x == 7 and out["np"] is np and out["scale"](2) == 6
    msg = result.message()
    assert msg.startswith("gpupool: restored 8 variables")
    assert "not restored: `f` (an open file), `gen` (a generator), `lock` (a lock)" in msg
    # restored once: the next kernel starts clean
    assert h.restore_into({}, folder(tmp_path), ME) is None
    # the next hibernation supersedes the woken state: one generation on disk, not one per wake
    h.save({"x": 1}, folder(tmp_path), ME)
    assert len([p for p in folder(tmp_path).iterdir() if p.name.startswith("gen-")]) == 1


def test_pandas_round_trip(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"a": np.arange(100_000), "b": np.random.default_rng(1).random(100_000), "c": "x"})
    h.save({"df": df, "s": df["b"]}, folder(tmp_path), ME)
    out: dict = {}
    assert not h.restore_into(out, folder(tmp_path), ME).refused
    pd.testing.assert_frame_equal(out["df"], df)
    pd.testing.assert_series_equal(out["s"], df["b"])


def test_a_value_that_fails_to_pickle_is_named_the_rest_kept(tmp_path: Path) -> None:
    class Odd:
        def __reduce__(self):
            raise TypeError("no pickling here")

    h.save({"good": 1, "odd": Odd()}, folder(tmp_path), ME)
    out: dict = {}
    r = h.restore_into(out, folder(tmp_path), ME)
    assert out == {"good": 1}
    assert r.skipped == {"odd": "cannot be saved: TypeError: no pickling here"}


@pytest.mark.parametrize(
    ("ident", "why"),
    [
        (h.Identity("eve", "hubkey", "inst1", "1.0"), "another user"),
        (h.Identity("ada", "otherhub", "inst1", "1.0"), "another hub"),
        (h.Identity("ada", "hubkey", "inst2", "1.0"), "another hub"),
        (h.Identity("ada", "hubkey", "inst1", "2.0"), "gpupool 1.0, this is gpupool 2.0"),
    ],
)
def test_foreign_state_is_refused_and_nothing_restored(tmp_path: Path, ident: h.Identity, why: str) -> None:
    h.save({"x": 1}, folder(tmp_path), ME)
    ns = {"mine": 0}
    r = h.restore_into(ns, folder(tmp_path), ident)
    assert r is not None and why in r.refused and ns == {"mine": 0}
    assert "This is a clean kernel" in r.message()


def _gen(tmp_path: Path) -> Path:
    return folder(tmp_path) / os.readlink(folder(tmp_path) / h.CURRENT)


@pytest.mark.parametrize("damage", ["truncate-buffer", "flip-byte-state", "truncate-manifest", "drop-file"])
def test_corrupt_or_truncated_state_is_refused_whole(tmp_path: Path, damage: str) -> None:
    h.save({"arr": np.ones(10_000), "x": 5}, folder(tmp_path), ME)
    gen = _gen(tmp_path)
    buf = next(gen.glob("buf-*"))
    if damage == "truncate-buffer":
        os.truncate(buf, buf.stat().st_size // 2)
    elif damage == "flip-byte-state":
        data = bytearray((gen / h.STATE).read_bytes())
        data[-3] ^= 0xFF
        (gen / h.STATE).write_bytes(data)
    elif damage == "truncate-manifest":
        os.truncate(gen / h.MANIFEST, 40)
    else:
        buf.unlink()
    ns: dict = {}
    r = h.restore_into(ns, folder(tmp_path), ME)
    assert r is not None and r.refused and ns == {}  # never half-restored


def test_cap_refuses_the_save_and_keeps_the_old_state(tmp_path: Path) -> None:
    h.save({"x": 1}, folder(tmp_path), ME)
    with pytest.raises(h.TooBig):
        h.save({"big": np.zeros(1 << 20)}, folder(tmp_path), ME, cap_bytes=1 << 20)
    out: dict = {}
    h.restore_into(out, folder(tmp_path), ME)
    assert out == {"x": 1}
    assert [p.name for p in folder(tmp_path).iterdir() if p.name.endswith(".tmp")] == []


def test_state_folder_hashes_names_and_is_private(tmp_path: Path) -> None:
    d = h.state_dir(tmp_path, "../../etc", "../../x.ipynb")
    assert d.parent.parent == tmp_path / h.ROOT and ".." not in d.relative_to(tmp_path).parts
    h.save({"x": 1}, d, ME)
    assert (tmp_path / h.ROOT).stat().st_mode & 0o077 == 0
    assert all(p.stat().st_mode & 0o077 == 0 for p in _gen_files(d))


def _gen_files(d: Path) -> list[Path]:
    gen = d / os.readlink(d / h.CURRENT)
    return [gen, *gen.iterdir()]


def test_retention_removes_old_states(tmp_path: Path) -> None:
    h.save({"x": 1}, folder(tmp_path), ME)
    later = os.path.getmtime(folder(tmp_path) / h.CURRENT)
    assert h.expire(tmp_path, keep_days=7, now=later + 6 * 86400) == []
    assert h.expire(tmp_path, keep_days=7, now=later + 8 * 86400) == [folder(tmp_path)]
    assert not folder(tmp_path).exists()


KILLER = """
import os, signal, sys
import numpy as np
from pathlib import Path
from gpupool.gpu import hibernate as h
at = int(sys.argv[2]); seen = [0]
def step(name):
    seen[0] += 1
    if seen[0] == at:
        os.kill(os.getpid(), signal.SIGKILL)
me = h.Identity("ada", "hubkey", "inst1", "1.0")
h.save({"gen": 2, "arr": np.full(1000, 2.0), "t": np.zeros(10)}, Path(sys.argv[1]), me, step=step)
print("done")
"""


def test_kill_9_at_every_step_of_a_save_leaves_old_or_new(tmp_path: Path) -> None:
    """The property, at every step a save has (each file, manifest, rename, switch, prune)."""
    step = 1
    while True:
        d = tmp_path / f"k{step}"
        h.save({"gen": 1, "arr": np.full(1000, 1.0)}, d, ME)
        proc = subprocess.run(
            [sys.executable, "-c", KILLER, str(d), str(step)], capture_output=True, text=True, timeout=60
        )
        out: dict = {}
        r = h.restore_into(out, d, ME)
        assert r is not None and not r.refused, (step, r.refused if r else None)
        assert out["gen"] in (1, 2) and np.all(out["arr"] == out["gen"])  # whole old or whole new
        if proc.returncode == 0:
            assert out["gen"] == 2 and "done" in proc.stdout
            break
        assert proc.returncode == -signal.SIGKILL
        step += 1
    assert step >= 7  # tmp, 3 files, manifest, rename, switch: each was a kill point


FILLER = """
import resource, signal, sys
import numpy as np
from pathlib import Path
from gpupool.gpu import hibernate as h
# the kernel refuses writes past 256 KiB, as a full disk does (EFBIG here, ENOSPC there: OSError)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, 256 << 10))
me = h.Identity("ada", "hubkey", "inst1", "1.0")
try:
    h.save({"gen": 2, "arr": np.full(1 << 17, 2.0)}, Path(sys.argv[1]), me)  # 1 MiB
except OSError as err:
    print("refused", err.errno)
"""


def test_a_full_disk_during_a_save_keeps_the_old_state_whole(tmp_path: Path) -> None:
    """A write the kernel refuses midway (the disk full) leaves no half-written generation: the
    old state still restores whole, and nothing of the failed save is left to fill the disk."""
    d = tmp_path / "full"
    h.save({"gen": 1, "arr": np.full(1000, 1.0)}, d, ME)
    before = sorted(p.name for p in d.iterdir())
    proc = subprocess.run([sys.executable, "-c", FILLER, str(d)], capture_output=True, text=True, timeout=60)
    assert "refused" in proc.stdout, proc.stderr
    assert sorted(p.name for p in d.iterdir()) == before  # no .tmp, no new generation
    out: dict = {}
    r = h.restore_into(out, d, ME)
    assert r is not None and not r.refused and out["gen"] == 1 and np.all(out["arr"] == 1.0)


def test_kernel_folder_keys_on_the_notebook(tmp_path: Path) -> None:
    env = {"JPY_SESSION_NAME": "a.ipynb", "JUPYTERHUB_SERVER_NAME": ""}
    assert h.kernel_folder(env, tmp_path) == h.state_dir(tmp_path, "", "a.ipynb")
    assert h.kernel_folder({}, tmp_path) is None
    assert h.kernel_folder({**env, "JPY_SESSION_NAME": "b.ipynb"}, tmp_path) != h.kernel_folder(env, tmp_path)


def test_manifest_records_whose_state_it_is(tmp_path: Path) -> None:
    h.save({"x": np.ones(3)}, folder(tmp_path), ME, "work/analysis.ipynb")
    m = json.loads((_gen(tmp_path) / h.MANIFEST).read_text())
    assert (m["user"], m["hub"], m["instance"], m["gpupool"], m["format"]) == (
        "ada",
        "hubkey",
        "inst1",
        "1.0",
        1,
    )
    assert {f["name"] for f in m["files"]} == {"buf-000000.bin", "state.pkl"}
    assert all(len(f["sha256"]) == 64 and f["size"] > 0 for f in m["files"])


# -- the culler hibernates before it stops ------------------------------------------------------


class FakeHub:
    """The hub, the gpupool API and one workspace server, as the culler's client sees them."""

    def __init__(self, answer: dict | Exception) -> None:
        self.answer, self.calls = answer, []

    def call(
        self, method: str, url: str, body=None, accept: str = "", timeout: float | None = None
    ) -> object:
        self.calls.append((method, url.split("/", 3)[-1]))
        if url.endswith("/gpupool/hibernate"):
            assert timeout and timeout >= 600  # a save of GiBs is no 30 s hub call
        if url.endswith("api/culler/targets"):
            target = {"owner": "ada", "name": "", "pid": 1, "gpu_uuids": [], "whole_gpus": False}
            target |= {"memory_limit_mib": 0, "extended": False, "admin": False, "groups": ["lab"]}
            return {"workspaces": [target | {"milli": 250, "server_url": "http://srv/user/ada/"}]}
        if url.endswith("/gpupool/hibernate"):
            if isinstance(self.answer, Exception):
                raise self.answer
            return self.answer
        return None

    def paginated(self, url: str, concurrency: int = 1) -> list:
        return [{"name": "ada", "servers": {"": {"ready": True, "started": "2026-06-01T00:00:00Z"}}}]


def _pass(answer: dict | Exception, **cfg) -> tuple[FakeHub, list[dict]]:
    from gpupool.idle_culler.config import IdleCuller
    from gpupool.idle_culler.sampler import GPUUse
    from gpupool.idle_culler.service import Culler

    class Idle:
        def sample(self, targets):
            return {"ada/": GPUUse(0.0, 0)}

    fake = FakeHub(answer)
    now = [1_780_272_000.0]
    culler = Culler(
        IdleCuller(**cfg), fake, "http://hub/hub/api", "http://api/", Idle(), clock=lambda: now[0]
    )
    culler.run_pass()
    now[0] += 3 * 3600  # idle GPU, quiet Jupyter, hours later
    return fake, culler.run_pass()["events"]


SAVED = {
    "ok": True,
    "bytes": 3 << 20,
    "kernels": [{"id": "k1", "ok": True, "bytes": 3 << 20, "skipped": {"f": "an open file"}}],
}


def test_the_culler_hibernates_each_kernel_then_stops_where_it_is_on() -> None:
    fake, events = _pass(SAVED, group_overrides={"lab": {"hibernate": True, "hibernate_max_gib": 2}})
    asked = [c for c in fake.calls if c[0] in ("POST", "DELETE") and "report" not in c[1]]
    assert asked == [("POST", "user/ada/gpupool/hibernate"), ("DELETE", "hub/api/users/ada/server")]
    assert [e["kind"] for e in events] == ["cull"]
    assert "hibernated (1 kernel, 3 MiB; not kept: f) and stopped because" in events[0]["message"]
    assert "your variables come back when you start" in events[0]["message"]
    # the size as the server's save reported it, for the hub's record (gpupool.api.hibernation)
    assert events[0]["hibernated"] == {"bytes": 3 << 20, "kernels": 1, "notebooks": []}


def test_without_hibernation_or_when_it_fails_the_stop_is_as_before_with_the_reason() -> None:
    fake, events = _pass(SAVED)  # off: the server is not asked
    assert ("POST", "user/ada/gpupool/hibernate") not in fake.calls
    assert events[0]["message"] == "ada/ stopped because its GPU has been idle"
    too_big = {
        "ok": False,
        "kernels": [{"id": "k1", "ok": False, "error": "the state is over the cap of 2.0 GiB"}],
    }
    fake, events = _pass(too_big, hibernate=True)
    assert ("DELETE", "hub/api/users/ada/server") in fake.calls
    assert (
        "could not be hibernated (the state is over the cap of 2.0 GiB): its variables are lost"
        in events[0]["message"]
    )
    mixed = {
        "ok": False,
        "kernels": [*SAVED["kernels"], {"id": "k2", "ok": False, "error": "NameError: get_ipython"}],
    }
    fake, events = _pass(mixed, hibernate=True)  # an R kernel beside a Python one: only it is lost
    assert (
        "hibernated (1 kernel, 3 MiB; not kept: f; 1 other kernel could not be hibernated"
        in events[0]["message"]
    )
    fake, events = _pass(OSError("connection refused"), hibernate=True)
    assert ("DELETE", "hub/api/users/ada/server") in fake.calls and "its variables are lost" in events[0][
        "message"
    ]


def test_hibernation_needs_the_servers_scope_and_checked_overrides() -> None:
    from traitlets import TraitError

    from gpupool.idle_culler.config import IdleCuller
    from gpupool.idle_culler.service import service_definition

    assert "access:servers" not in service_definition("c", "")[1]["scopes"]
    assert "access:servers" in service_definition("c", "", {"hibernate": True})[1]["scopes"]
    over = {"profile_overrides": {"gpu": {"hibernate": True}}}
    assert "access:servers" in service_definition("c", "", over)[1]["scopes"]
    with pytest.raises(TraitError, match="hibernate must be True or False"):
        IdleCuller(group_overrides={"lab": {"hibernate": "yes"}})
    policy = IdleCuller(group_overrides={"a": {"hibernate": True}, "b": {"hibernate": False}}).policy()
    assert policy.limits_for(["a", "b"]).hibernate  # keeping the variables is the kinder


# -- a real kernel: its variable survives stop + start ------------------------------------------


def test_a_real_kernels_variables_survive_its_stop_and_come_back_before_the_first_cell(
    tmp_path: Path,
) -> None:
    import asyncio

    from jupyter_client.manager import AsyncKernelManager

    import gpupool.gpu
    from gpupool.widgets.labserver import HIBERNATE_EXPR, hibernate_kernel

    startup = Path(gpupool.gpu.__file__).parent / "startup"
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "JPY_SESSION_NAME": "work/analysis.ipynb",  # what jupyter_server gives a notebook's kernel
        "JUPYTERHUB_USER": "ada",
        "GPUPOOL_HUB": "hubkey",
        "GPUPOOL_INSTANCE": "inst1",
        "PYTHONPATH": str(startup),
    }

    async def run(code: str, km: AsyncKernelManager) -> str:
        client = km.client()
        client.start_channels()
        out: list[str] = []
        try:
            # iopub is a SUB socket: output sent before it is connected is lost, and execute_interactive
            # then waits its whole timeout for it (half the runs under load); ready = connected
            await client.wait_for_ready(timeout=60)
            await client.execute_interactive(
                code,
                timeout=60,
                output_hook=lambda m: (
                    out.append(m["content"].get("text", "")) if m["msg_type"] == "stream" else None
                ),
            )
        finally:
            client.stop_channels()
        return "".join(out)

    async def story() -> tuple[dict, str]:
        km = AsyncKernelManager(kernel_name="python3")
        await km.start_kernel(env=env)
        try:
            await run("import numpy as np\nx = np.arange(10.0)\nf = open('/dev/null')", km)
            saved = await hibernate_kernel(km, HIBERNATE_EXPR.format(cap=0, quota=0, keep=0), 60)
        finally:
            await km.shutdown_kernel(now=True)
        km = AsyncKernelManager(kernel_name="python3")
        await km.start_kernel(env=env)
        try:
            first = await run("print('sum', x.sum(), 'f' in dir())", km)
        finally:
            await km.shutdown_kernel(now=True)
        return saved, first

    saved, first = asyncio.run(story())
    assert saved["ok"] and saved["variables"] == 2 and saved["skipped"] == {"f": "an open file"}
    assert "gpupool: restored 2 variables" in first and "not restored: `f` (an open file)" in first
    assert "sum 45.0 False" in first


def test_hibernate_now_saves_every_kernel_before_it_stops_the_server(tmp_path: Path, monkeypatch) -> None:
    from types import SimpleNamespace

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("JPY_SESSION_NAME", "a.ipynb")
    env = {"JUPYTERHUB_SERVICE_URL": "http://127.0.0.1:9/user/ada/", "JUPYTERHUB_API_TOKEN": "t"}
    shell = SimpleNamespace(user_ns={"x": 1, "f": open(os.devnull)}, user_ns_hidden={})  # noqa: SIM115
    said: list[str] = []
    asked: list[str] = []

    def post(path, body, environ, timeout):
        asked.append(path)
        return {"ok": True, "kernels": [{"ok": True, "bytes": 5}]}

    assert h.hibernate_now(shell, env, post, said.append)
    assert asked == ["gpupool/hibernate", "api/shutdown"]
    assert "hibernated 2 kernels" in said[0] and "not kept: `f` (an open file)" in said[0]
    assert h.load(h.kernel_folder(), h.Identity.from_env())[0] == {"x": 1}

    asked.clear()
    said.clear()
    broken = {"ok": False, "kernels": [{"ok": False, "error": "the state is over the cap of 8.0 GiB"}]}
    assert not h.hibernate_now(shell, env, lambda *a: (asked.append(a[0]), broken)[1], said.append)
    assert asked == ["gpupool/hibernate"]  # a kernel not saved: the server is not stopped
    assert "over the cap" in said[0] and "nothing was stopped" in said[0]
    shell.user_ns["f"].close()


@pytest.mark.parametrize(
    "answer", [["not", "an", "object"], "saved", {"ok": True, "kernels": ["k1", {"ok": "yes", "bytes": 5}]}]
)
def test_hibernate_now_stops_nothing_on_an_answer_it_cannot_read(answer, tmp_path: Path, monkeypatch) -> None:
    # the server's answer for the other kernels is read as a HibernateAnswer: one that is not an
    # object, or kernels it cannot read, are kernels not known to be saved; nothing is stopped
    from types import SimpleNamespace

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("JPY_SESSION_NAME", "a.ipynb")
    env = {"JUPYTERHUB_SERVICE_URL": "http://127.0.0.1:9/user/ada/", "JUPYTERHUB_API_TOKEN": "t"}
    shell = SimpleNamespace(user_ns={"x": 1}, user_ns_hidden={})
    said: list[str] = []
    asked: list[str] = []

    def post(path, body, environ, timeout):
        asked.append(path)
        return answer

    assert not h.hibernate_now(shell, env, post, said.append)
    assert asked == ["gpupool/hibernate"] and "nothing was stopped" in said[0]


def test_the_home_page_says_a_culled_server_was_hibernated() -> None:
    import datetime as dt
    from types import SimpleNamespace

    from gpupool.api.auth import Directory
    from gpupool.api.services import ApiServices
    from gpupool.api.warnings import stops_for

    now = 1_780_300_000.0
    at = dt.datetime.fromtimestamp(now - 600, dt.UTC).replace(tzinfo=None)

    def event(name: str, message: str) -> SimpleNamespace:
        return SimpleNamespace(
            kind="cull", name=name, time=at, message=message, data={"reason": "workday-end"}
        )

    store = SimpleNamespace(
        events=lambda limit, owner: [
            event(
                "a",
                "ada/a hibernated (1 kernel, 3 MiB) and stopped because the workday ends: your variables come back when you start",
            ),
            event(
                "b",
                "ada/b stopped because the workday ends; it could not be hibernated (over the cap): its variables are lost",
            ),
        ],
        allocations=lambda kind, owner: [],
    )
    root = SimpleNamespace(
        api_services=ApiServices(SimpleNamespace(store=store), Directory()), pool=SimpleNamespace(store=store)
    )
    said = {s["name"]: s["message"] for s in stops_for(root, SimpleNamespace(name="ada"), now=now)}
    assert said["a"].startswith("hibernated at ") and said["a"].endswith(
        "(end of the workday) — your variables come back when you start"
    )
    assert said["b"].startswith("stopped at ") and said["b"].endswith(": end of the workday")
    # what the "Server not running" page adds: wake it, or start it again
    from gpupool.api.warnings import stopped_server

    ada = SimpleNamespace(name="ada")
    assert stopped_server(root, ada, "a", now=now)["todo"] == "Start it to wake it."
    assert stopped_server(root, ada, "b", now=now)["todo"] == "Start it again when you need it."
    assert stopped_server(root, ada, "c", now=now) is None  # not stopped by the culler: the hub's words


def test_a_kernel_that_has_not_woken_yet_keeps_the_state_it_would_restore(
    tmp_path: Path, monkeypatch
) -> None:
    """Opened and left before its first cell: the culler's next hibernation must not save the
    empty kernel over the variables still waiting for it."""
    from types import SimpleNamespace

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("JPY_SESSION_NAME", "a.ipynb")
    me = h.Identity.from_env()
    h.save({"x": 1}, h.kernel_folder(), me)
    registered = []
    shell = SimpleNamespace(
        user_ns={}, user_ns_hidden={}, events=SimpleNamespace(register=lambda e, f: registered.append(f))
    )
    h.install_wake(shell)
    assert h.save_shell(shell)["kept"] == "the state not woken yet"
    assert h.load(h.kernel_folder(), me)[0] == {"x": 1}
    shell.events.unregister = lambda e, f: None
    registered[0]()  # the first cell: restored, and from now on this kernel's own variables count
    assert shell.user_ns == {"x": 1}
    shell.user_ns["y"] = 2
    assert h.save_shell(shell)["variables"] == 2


def test_a_hub_down_between_the_save_and_the_stop_is_saved_again_and_stopped_at_the_next_pass() -> None:
    """The crash point between hibernate and cull: the save is on the user's disk and the server
    still runs; the stop that could not reach the hub is no cull (no event, no record), and the
    next pass saves the kernel as it is then and stops it, with the record of that save."""
    import urllib.error

    from gpupool.idle_culler.config import IdleCuller
    from gpupool.idle_culler.sampler import GPUUse
    from gpupool.idle_culler.service import Culler

    class Idle:
        def sample(self, targets):
            return {"ada/": GPUUse(0.0, 0)}

    class HubDown(FakeHub):
        down = True

        def call(self, method, url, body=None, accept="", timeout=None):
            if method == "DELETE" and self.down:
                self.calls.append((method, url.split("/", 3)[-1]))
                raise urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
            return super().call(method, url, body, accept, timeout)

    fake = HubDown(SAVED)
    now = [1_780_272_000.0]
    culler = Culler(
        IdleCuller(hibernate=True), fake, "http://hub/hub/api", "http://api/", Idle(), clock=lambda: now[0]
    )
    culler.run_pass()
    now[0] += 3 * 3600
    assert [e["kind"] for e in culler.run_pass()["events"]] == []  # saved, but not stopped
    asked = [c for c in fake.calls if c[0] in ("POST", "DELETE") and "report" not in c[1]]
    assert asked == [("POST", "user/ada/gpupool/hibernate"), ("DELETE", "hub/api/users/ada/server")]
    fake.down, fake.calls = False, []  # the hub is back
    now[0] += 60
    events = culler.run_pass()["events"]
    asked = [c for c in fake.calls if c[0] in ("POST", "DELETE") and "report" not in c[1]]
    assert asked == [("POST", "user/ada/gpupool/hibernate"), ("DELETE", "hub/api/users/ada/server")]
    assert [e["kind"] for e in events] == ["cull"] and events[0]["hibernated"]["bytes"] == 3 << 20
