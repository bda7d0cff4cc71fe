"""The limits beside the kill (gpupool.contain.limits): which GPU device nodes a workload may open,
its memory, its processes, its CPU weight, each enforced by the kernel.

The device tests need no GPU: a character device of the NVIDIA major (195) made with mknod in a
temporary folder is refused by the devices cgroup with EPERM before any driver is asked, and an
allowed one reaches the (absent) driver: ENXIO. Real cgroups need root and cgroup v1's
hierarchies; skipped with the reason elsewhere. The same device test runs with the cgroup v2
device program (gpupool.contain.devfilter) where a cgroup2 hierarchy is mounted: a v2 host, or a
hybrid one like CI's, whose kernel runs the program of a process's cgroup2 cgroup too.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from traitlets import TraitError
from traitlets.config import Config

from gpupool.contain import Containment, LimitPolicy, Limits, detect, joiner
from gpupool.contain.limits import (
    NVIDIA_MAJOR,
    control_majors,
    device_rules,
    parse_size,
    size_text,
)

PYTHON = "/usr/bin/python3"  # every account may run it, unlike an interpreter under /root
OPEN = """
import errno, os, sys
os.environ["CUDA_VISIBLE_DEVICES"] = "0,1,2,3"  # what a user may set: no help to open a device
out = []
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDWR))
        out.append("opened")
    except OSError as err:
        out.append(errno.errorcode[err.errno])
print(" ".join(out))
"""


# --- pure -------------------------------------------------------------------------------
def test_device_rules_leave_exactly_the_workloads_gpus_and_the_control_devices_open() -> None:
    allow, deny = device_rules([3, 1])
    assert allow == ["c 195:1 rwm", "c 195:3 rwm"]
    denied = {int(r.split(":")[1].split()[0]) for r in deny}
    assert denied == set(range(254)) - {1, 3}  # 254 (modeset) and 255 (nvidiactl) stay open
    assert device_rules([])[0] == [] and len(device_rules([])[1]) == 254  # CPU-only: no GPU
    assert device_rules([255, 254])[0] == []  # control devices are no GPU of its own


def test_control_majors_come_from_proc_devices_character_section() -> None:
    text = "Character devices:\n  1 mem\n195 nvidia-frontend\n235 nvidia-uvm\n236 nvidia-caps\n\nBlock devices:\n235 nvidia-uvm\n"
    assert control_majors(text) == {"nvidia-uvm": 235, "nvidia-caps": 236}


def test_sizes_parse_with_bounds_and_read_back_in_words() -> None:
    assert parse_size("8G") == 8 << 30 and parse_size("512MiB") == 512 << 20 and parse_size("") == 0
    assert parse_size("25%", 16 << 30) == 4 << 30 and parse_size(1024) == 1024
    assert parse_size("25%", 0) == 0  # a machine without /proc/meminfo starts, with no limit
    for bad in ("-1G", "8X", "1" * 20, "0%", "101%", True, [1]):
        with pytest.raises(ValueError):
            parse_size(bad, 1 << 30)
    assert size_text(8 << 30) == "8 GiB" and size_text(1536 << 20) == "1.5 GiB"


def test_group_limits_replace_the_defaults_most_generous_wins() -> None:
    c = Config()
    c.Containment.memory_limit = "4G"
    c.Containment.group_limits = {
        "staff": {"memory_limit": "32G", "pids_limit": 0},
        "cs101": {"memory_limit": "2G"},
    }
    policy = Containment(config=c).policy(total_bytes=64 << 30)
    assert policy.limits([0]).memory_bytes == 4 << 30
    assert policy.limits([], ["cs101"]).memory_bytes == 2 << 30
    both = policy.limits([], ["cs101", "staff"])
    assert both.memory_bytes == 32 << 30 and both.pids_max == 0  # 0: no limit, the most generous
    assert policy.workloads_memory_bytes == 63 << 30  # the hub keeps its 1 GiB
    with pytest.raises(TraitError, match="group_limits"):
        c.Containment.group_limits = {"x": {"memory": "1G"}}
        Containment(config=c)
    with pytest.raises(TraitError, match="require"):
        Containment(require=["gpus"])


def test_one_rule_for_every_workload_profile_then_groups_then_default() -> None:
    from gpupool.contain.resolve import resolve

    default = {"memory_bytes": 4, "pids_max": 100, "cpu_shares": 1024}
    groups = {"staff": {"memory_bytes": 32, "pids_max": 0}, "cs101": {"memory_bytes": 2, "cpu_shares": 256}}
    profiles = {"1": {"memory_bytes": 16, "cpu_shares": 2048}}
    assert resolve(default, groups, profiles) == default  # nobody's groups, no profile
    # a train job (no profile): its owner's groups; a key a group does not set counts as the default
    assert resolve(default, groups, profiles, ["cs101"]) == {
        "memory_bytes": 2,
        "pids_max": 100,
        "cpu_shares": 256,
    }
    assert resolve(default, groups, profiles, ["cs101", "staff"]) == {
        "memory_bytes": 32,
        "pids_max": 0,  # 0, no limit: the most generous
        "cpu_shares": 1024,
    }
    # a workspace of the profile: the profile's keys first, the groups' for the rest
    assert resolve(default, groups, profiles, ["cs101"], "1") == {
        "memory_bytes": 16,
        "pids_max": 100,
        "cpu_shares": 2048,
    }
    assert resolve(default, groups, profiles, ["cs101"], "0.25") == resolve(
        default, groups, profiles, ["cs101"]
    )


def test_profile_limits_are_checked_and_a_size_is_one_profile_however_written() -> None:
    c = Config()
    c.Containment.memory_limit = "4G"
    c.Containment.profile_limits = {"0.50": {"memory_limit": "8G"}, "2": {"pids_limit": 9000}}
    c.Containment.group_limits = {"cs101": {"memory_limit": "1G", "cpu_shares": 256}}
    policy = Containment(config=c).policy(total_bytes=64 << 30)
    half = policy.limits([0], ["cs101"], "0.5")
    assert (half.memory_bytes, half.cpu_shares) == (8 << 30, 256)
    two = policy.limits([0, 1], ["cs101"], "2")
    assert (two.memory_bytes, two.pids_max) == (1 << 30, 9000)
    from gpupool.contain import WorkloadCgroups
    from gpupool.contain.cgroups import V1Freezer
    from gpupool.contain.limits import Controllers

    said = WorkloadCgroups(V1Freezer(Path("/x"), Controllers({}, {})), "i", policy=policy).describe_limits()
    assert said[1].endswith("; own values for group cs101, profile 0.5") and said[2].endswith("profile 2"), (
        said
    )
    for bad in ({"1": {"memory_limit": "lots"}}, {"1": {"pids_limit": -1}}, {"1": "8G"}, {"": {}}):
        with pytest.raises(TraitError, match="profile_limits"):
            Containment(profile_limits=bad)


# --- real cgroups -------------------------------------------------------------------------
def v1_tree(mode: str = "v1", devices: str = "auto"):
    if os.geteuid() != 0 or not os.access(PYTHON, os.X_OK):
        pytest.skip(f"only root makes cgroups; needs {PYTHON}")
    tree = detect(mode, f"test{secrets.token_hex(4)}", devices=devices)
    if not tree.available:
        pytest.skip(f"no cgroup {mode} here: {tree.reason}")
    return tree


def ended(t) -> None:
    for inst in t.names():
        for w in t.names(inst):
            t.end(f"{inst}/{w}", 5)
        t.remove(inst)
    t.remove_root()
    assert not any(root.exists() for root in t.controllers.roots.values())


@pytest.fixture
def tree():
    t = v1_tree()
    yield t
    ended(t)


# the devices limit three ways: the v1 controller; a cgroup v2 device program beside the v1
# freezer (a hybrid host without the v1 devices hierarchy); a cgroup v2 tree with its program
@pytest.fixture(
    params=[("v1", "v1"), ("v1", "v2"), ("v2", "auto")], ids=["v1", "v2-program-hybrid", "v2-tree"]
)
def device_tree(request):
    t = v1_tree(*request.param)
    if t.controllers.enforced("devices"):  # the way asked for, not another
        assert (t.controllers.device_program is not None) == (request.param != ("v1", "v1"))
    yield t
    ended(t)


@pytest.fixture
def nodes():
    """/dev/nvidia0..3 look-alikes (char 195:N), anyone may open them as far as the mode goes."""
    folder = Path(tempfile.mkdtemp(prefix="gpupool-devs-"))
    folder.chmod(0o755)
    paths = []
    for minor in range(4):
        path = folder / f"nvidia{minor}"
        os.mknod(path, 0o020666, os.makedev(NVIDIA_MAJOR, minor))
        path.chmod(0o666)
        paths.append(str(path))
    yield paths
    shutil.rmtree(folder, ignore_errors=True)


def run_in(tree, name: str, limits: Limits | None, args: list[str], **kw) -> subprocess.CompletedProcess:
    fds = tree.join_fds(name, limits)
    try:
        return subprocess.run(
            args,
            preexec_fn=joiner(fds),
            user=65534,
            group=65534,
            extra_groups=[],
            capture_output=True,
            text=True,
            **kw,
        )
    finally:
        for fd in fds:
            os.close(fd)


def test_a_workload_opens_only_its_own_gpus_and_a_move_is_make_before_break(device_tree, nodes) -> None:
    tree = device_tree
    if not tree.controllers.enforced("devices"):
        pytest.skip(tree.controllers.status()["devices"])
    opened = run_in(tree, "i/job-a", Limits(frozenset({1})), [PYTHON, "-c", OPEN, *nodes])
    # EPERM: the cgroup refused it; ENXIO: allowed, and the (absent) driver answered
    assert opened.stdout.split() == ["EPERM", "ENXIO", "EPERM", "EPERM"], opened.stderr
    # a moving workload: the destination opens first, the source closes after
    assert tree.set_gpus("i/job-a", [1, 2])
    during = run_in(tree, "i/job-a", None, [PYTHON, "-c", OPEN, *nodes])  # joins as it is
    assert during.stdout.split() == ["EPERM", "ENXIO", "ENXIO", "EPERM"], during.stderr
    tree.set_gpus("i/job-a", [2])
    after = run_in(tree, "i/job-a", None, [PYTHON, "-c", OPEN, *nodes])
    assert after.stdout.split() == ["EPERM", "EPERM", "ENXIO", "EPERM"], after.stderr
    cpu_only = run_in(tree, "i/ws-b", Limits(), [PYTHON, "-c", OPEN, *nodes])
    assert cpu_only.stdout.split() == ["EPERM"] * 4  # a CPU-only workspace: no GPU at all
    root_too = subprocess.run(  # root in the cgroup is refused as well (the check is the cgroup's)
        [PYTHON, "-c", OPEN, *nodes],
        preexec_fn=joiner(tree.join_fds("i/ws-b", Limits())),
        capture_output=True,
        text=True,
    )
    assert root_too.stdout.split() == ["EPERM"] * 4


def test_a_fork_storm_stops_at_the_workloads_process_limit(tree) -> None:
    if not tree.controllers.enforced("processes"):
        pytest.skip(tree.controllers.status()["processes"])
    storm = "import os\nn = 0\ntry:\n    while n < 500:\n        if os.fork() == 0:\n            os.closerange(0, 3); import time; time.sleep(60)\n        n += 1\nexcept OSError as e:\n    print(n, e.errno)\n"
    out = run_in(tree, "i/job-storm", Limits(pids_max=20), [PYTHON, "-c", storm], timeout=60)
    forked, err = out.stdout.split()
    assert int(forked) < 20 and int(err) == errno.EAGAIN, out
    assert len(tree.pids("i/job-storm")) <= 20
    assert tree.end("i/job-storm", 10)


def test_a_memory_hog_is_killed_by_the_kernel_and_counted(tree) -> None:
    if not tree.controllers.enforced("memory"):
        pytest.skip(tree.controllers.status()["memory"])
    hog = "b = b'x' * (256 << 20)\nprint('survived')"
    out = run_in(tree, "i/job-hog", Limits(memory_bytes=64 << 20), [PYTHON, "-c", hog], timeout=60)
    assert out.returncode == -9 and "survived" not in out.stdout
    assert tree.oom_kills("i/job-hog") == 1 and tree.memory_limit("i/job-hog") == 64 << 20
    fine = run_in(tree, "i/job-ok", Limits(memory_bytes=256 << 20), [PYTHON, "-c", "b = b'x' * (16 << 20)"])
    assert fine.returncode == 0 and tree.oom_kills("i/job-ok") == 0


def test_cpu_shares_and_the_workloads_reserve_are_written(tree) -> None:
    if not tree.controllers.enforced("cpu"):
        pytest.skip(tree.controllers.status()["cpu"])
    run_in(tree, "i/ws-c", Limits(cpu_shares=512), ["true"])
    assert (tree.controllers.roots["cpu"] / "i/ws-c/cpu.shares").read_text().strip() == "512"
    tree.controllers.reserve(256, 0)
    assert (tree.controllers.roots["cpu"] / "cpu.shares").read_text().strip() == "256"


def test_each_limit_is_said_enforced_or_why_not() -> None:
    from gpupool.contain import WorkloadCgroups

    off = WorkloadCgroups(detect("off", "x"), "i", policy=LimitPolicy(memory_bytes=8 << 30))
    lines = off.describe_limits()
    assert [line.split(":")[0] for line in lines] == ["devices", "memory", "processes", "cpu"]
    assert all("NOT enforced: no cgroups: turned off" in line for line in lines), lines
    assert off.missing(["devices", "cgroups"]).keys() == {"devices", "cgroups"}
    v2 = detect("v2", "x", mountinfo="", proc_cgroup="")
    assert not v2.available


def test_a_required_limit_this_machine_cannot_apply_stops_the_hub_with_why(tmp_path: Path) -> None:
    from gpupool.wiring.root import GPUPoolHub

    c = Config()
    c.GPUPool.db_url = f"sqlite:///{tmp_path}/gpupool.sqlite"
    c.Containment.mode = "off"  # as a machine without cgroups
    c.Containment.require = ["cgroups", "devices"]
    with pytest.raises(SystemExit, match=r"require.*cgroups: turned off.*devices: no cgroups: turned off"):
        GPUPoolHub(c).refuse_lost_state()
    c.Containment.require = []
    GPUPoolHub(c).refuse_lost_state()  # without the requirement it starts, and says so (banner test)


def test_the_hub_applies_devices_the_way_its_config_asks(tmp_path: Path) -> None:
    """c.Containment.devices reaches the hub's own cgroups: forced to a cgroup v2 device program on
    a host whose v1 devices hierarchy would be chosen otherwise, `require` is met by it."""
    from gpupool.wiring.root import GPUPoolHub

    v1_tree().remove_root()  # root and cgroup v1 here, else skipped
    c = Config()
    c.GPUPool.db_url = f"sqlite:///{tmp_path}/gpupool.sqlite"
    c.Containment.mode, c.Containment.devices, c.Containment.require = "v1", "v2", ["devices"]
    hub = GPUPoolHub(c)
    try:
        hub.refuse_lost_state()
        controllers = hub.cgroups.tree.controllers
        assert controllers.device_program is not None and controllers.enforced("devices")
        assert controllers.roots["devices"].parent.name != "devices"  # a cgroup2 folder, not v1's
    finally:
        ended(hub.cgroups.tree)
        hub.close()


def test_a_job_over_its_owners_group_memory_limit_is_killed_by_the_kernel_and_says_so(
    tree, tmp_path: Path
) -> None:
    """The train engine with real processes: ann's group gives her jobs 96 MiB, bob has the default."""
    import sys

    from gpupool.contain import WorkloadCgroups
    from gpupool.train.service import TrainingService
    from tests.support.jobs import job_request
    from tests.support.pools import make_pool, run_until, train_config

    if not tree.controllers.enforced("memory"):
        pytest.skip(tree.controllers.status()["memory"])
    c = train_config(tmp_path, projects={"lab": {"guarantee": 2}}, tick_s=0.1)
    c.Containment.memory_limit = "1G"
    c.Containment.group_limits = {"small": {"memory_limit": "96M"}}
    cgroups = WorkloadCgroups(tree, "i", policy=Containment(config=c).policy())
    from gpupool.train.config import TrainPool

    svc = TrainingService(
        make_pool(tmp_path, 2),
        TrainPool(config=c),
        cgroups=cgroups,
        groups_of=lambda owner: ("small",) if owner == "ann" else (),
    )
    hog = {"hog.py": b"b = bytearray(300 << 20)\nprint('survived', flush=True)\n"}
    jobs = {
        who: svc.submit(
            job_request(owner=who, project="lab", name="hog", command=[sys.executable, "hog.py"], files=hog)
        ).id
        for who in ("ann", "bob")
    }
    run_until(svc, lambda: all(svc.job(j).state in ("succeeded", "failed") for j in jobs.values()))
    ann, bob = svc.job(jobs["ann"]), svc.job(jobs["bob"])
    assert ann.state == "failed" and "killed: over its 96 MiB memory limit" in ann.message, ann.to_json()
    assert "survived" not in Path(ann.workdir, "job.log").read_text()
    assert bob.state == "succeeded", bob.to_json()  # the same job within the default 1 GiB


def test_a_workspace_server_killed_over_its_memory_limit_is_told_on_the_home_page(
    tree, tmp_path: Path
) -> None:
    """The server's own process over its limit: the kernel kills it; the hub reads the cgroup's
    count before removing it, and the owner's home page says why the server stopped."""
    from types import SimpleNamespace

    from gpupool.api.auth import Directory
    from gpupool.api.services import ApiServices
    from gpupool.api.warnings import stops_for
    from gpupool.spawner.local import record_oom_stop
    from gpupool.store import Store

    if not tree.controllers.enforced("memory"):
        pytest.skip(tree.controllers.status()["memory"])
    hog = "b = bytearray(300 << 20)\nprint('survived')"
    out = run_in(tree, "i/ws-oom", Limits(memory_bytes=64 << 20), [PYTHON, "-c", hog], timeout=60)
    assert out.returncode == -9 and "survived" not in out.stdout
    quiet = run_in(tree, "i/ws-quiet", Limits(memory_bytes=64 << 20), [PYTHON, "-c", "pass"])
    assert quiet.returncode == 0
    store = Store(f"sqlite:///{tmp_path}/pool.sqlite")
    for name, group in (("big", "i/ws-oom"), ("small", "i/ws-quiet")):
        record_oom_stop(store, "ada", name, tree.oom_kills(group), tree.memory_limit(group))
    root = SimpleNamespace(
        api_services=ApiServices(SimpleNamespace(store=store), Directory()), pool=SimpleNamespace(store=store)
    )
    said = {s["name"]: s["message"] for s in stops_for(root, SimpleNamespace(name="ada"))}
    assert said.keys() == {"big"}, said  # a server that ended within its limit: nothing to say
    assert said["big"].startswith("stopped at ") and said["big"].endswith(
        ": out of memory (over its 64 MiB memory limit)"
    ), said


def test_a_cgroup_v2_host_is_told_what_is_enforced_there_and_what_not(tmp_path: Path) -> None:
    """A fake cgroup v2 tree (a folder): the kill is gpupool's there, the four limits are not, and
    the start's lines (log and banner) and `require` say so per limit, writing no limit file."""
    from gpupool.contain import WorkloadCgroups
    from gpupool.contain.cgroups import V2

    cgroups = WorkloadCgroups(V2(tmp_path), "i", policy=LimitPolicy(memory_bytes=8 << 30, pids_max=64))
    assert cgroups.describe().startswith("each job and workspace runs in a cgroup v2 cgroup of its own")
    said = dict(line.split(": ", 1) for line in cgroups.describe_limits())
    assert said.keys() == {"devices", "memory", "processes", "cpu"}
    assert said["devices"].startswith("NOT enforced: cgroup v2 needs a device eBPF program"), said
    for limit in ("memory", "processes", "cpu"):
        assert said[limit].startswith("NOT enforced: gpupool sets ") and "cgroup v1 only" in said[limit], said
    assert cgroups.missing(["cgroups", "memory", "processes"]).keys() == {"memory", "processes"}
    (tmp_path / "i/ws-a").mkdir(parents=True)
    (tmp_path / "i/ws-a/cgroup.procs").touch()  # what the kernel makes with the folder
    for fd in cgroups.tree.join_fds("i/ws-a", cgroups.limits([0], profile="1")):
        os.close(fd)
    assert sorted(p.name for p in (tmp_path / "i/ws-a").iterdir()) == ["cgroup.procs"]  # no limit pretended


SPIN = "import time\nend = time.time() + {s}\nwhile time.time() < end: pass"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_a_workspace_beside_many_busy_train_jobs_keeps_half_the_cpu(tree) -> None:
    """Six CPU-bound train jobs and one workspace on one CPU: the jobs together weigh as one
    workspace (c.Containment.jobs_cpu_shares), so the workspace gets about half the CPU; as
    siblings of equal weight it would get a seventh (the sweep flood of benchmarks.neighbours)."""
    if not tree.controllers.enforced("cpu"):
        pytest.skip(tree.controllers.status()["cpu"])
    tree.controllers.reserve(0, 0, 1024)
    seconds, cpu = 3, min(os.sched_getaffinity(0))
    procs = {}
    for name in [f"i/job-{n}" for n in range(6)] + ["i/ws-w"]:
        fds = tree.join_fds(name, Limits(cpu_shares=1024))
        try:
            procs[name] = subprocess.Popen(
                ["taskset", "-c", str(cpu), PYTHON, "-c", SPIN.format(s=seconds)],
                preexec_fn=joiner(fds),
                user=65534,
                group=65534,
                extra_groups=[],
            )
        finally:
            for fd in fds:
                os.close(fd)
    time.sleep(seconds - 0.5)  # the kernel's scheduler at work: real CPU time, not travelled
    used = {name: cpu_seconds(proc.pid) for name, proc in procs.items()}  # while all still spin
    for proc in procs.values():
        proc.wait(30)
    total = sum(used.values())
    share = used["i/ws-w"] / total
    assert share > 0.35, f"the workspace got {share:.0%} of the CPU beside six jobs ({used})"
    assert (tree.controllers.roots["cpu"] / "i/jobs/job-0").is_dir()  # the jobs' own folder


def test_without_a_v1_devices_hierarchy_the_devices_limit_is_a_cgroup_v2_program(tmp_path: Path) -> None:
    """Chosen on its own where the host has cgroup2 and no v1 devices hierarchy (folders stand in
    for the mounts); forced either way by c.Containment.devices; said at start."""
    from gpupool.contain import WorkloadCgroups, devfilter
    from gpupool.contain.cgroups import V2
    from gpupool.contain.limits import find_controllers

    program, why = devfilter.helper()
    if program is None:
        pytest.skip(why)
    mounts = [
        (str(tmp_path / "unified"), "cgroup2", {"rw"}),
        (str(tmp_path / "mem"), "cgroup", {"rw", "memory"}),
    ]
    auto = find_controllers(mounts, {"": "/hub.service"}, "gpupool-k")
    assert auto.enforced("devices") and auto.device_program == program
    assert auto.roots["devices"] == tmp_path / "unified/hub.service/gpupool-k"
    v1 = find_controllers(mounts, {}, "gpupool-k", devices="v1")
    assert v1.status()["devices"] == "no cgroup v1 devices hierarchy is mounted" and v1.device_program is None
    nothing = find_controllers([], {}, "gpupool-k")
    assert nothing.status()["devices"].endswith("no cgroup2 file system is mounted for a device program")
    said = dict(
        line.split(": ", 1) for line in WorkloadCgroups(V2.with_devices(tmp_path), "i").describe_limits()
    )
    assert said["devices"].startswith("enforced: only its own GPUs' device nodes"), said
    assert said["devices"].endswith("by a cgroup v2 device program") and said["memory"].startswith(
        "NOT enforced"
    )
    assert devfilter.rules(["c 195:0 rwm"]) == "allow a *:* rwm\ndeny c 195:0 rwm\n"


def test_root_runs_no_device_helper_another_user_could_swap(tmp_path: Path, monkeypatch) -> None:
    """The hub runs the helper as root from the cache folder: a helper there that is a link, or in
    a folder others may write (a shared XDG_CACHE_HOME, a group-writable umask), is refused."""
    from gpupool.contain import devfilter

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = tmp_path / "gpupool" / "devfilter-k"
    folder.mkdir(parents=True, mode=0o755)
    (tmp_path / "gpupool").chmod(0o755)
    program = folder / devfilter.NAME
    program.write_bytes(b"#!/bin/sh\n")
    program.chmod(0o755)
    assert devfilter.untrusted(program) == ""
    folder.chmod(0o775)
    assert "writable by others" in devfilter.untrusted(program)
    folder.chmod(0o755)
    program.unlink()
    program.symlink_to(tmp_path / "elsewhere")
    assert "a link" in devfilter.untrusted(program)


def test_the_hubs_processes_weigh_their_configured_share_beside_all_workloads(tree) -> None:
    """c.Containment.hub_cpu_shares: a stand-in hub (one CPU-bound process) moved into its own cpu
    cgroup beside six busy train jobs on one CPU gets hub / (hub + workloads) of what the two use,
    16384 / (16384 + 256) here; left where it started (one process of 1024 against the workloads'
    256) it gets 80 %, however busy the rest of the machine is. A process started from inside the
    hub's folder still puts the workloads beside it, not below (a restarted hub's children)."""
    from gpupool.contain.limits import outside_hub

    if not tree.controllers.enforced("cpu"):
        pytest.skip(tree.controllers.status()["cpu"])
    tree.controllers.reserve(256, 0, 1024)  # the default weight of all workloads together
    cpu = min(os.sched_getaffinity(0))
    spin = ["taskset", "-c", str(cpu), "/bin/sh", "-c", "while :; do :; done"]  # starts at once, spins
    hub = subprocess.Popen(spin)
    procs = [hub]
    try:
        folder = tree.controllers.hold_hub(16384, [hub.pid])
        assert folder is not None and folder.name == tree.controllers.roots["cpu"].name + ".hub"
        assert (folder / "cpu.shares").read_text().strip() == "16384"
        own = next(
            line for line in Path(f"/proc/{hub.pid}/cgroup").read_text().splitlines() if ":cpu:" in line
        )
        path = own.split(":", 2)[2]
        assert Path(path).name == folder.name and outside_hub(path) == str(Path(path).parent)
        for n in range(6):
            fds = tree.join_fds(f"i/job-{n}", Limits(cpu_shares=1024))
            try:
                procs.append(
                    subprocess.Popen(spin, preexec_fn=joiner(fds), user=65534, group=65534, extra_groups=[])
                )
            finally:
                for fd in fds:
                    os.close(fd)
        # the kernel's scheduler at work: real CPU time, not travelled (each spins once exec'd)
        before = [cpu_seconds(p.pid) for p in procs]
        time.sleep(3)
        used = [cpu_seconds(p.pid) - b for p, b in zip(procs, before, strict=True)]
    finally:
        for p in procs:
            p.kill()
            p.wait(30)
    share = used[0] / sum(used)
    assert share > 0.9, f"the hub got {share:.0%} of the CPU beside six jobs ({used})"
    assert tree.controllers.hold_hub(0, [os.getpid()]) is None  # 0: the hub stays where it is
