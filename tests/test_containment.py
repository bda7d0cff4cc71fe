"""Containment by the kernel: a process that leaves its session (setsid) and its environment
(env -i) still dies with the job or workspace that started it, because it cannot leave its cgroup.

The first tests use the cgroup back-ends directly (v1 freezer and v2 cgroup.kill, each where this
machine has it: both on a hybrid machine); the others a real hub, as `make up` runs it (root): a job
and a workspace each start such an escapee, and ending them ends it, before their GPU share is
released. Needs root (only root makes cgroups); skipped with the reason elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.hubtools import Hub
from tests.support.wait import until

J = "/services/gpupool/api/jobs"
# the escapee: a new session, an empty environment, its pid written where the test looks
ESCAPE = "setsid env -i /bin/sh -c 'echo $$ > {pidfile}; exec sleep 100000' </dev/null >/dev/null 2>&1 &"


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def read_pid(path: Path) -> int:
    return until(
        lambda: path.exists() and path.read_text().strip().isdigit() and int(path.read_text()),
        f"{path} written",
    )


def escaped(pid: int) -> bool:
    """It left: its own session, and none of its parent's environment (the shell adds only PWD)."""
    sid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])
    environ = [v for v in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if v]
    return sid == pid and all(v.startswith(b"PWD=") for v in environ)


def backends() -> list:
    try:
        from gpupool.contain import Unavailable, detect
    except ImportError as err:  # code without containment: its hub tests below show what fails
        return [pytest.param(None, marks=pytest.mark.skip(reason=str(err)))]
    if os.geteuid() != 0:
        return [pytest.param(None, marks=pytest.mark.skip(reason="only root makes cgroups"))]
    out = []
    for mode in ("v1", "v2"):
        tree = detect(mode, f"test{secrets.token_hex(4)}")
        mark = (
            [pytest.mark.skip(reason=f"no {mode} here: {tree.reason}")]
            if isinstance(tree, Unavailable)
            else []
        )
        if tree.available:  # made again when the test runs: a deselected one leaves nothing behind
            tree.remove_root()
        out.append(pytest.param(tree, id=mode, marks=mark))
    return out


@pytest.fixture
def open_dir():
    """A folder every account may write in (the test's own tmp_path is root's alone)."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="gpupool-contain-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("tree", backends())
def test_a_setsid_env_i_child_dies_with_its_cgroup_and_cannot_move_out(tree, open_dir: Path) -> None:
    from gpupool.contain import joiner

    name = "inst/job-x"
    pidfile = open_dir / "escaped.pid"
    fd = tree.join_fd(name)
    try:
        # as nobody, like a job: it starts the escapee, then tries to leave its cgroup itself
        script = ESCAPE.format(pidfile=pidfile) + f"\necho $$ > {tree.root}/cgroup.procs; sleep 100000"
        proc = subprocess.Popen(
            ["/bin/sh", "-c", script],
            start_new_session=True,
            preexec_fn=joiner(fd),
            user=65534,
            group=65534,
            extra_groups=[],
            stderr=subprocess.PIPE,
        )
    finally:
        os.close(fd)
    try:
        pid = read_pid(pidfile)
        assert escaped(pid)
        members = set(tree.pids(name))
        assert {proc.pid, pid} <= members, members  # moving out was refused: still in
        assert (
            tree.path(name).stat().st_uid == 0
            and (tree.path(name) / "cgroup.procs").stat().st_mode & 0o022 == 0
        )
        until(lambda: tree.kill(name), "the cgroup emptied", timeout=10)
        proc.wait(10)
        assert b"Permission denied" in proc.stderr.read()
        assert not alive(pid) and not alive(proc.pid)
        assert tree.remove(name)
    finally:
        os.killpg(proc.pid, signal.SIGKILL) if alive(proc.pid) else None
        tree.end(name, 5)
        tree.remove("inst")
        tree.remove_root()


def test_no_cgroups_is_said_plainly() -> None:
    from gpupool.contain import WorkloadCgroups, detect

    tree = detect("off", "x")
    assert not tree.available and "turned off" in tree.reason
    assert "NO cgroups" in WorkloadCgroups(tree, "i").describe()
    none = detect("v2", "x", mountinfo="", proc_cgroup="")
    assert not none.available and "no cgroup2" in none.reason


# --- a real hub ----------------------------------------------------------------------------
CONFIG = """
c.Containment.memory_limit = "600M"
c.Containment.profile_limits = {"0.25": {"memory_limit": "500M"}}
c.TrainPool.tick_s = 0.3
c.TrainPool.grace_s = 2
c.TrainPool.projects = {"lab": {"guarantee": 1}}
"""
JOB = """
import os, subprocess, time
subprocess.run(["/bin/sh", "-c", {escape!r}], check=True)
while not os.path.exists("escaped.pid") or not open("escaped.pid").read().strip():
    time.sleep(0.05)
print("the escapee runs", flush=True)
while {wait} and not os.path.exists("go"):
    time.sleep(0.05)
"""
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="only a root hub makes cgroups")


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> Hub:
    from tests.conftest import require_chp

    require_chp()
    h = Hub(
        state=tmp_path_factory.mktemp("contain"), extra_config=CONFIG, env={"GPUPOOL_CULLER": "0"}
    ).start()
    yield h
    h.stop()


def job_with_escapee(hub: Hub, token: str, wait: bool) -> tuple[dict, int]:
    job = hub.api(
        "POST",
        J,
        {
            "project": "lab",
            "gpus": 1,
            "name": "escape",
            "script": JOB.format(escape=ESCAPE.format(pidfile="escaped.pid"), wait=wait),
        },
        token=token,
    )
    row = until(
        lambda: (
            (j := hub.api("GET", f"{J}/{job['id']}", token=token))["workdir"]
            and Path(j["workdir"], "escaped.pid").exists()
            and j
        ),
        "the job's escapee",
    )
    pid = read_pid(Path(row["workdir"], "escaped.pid"))
    assert escaped(pid)
    return job, pid


@pytest.mark.hub
@root_only
@pytest.mark.parametrize("end", ["finishes", "is cancelled"])
def test_a_jobs_setsid_env_i_child_dies_when_the_job_ends_before_its_gpu_is_released(
    hub: Hub, end: str
) -> None:
    token = hub.user_token("ann")
    job, pid = job_with_escapee(hub, token, wait=end == "is cancelled")
    if end == "is cancelled":
        hub.api("DELETE", f"{J}/{job['id']}", token=token)
    done = hub.wait_job(job["id"], {"succeeded", "failed", "cancelled"}, token)
    assert done["state"] == ("succeeded" if end == "finishes" else "cancelled"), done
    # the job counts as ended only once its cgroup is empty: the escapee is dead by now
    assert not alive(pid), f"process {pid} of job {job['id']} outlived it"
    assert not [s for s in hub.allocations() if s["kind"] == "train"]


def terminal_run(hub: Hub, user: str, token: str, line: str) -> None:
    """Type a line into a Jupyter terminal of the user's server, as a user does."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    term = hub.api("POST", f"/user/{user}/api/terminals", {}, token=token)["name"]

    async def type_it() -> None:
        ws = await websocket_connect(
            HTTPRequest(
                f"ws://127.0.0.1:{hub.port}/user/{user}/terminals/websocket/{term}",
                headers={"Authorization": f"token {token}"},
            )
        )
        ws.write_message(json.dumps(["stdin", line + "\r"]))
        await asyncio.sleep(0.5)  # the bytes reach the shell; the test then waits for the pid file
        ws.close()

    asyncio.run(type_it())


@pytest.mark.hub
@root_only
def test_a_workspace_terminals_setsid_env_i_child_dies_when_the_server_stops(
    hub: Hub, open_dir: Path
) -> None:
    hub.spawn("bea", 0.5)
    token = hub.user_token("bea")
    pidfile = open_dir / "escaped.pid"
    terminal_run(hub, "bea", token, ESCAPE.format(pidfile=pidfile))
    pid = read_pid(pidfile)
    assert escaped(pid)
    if devices_enforced():  # and from the same terminal, only the workspace's own GPU opens
        (open_dir / "opens.py").write_text(OPENS)
        out, nodes = open_dir / "opens.out", gpu_nodes(Path(tempfile.mkdtemp(dir=open_dir)))
        nodes.chmod(0o755)
        terminal_run(hub, "bea", token, f"/usr/bin/python3 {open_dir / 'opens.py'} {nodes} > {out}")
        own = {s["gpu"] for s in hub.allocations() if s["owner"] == "bea"}
        line = until(lambda: out.exists() and out.read_text().strip(), "bea's opens")
        assert line == f"own [{','.join(map(str, sorted(own)))}] opens: {' '.join(expected(own))}", line
    hub.stop_server("bea")
    assert not alive(pid), f"process {pid} of bea's workspace outlived it"
    assert not [s for s in hub.allocations() if s["owner"] == "bea"]


@pytest.mark.hub
@root_only
def test_the_hub_says_at_start_whether_there_are_cgroups(hub: Hub, make_hub) -> None:
    assert "containment: each job and workspace runs in a cgroup v" in hub.log_path.read_text()
    off = make_hub("c.Containment.mode = 'off'\n", env={"GPUPOOL_CULLER": "0"}).start()
    assert "containment: NO cgroups (turned off" in off.log_path.read_text()


def test_gpupool_ups_banner_says_whether_there_are_cgroups(tmp_path: Path) -> None:
    from traitlets.config import Config

    from gpupool.contain import detect, hub_key
    from gpupool.wiring.cli import banner, containment_note

    off = Config()
    off.Containment.mode = "off"
    assert "NO cgroups (turned off" in banner(
        8000, "p", "a", str(tmp_path), contained=containment_note(off, str(tmp_path))
    )
    note = containment_note(Config(), str(tmp_path))
    tree = detect("auto", hub_key(f"sqlite:///{tmp_path}/gpupool.sqlite"))
    assert ("cgroup of its own" in note) == tree.available, note
    if tree.available:
        tree.remove_root()
    forced = Config()  # c.Containment.devices reaches the banner's finding too
    forced.Containment.devices = "v2"
    program = detect("auto", hub_key(f"sqlite:///{tmp_path}/gpupool.sqlite"), devices="v2")
    said = containment_note(forced, str(tmp_path))
    assert ("by a cgroup v2 device program" in said) == program.controllers.enforced("devices"), said
    if program.available:
        program.remove_root()


# --- the limits beside the kill: devices and memory, from a real job and workspace ---------
OPENS = """
import errno, os, sys
own = os.environ.get("CUDA_VISIBLE_DEVICES", "")  # virtual GPUs go by index
os.environ["CUDA_VISIBLE_DEVICES"] = "0,1,2,3"  # a user widening what CUDA is told: no help
out = []
for minor in range(4):
    try:
        os.close(os.open(os.path.join(sys.argv[1], f"nvidia{minor}"), os.O_RDWR))
        out.append("opened")
    except OSError as err:
        out.append(errno.errorcode[err.errno])
print(f"own [{own}] opens:", " ".join(out), flush=True)
"""


def gpu_nodes(folder: Path) -> Path:
    """/dev/nvidia0..3 look-alikes (char 195:N): no GPU needed, the devices cgroup decides first
    (EPERM: refused; ENXIO: allowed, and no driver answered)."""
    for minor in range(4):
        os.mknod(folder / f"nvidia{minor}", 0o020666, os.makedev(195, minor))
        (folder / f"nvidia{minor}").chmod(0o666)
    return folder


def expected(own: set[int]) -> list[str]:
    return ["ENXIO" if m in own else "EPERM" for m in range(4)]


def devices_enforced() -> bool:
    from gpupool.contain import detect

    tree = detect("auto", f"probe{secrets.token_hex(3)}")
    ok = tree.controllers.enforced("devices")
    tree.remove_root()
    return ok


needs_devices = pytest.mark.skipif(
    os.geteuid() != 0 or not devices_enforced(), reason="needs root and the cgroup v1 devices hierarchy"
)


@pytest.mark.hub
@needs_devices
def test_a_job_opens_only_its_own_gpu_whatever_cuda_visible_devices_says(hub: Hub, open_dir: Path) -> None:
    token = hub.user_token("cid")
    script = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {OPENS!r}, {str(gpu_nodes(open_dir))!r}])"
    job = hub.api("POST", J, {"project": "lab", "gpus": 1, "name": "opens", "script": script}, token=token)
    done = hub.wait_job(job["id"], {"succeeded", "failed"}, token)
    log = Path(done["workdir"], "job.log").read_text()
    own = int(log.split("own [", 1)[1].split("]")[0])
    assert f"own [{own}] opens: {' '.join(expected({own}))}" in log, log


@pytest.mark.hub
@root_only
def test_a_jobs_memory_hog_is_killed_by_the_kernel_and_the_job_says_why(hub: Hub) -> None:
    token = hub.user_token("fay")
    job = hub.api(
        "POST",
        J,
        {"project": "lab", "gpus": 1, "name": "hog", "script": "b = b'x' * (900 << 20)\n"},
        token=token,
    )
    done = hub.wait_job(job["id"], {"succeeded", "failed"}, token)
    assert done["state"] == "failed", done
    assert "killed: over its 600 MiB memory limit" in done["message"], done
    assert "killed: over its 600 MiB memory limit" in Path(done["workdir"], "job.log").read_text()
    assert hub.api("GET", "/hub/api/info")  # the hub itself is untouched


def workspace_opens(hub: Hub, owner: str, name: str = "") -> list[str]:
    """What a new process of `owner`'s workspace (as a kernel's child or a terminal would be: in its
    cgroup, as nobody) gets opening /dev/nvidia0..3 look-alikes."""
    from gpupool.contain import WorkloadCgroups, detect, hub_key, joiner

    tree = detect("auto", hub_key(f"sqlite:///{hub.state}/gpupool.sqlite"))
    [instance] = tree.names()
    group = WorkloadCgroups(tree, instance).workspace(owner, name)
    assert tree.pids(group), f"{owner}'s workspace has no cgroup {group}"
    folder = Path(tempfile.mkdtemp(prefix="gpupool-devs-"))
    folder.chmod(0o755)
    fds = tree.join_fds(group)  # joins as it is: the workspace's rules, not new ones
    try:
        out = subprocess.run(
            ["/usr/bin/python3", "-c", OPENS, str(gpu_nodes(folder))],
            preexec_fn=joiner(fds),
            user=65534,
            group=65534,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        for fd in fds:
            os.close(fd)
        for f in folder.iterdir():
            f.unlink()
        folder.rmdir()
    return out.stdout.split("opens: ", 1)[1].split()


@pytest.mark.hub
@root_only
def test_a_workspace_server_over_its_profiles_memory_limit_is_killed_and_its_home_page_says_why(
    hub: Hub,
) -> None:
    from gpupool.contain import WorkloadCgroups, detect, hub_key
    from gpupool.widgets.summary import summary
    from tests.hubtools import PASSWORD, WebUser

    hub.spawn("gus", 0.25)
    tree = detect("auto", hub_key(f"sqlite:///{hub.state}/gpupool.sqlite"))
    [instance] = tree.names()
    group = WorkloadCgroups(tree, instance).workspace("gus", "")
    assert tree.memory_limit(group) == 500 << 20  # its profile's (0.25 GPU), not the default 600M
    token = hub.user_token("gus")
    hog = "/usr/bin/python3 -c 'b = bytearray(900 << 20)'"
    # a process over the limit (as a kernel would be): it dies, the server lives, and what
    # JupyterLab's status reads (api/me, then the server's summary) says why
    terminal_run(hub, "gus", token, hog)
    me = until(
        lambda: (
            (m := hub.api("GET", "/services/gpupool/api/me", token=token))["holdings"][0]["memory_killed"]
            and m
        ),
        "the kill in gus's api/me",
    )
    assert me["holdings"][0]["memory_killed"] == "killed: over its 500 MiB memory limit"
    assert summary(me, {}, None, "", 0.0)["memory_killed"] == "killed: over its 500 MiB memory limit"
    # the server is the terminal shell's parent: made the OOM killer's first choice (a user may
    # raise their own processes' score), then the shell's child goes over the limit
    terminal_run(hub, "gus", token, f"echo 1000 > /proc/$PPID/oom_score_adj; {hog}")
    until(lambda: not [s for s in hub.allocations() if s["owner"] == "gus"], "gus's server to end")
    user = WebUser(hub.url, "gus")
    user.log_in(PASSWORD)
    status, _, page = user.get("/hub/home")
    said = page.partition("gpupool-stops")[2][:600]
    assert status == 200 and "out of memory (over its 500 MiB memory limit). Start it" in said, said or page
    assert hub.api("GET", "/hub/api/info")  # the hub itself is untouched
