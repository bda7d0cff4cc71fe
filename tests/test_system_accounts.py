"""Users never run as root: a root hub (as `make up` runs on a fresh machine) gives each hub user
a Unix account of their own (jupyter-<name>) and runs their workspaces and jobs as it.

Real hub, real accounts made by useradd, real open() calls as another user's uid. Needs root,
useradd and a checkout other accounts can run; skipped with the reason elsewhere. The hub
users' names carry a random part, so the accounts cannot collide with real ones, and every
account the test made is removed (userdel) at the end.
"""

from __future__ import annotations

import errno
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gpupool.contain import hub_key
from gpupool.host.accounts import MARKER, AccountError, SystemAccounts, comment_for, unix_name
from gpupool.wiring.embedded import ACCOUNT_PREFIX, isolation
from tests.hubtools import ADMIN_TOKEN, REPO, Hub
from tests.support.wait import until

J = "/services/gpupool/api/jobs"


def _why_not() -> str:
    if os.geteuid() != 0:
        return "needs root (the hub switches accounts)"
    if not (shutil.which("useradd") and shutil.which("userdel")):
        return "needs useradd and userdel"
    return ""


WHY_NOT = _why_not()
real_accounts = pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)


JOB = """
import os, time
fd = os.open("alice-output.txt", os.O_WRONLY | os.O_CREAT, 0o644)  # readable by all: only the folder protects it
os.write(fd, b"alice's results")
os.close(fd)
print("alice's job log line", flush=True)
while not os.path.exists("go"):  # the test says when to end: no clock to race
    time.sleep(0.1)
"""


def key_of(hub: Hub) -> str:
    """The key a test hub writes in its accounts' comments (its database's)."""
    return hub_key(f"sqlite:///{hub.state}/gpupool.sqlite")


def uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])  # real uid
    raise AssertionError(f"no Uid in /proc/{pid}/status")


def pids_with(marker: str) -> list[int]:
    """Processes whose environment holds `marker` (KEY=VALUE)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker.encode() in (proc / "environ").read_bytes().split(b"\0"):
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def open_as(uid: int, gid: int, paths: list[Path]) -> dict[str, str]:
    """open() each path for reading in a process with this uid (no other groups): its errno name."""
    code = (
        "import errno, sys\n"
        "for p in sys.argv[1:]:\n"
        "    try:\n"
        "        open(p, 'rb').read(1); print('READ')\n"
        "    except OSError as e:\n"
        "        print(errno.errorcode[e.errno])\n"
    )
    out = subprocess.run(
        ["/usr/bin/env", "python3", "-c", code, *map(str, paths)],
        user=uid,
        group=gid,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
    )
    assert out.returncode == 0, out.stderr
    return dict(zip(map(str, paths), out.stdout.split(), strict=True))


@pytest.fixture
def hub(make_hub) -> Hub:
    """`make up`'s hub as root, with its own account names (jupyter-<name>): the test's users have
    names no real account has."""
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    h = make_hub(
        account_prefix=ACCOUNT_PREFIX,
        env={
            "GPUPOOL_CULLER": "0",
            # the demo passwords kept in files, as `make up` keeps them
            "GPUPOOL_DEMO_PASSWORD": "",
            "GPUPOOL_DEMO_ADMIN_PASSWORD": "",
            # secrets an admin hands JupyterHub in its environment
            "CONFIGPROXY_AUTH_TOKEN": secrets.token_hex(32),
            "JPY_COOKIE_SECRET": secrets.token_hex(32),
        },
    )
    return h.start()


def log_in(hub: Hub, user: str) -> None:
    """The hub's log-in form with the demo password, as a browser posts it."""
    import http.cookiejar
    import urllib.parse
    import urllib.request

    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    opener.open(f"{hub.url}/hub/login", timeout=30).read()
    xsrf = next(c.value for c in jar if c.name == "_xsrf")
    form = urllib.parse.urlencode(
        {"username": user, "password": (hub.state / "demo-password").read_text().strip(), "_xsrf": xsrf}
    ).encode()
    opener.open(f"{hub.url}/hub/login?next=/hub/home", data=form, timeout=60).read()
    assert any(c.name.startswith("jupyterhub-hub-login") for c in jar), "not logged in"


def secrets_of(hub: Hub) -> dict[str, str]:
    """What no workspace or job may see: the proxy's token and the cookie secret (in the hub's
    environment), the admin token, the demo passwords."""
    state = hub.state
    proxy_pid = int((state / "proxy.pid").read_text().strip())
    proxy_env = dict(
        item.split(b"=", 1)
        for item in Path(f"/proc/{proxy_pid}/environ").read_bytes().split(b"\0")
        if b"=" in item
    )
    found = {
        "proxy token": proxy_env[b"CONFIGPROXY_AUTH_TOKEN"].decode(),
        "admin token": ADMIN_TOKEN,
        "cookie secret": hub.env["JPY_COOKIE_SECRET"],
    }
    for name in ("demo-password", "demo-admin-password"):
        found[name] = (state / name).read_text().strip()
    assert found["proxy token"] == hub.env["CONFIGPROXY_AUTH_TOKEN"]
    assert all(len(v) >= 8 for v in found.values()), found
    return found


@pytest.mark.hub
@real_accounts
def test_workspaces_and_jobs_run_as_their_own_accounts_and_cannot_read_each_other(hub: Hub) -> None:
    tag = secrets.token_hex(3)
    alice, bob = f"alice{tag}", f"bob{tag}"
    accounts = SystemAccounts(prefix=ACCOUNT_PREFIX)
    for user in (alice, bob):
        assert accounts.lookup(user) is None  # a name no real account has

    log_in(hub, alice)  # the account is made at log-in, before any server
    a = pwd.getpwnam(f"jupyter-{alice}")
    hub.spawn(alice, 0.25)
    assert (
        a.pw_uid != 0
        and a.pw_gid != 0
        and a.pw_gecos == comment_for(alice, key_of(hub)) == f"{MARKER}{alice} hub {key_of(hub)}"
    )
    assert a.pw_dir == f"{hub.state}/home/jupyter-{alice}"
    home = os.stat(a.pw_dir)
    assert (home.st_uid, home.st_mode & 0o777) == (a.pw_uid, 0o700)
    [server] = [
        p
        for p in pids_with(f"GPUPOOL_WORKSPACE={alice}/")
        if "singleuser" in Path(f"/proc/{p}/cmdline").read_text(errors="replace")
    ]
    assert uid_of(server) == a.pw_uid  # not 0

    token = hub.user_token(alice)
    job = hub.api("POST", J, {"project": "default", "gpus": 1, "name": "secret", "script": JOB}, token=token)
    folder = next((hub.state / "jobs" / alice).glob(f"*-{job['id']}"))

    def written() -> bool:
        if (folder / "alice-output.txt").exists():
            return True
        now = hub.api("GET", f"{J}/{job['id']}", token=token)
        assert now["state"] in ("queued", "running"), (now["message"], hub.tail())
        return False

    until(written, "the job to write alice-output.txt", timeout=60, detail=hub.tail)
    job_pids = pids_with(f"GPUPOOL_JOB_ID={job['id']}")
    assert job_pids and {uid_of(p) for p in job_pids} == {a.pw_uid}

    hub.spawn(bob, 0.25)
    b = pwd.getpwnam(f"jupyter-{bob}")
    [bob_server] = [
        p
        for p in pids_with(f"GPUPOOL_WORKSPACE={bob}/")
        if "singleuser" in Path(f"/proc/{p}/cmdline").read_text(errors="replace")
    ]
    assert uid_of(bob_server) == b.pw_uid != a.pw_uid
    (Path(a.pw_dir) / "notes.txt").write_text("alice's notes")
    os.chown(Path(a.pw_dir) / "notes.txt", a.pw_uid, a.pw_gid)
    os.chmod(Path(a.pw_dir) / "notes.txt", 0o644)
    targets = [
        folder / "alice-output.txt",
        folder / "job.log",
        Path(a.pw_dir) / "notes.txt",
        hub.state / "jupyterhub.sqlite",
        hub.state / "gpupool.sqlite",
        hub.state / "demo-password",
        hub.state / "demo-admin-password",
        hub.state / "hub.log",
    ]
    assert all(t.exists() for t in targets)
    assert set(open_as(b.pw_uid, b.pw_gid, targets).values()) == {errno.errorcode[errno.EACCES]}
    # alice herself reads her own files (the refusals above are about who asks), her job's
    # output also through ~/gpupool-jobs, the link JupyterLab opens it by
    via_home = Path(a.pw_dir, "gpupool-jobs", folder.name, "alice-output.txt")
    assert Path(a.pw_dir, "gpupool-jobs").is_symlink()
    mine = [*targets[:3], via_home]
    assert open_as(a.pw_uid, a.pw_gid, mine) == {str(t): "READ" for t in mine}
    assert open_as(b.pw_uid, b.pw_gid, [via_home]) == {str(via_home): errno.errorcode[errno.EACCES]}

    # no hub secret in the environment of a workspace or a job
    hidden = secrets_of(hub)
    for pid in [server, *job_pids]:
        environ = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
        leaked = [name for name, value in hidden.items() if value in environ]
        assert leaked == [], f"process {pid} sees {leaked}"

    (folder / "go").write_text("")
    done = hub.wait_job(job["id"], {"succeeded", "failed"}, token)
    assert done["state"] == "succeeded", done


def server_uid(hub: Hub, user: str) -> int:
    [server] = [
        p
        for p in pids_with(f"GPUPOOL_WORKSPACE={user}/")
        if "singleuser" in Path(f"/proc/{p}/cmdline").read_text(errors="replace")
    ]
    return uid_of(server)


@pytest.mark.hub
@real_accounts
def test_a_hub_name_that_is_not_a_unix_name_gets_a_safe_account_and_no_one_takes_anothers(hub: Hub) -> None:
    tag = secrets.token_hex(3)
    odd = f"Eve.{tag}@Example.org"
    name = unix_name(odd, ACCOUNT_PREFIX)
    assert name.startswith("jupyter-eve-") and len(name) <= 32
    # a squatter registers first the hub name whose account is the name eve's would get
    squatter = name[len(ACCOUNT_PREFIX) :]
    hub.spawn(squatter, 0.25)
    assert pwd.getpwnam(name).pw_gecos == comment_for(squatter, key_of(hub))
    # eve is not locked out: the stored mapping gives her an account of her own, with another name
    hub.spawn(odd, 0.25)
    mine = SystemAccounts(
        prefix=ACCOUNT_PREFIX, create=True, home_root=f"{hub.state}/home", hub_key=key_of(hub)
    ).lookup(odd)
    assert (
        mine is not None
        and mine.name != name
        and mine.name.startswith("jupyter-eve-")
        and len(mine.name) <= 32
    )
    assert pwd.getpwnam(mine.name).pw_gecos == comment_for(odd, key_of(hub))
    assert server_uid(hub, odd) == mine.uid != pwd.getpwnam(name).pw_uid != 0
    assert server_uid(hub, squatter) == pwd.getpwnam(name).pw_uid
    # and after a restart each still gets their own (the mapping is stored, not recomputed)
    hub.stop_server(odd)
    hub.spawn(odd, 0.25)
    assert server_uid(hub, odd) == mine.uid


@real_accounts
def test_an_account_made_by_the_earlier_naming_keeps_working(tmp_path: Path) -> None:
    hub_name = f"Old.{secrets.token_hex(3)}@Example.org"
    name = unix_name(hub_name, ACCOUNT_PREFIX)  # the name the earlier code computed and made
    subprocess.run(
        # its home among this hub's homes: a comment without a hub key is this hub's only then
        [
            "useradd",
            "--no-create-home",
            "--home-dir",
            str(tmp_path / name),
            "--comment",
            comment_for(hub_name),
            "--",
            name,
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    try:
        accounts = SystemAccounts(prefix=ACCOUNT_PREFIX, create=True, home_root=str(tmp_path))
        assert accounts.ensure(hub_name).name == name
    finally:
        subprocess.run(["userdel", "--", name], capture_output=True, timeout=60)


@real_accounts
def test_two_hubs_on_one_machine_never_share_an_account(tmp_path: Path) -> None:
    """Hub B's alice never runs as hub A's jupyter-alice (with A's files): she gets an account of
    her own, as a user whose name was squatted does; each hub keeps finding its own."""
    alice = f"alice{secrets.token_hex(3)}"
    a = SystemAccounts(prefix=ACCOUNT_PREFIX, create=True, home_root=str(tmp_path / "a"), hub_key="aaaa1111")
    b = SystemAccounts(prefix=ACCOUNT_PREFIX, create=True, home_root=str(tmp_path / "b"), hub_key="bbbb2222")
    made: list[str] = []
    try:
        in_a = a.ensure(alice)
        made.append(in_a.name)
        assert in_a.name == f"jupyter-{alice}"
        assert b.lookup(alice) is None  # A's account is not B's
        in_b = b.ensure(alice)
        made.append(in_b.name)
        assert (
            in_b.name != in_a.name and in_b.uid != in_a.uid and in_b.name.startswith(f"jupyter-{alice}"[:23])
        )
        assert in_b.home == str(tmp_path / "b" / in_b.name)
        assert b.lookup(alice) == in_b and a.lookup(alice) == in_a  # each hub, its own, every time
        # a hub that makes no accounts does not take another hub's either
        assert SystemAccounts(prefix=ACCOUNT_PREFIX, hub_key="bbbb2222").lookup(alice) is None
    finally:
        for name in made:
            subprocess.run(["userdel", "--", name], capture_output=True, timeout=60)


@real_accounts
def test_making_accounts_is_bounded_per_minute(tmp_path: Path, monkeypatch) -> None:
    import collections

    import gpupool.host.accounts

    monkeypatch.setattr(gpupool.host.accounts, "_made", collections.deque())  # this test's minute only
    tmp_path.chmod(0o711)
    accounts = SystemAccounts(
        prefix=ACCOUNT_PREFIX, create=True, home_root=str(tmp_path), max_created_per_minute=2
    )
    names = [f"flood{secrets.token_hex(3)}" for _ in range(3)]
    try:
        accounts.ensure(names[0])
        accounts.ensure(names[1])
        with pytest.raises(AccountError, match="max_created_per_minute"):
            accounts.ensure(names[2])
        assert accounts.lookup(names[2]) is None
        assert accounts.ensure(names[0]) is not None  # an existing account is no new one
        over = SystemAccounts(prefix=ACCOUNT_PREFIX, create=True, home_root=str(tmp_path), max_accounts=1)
        with pytest.raises(AccountError, match="max_accounts"):
            over.ensure(names[2])
    finally:
        for n in names:
            subprocess.run(["userdel", "--remove", f"jupyter-{n}"], capture_output=True, timeout=60)


@pytest.mark.hub
@real_accounts
def test_jobs_have_a_path_of_their_own_and_no_argument_shows_to_other_users(hub: Hub) -> None:
    tag = secrets.token_hex(3)
    alice, bob = f"ann{tag}", f"bo{tag}"
    token = hub.user_token(alice)
    # a command that does not exist: said as such (127), not "Permission denied" (126) from a PATH
    # folder of root's that the job's account may not search
    bad = hub.api(
        "POST", J, {"project": "default", "gpus": 1, "command": ["no-such-command-xyz"]}, token=token
    )
    bad = hub.wait_job(bad["id"], {"failed", "succeeded"}, token)
    assert bad["exit_code"] == 127 and "No such file or directory" in bad["message"], bad
    # a notebook job whose parameter is a secret, and a script job
    secret = f"s3cr3t{tag}"
    job = hub.api(
        "POST",
        J,
        {
            "project": "default",
            "gpus": 1,
            "name": f"private{tag}",
            "parameters": {"key": secret},
            "code": "import os, time\nwhile not os.path.exists('go'): time.sleep(0.1)",
        },
        token=token,
    )
    running = hub.wait_job(job["id"], {"running"}, token)
    pids = until(lambda: pids_with(f"GPUPOOL_JOB_ID={job['id']}"), "the job's processes")
    environ = dict(
        v.split("=", 1) for v in Path(f"/proc/{pids[0]}/environ").read_text().split("\0") if "=" in v
    )
    assert "/root" not in environ["PATH"] and environ["PATH"].endswith("/usr/local/bin:/usr/bin:/bin")
    hub.spawn(bob, 0.25)  # bob's account exists; he lists every process, as `ps` does
    b = pwd.getpwnam(f"jupyter-{bob}")
    out = subprocess.run(
        ["ps", "-eww", "-o", "args"],
        user=b.pw_uid,
        group=b.pw_gid,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
    ).stdout
    assert "runners/wrap.py" in out  # bob sees that a job runs...
    assert secret not in out and f"private{tag}" not in out and running["workdir"] not in out  # ...not what
    Path(running["workdir"], "go").touch()
    assert hub.wait_job(job["id"], {"succeeded", "failed"}, token)["state"] == "succeeded"


def test_names_map_within_unix_limits_and_refuse_what_cannot_map() -> None:
    assert unix_name("alice", "jupyter-") == "jupyter-alice"
    assert unix_name("alice", "") == "alice"  # no prefix: LocalProcessSpawner's rule, the hub name
    long = unix_name("x" * 200, "jupyter-")
    assert len(long) <= 32 and long.startswith("jupyter-x")
    assert unix_name("A.b", "jupyter-") != unix_name("a-b", "jupyter-")  # normalized names keep a hash
    for bad in ("", "x" * 256):
        with pytest.raises(AccountError):
            unix_name(bad, "jupyter-")
    with pytest.raises(Exception, match="prefix"):
        SystemAccounts(prefix="Bad Prefix")


def test_root_is_never_an_account_for_a_user() -> None:
    with pytest.raises(AccountError, match="never run as root"):
        SystemAccounts(prefix="").lookup("root")


@real_accounts
def test_a_home_left_by_an_earlier_account_is_not_handed_to_a_new_one(tmp_path: Path) -> None:
    hub_name = f"gone{secrets.token_hex(3)}"
    accounts = SystemAccounts(prefix=ACCOUNT_PREFIX, create=True, home_root=str(tmp_path))
    (tmp_path / f"jupyter-{hub_name}").mkdir()  # an earlier jupyter-<name>'s files
    with pytest.raises(AccountError, match="already exists"):
        accounts.ensure(hub_name)
    assert accounts.lookup(hub_name) is None  # no account was made


def test_the_monitor_links_a_job_output_through_the_home_link(tmp_path: Path) -> None:
    from gpupool.widgets.jobs import output_link

    home, jobs = tmp_path / "home", tmp_path / "jobs" / "alice"
    (jobs / "train-1").mkdir(parents=True)
    home.mkdir()
    (home / "gpupool-jobs").symlink_to(jobs)
    env = {"HOME": str(home), "JUPYTERHUB_SERVICE_PREFIX": "/user/alice/"}
    link = output_link(str(jobs / "train-1" / "output.ipynb"), env)
    assert "href='/user/alice/lab/tree/gpupool-jobs/train-1/output.ipynb'" in link
    assert "href" not in output_link(str(tmp_path / "elsewhere" / "output.ipynb"), env)


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root hub makes accounts")
def test_up_as_root_gives_users_a_python_they_can_run(monkeypatch) -> None:
    """`gpupool up` as root on a machine whose Python lives in a private folder (pyenv under
    /root) must still isolate users: it makes a Python environment they can run, not fall back to
    running every workspace as root."""
    from gpupool.host.accounts import unreachable
    from gpupool.wiring.cli import users_python

    top = Path(tempfile.mkdtemp(prefix="gpupool-up-"))
    top.chmod(0o711)
    try:
        state = top / "state"
        state.mkdir()
        monkeypatch.delenv("GPUPOOL_USER_ENV", raising=False)
        folder = users_python(str(state))
        if not unreachable([sys.executable]):
            assert folder == ""  # the hub's own Python will do
            return
        minor = f"{sys.version_info.major}.{sys.version_info.minor}"
        if not os.path.exists(f"/usr/bin/python{minor}"):
            pytest.skip(f"no system Python {minor} here")
        assert folder, "gpupool up would run every workspace as root"
        monkeypatch.setenv("GPUPOOL_USER_ENV", folder)
        assert isolation(str(state), euid=0, spawner="") == ("accounts", "")
        out = subprocess.run(
            [f"{folder}/bin/python", "-c", "import gpupool, jupyterhub; print('ok')"],
            user=65534,
            group=65534,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
        )
        assert out.stdout.strip() == "ok", out.stderr  # as nobody
    finally:
        shutil.rmtree(top, ignore_errors=True)


@real_accounts
@pytest.mark.hub
def test_accounts_remove_takes_the_accounts_this_hub_made_and_no_others(hub: Hub, tmp_path: Path) -> None:
    """`make clean` (gpupool accounts --remove) removes the accounts the demo made, found by the
    comment gpupool writes and a home in the demo's state folder; another hub's are kept."""
    tag = secrets.token_hex(3)
    name, other = f"clean{tag}", f"keep{tag}"
    hub.spawn(name, 0.25)
    elsewhere = SystemAccounts(prefix=ACCOUNT_PREFIX, create=True, home_root=str(tmp_path / "home"))
    elsewhere.ensure(other)  # made by gpupool, for another hub's state folder
    try:

        def accounts(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, "-m", "gpupool.wiring.cli", "accounts", "--state", str(hub.state), *args],
                capture_output=True,
                text=True,
                timeout=120,
            )

        listed = accounts()
        assert f"jupyter-{name}\t" in listed.stdout and f"hub user {name}\t" in listed.stdout
        assert f"jupyter-{other}" not in listed.stdout
        busy = accounts("--remove")  # its server still runs: kept, with the reason
        assert busy.returncode == 1 and "still run (stop the hub first" in busy.stdout, busy.stdout
        pwd.getpwnam(f"jupyter-{name}")
        hub.stop()
        done = accounts("--remove")
        said = done.stdout.splitlines()
        assert done.returncode == 0 and said[0] == f"removed jupyter-{name}", done.stdout
        assert all(line.startswith("removed cgroup folder ") for line in said[1:]), (
            done.stdout
        )  # the hub's own
        with pytest.raises(KeyError):
            pwd.getpwnam(f"jupyter-{name}")
        assert not Path(hub.state, "home", f"jupyter-{name}").exists()
        assert pwd.getpwnam(f"jupyter-{other}").pw_gecos == comment_for(
            other, elsewhere.hub_key
        )  # not this hub's
        # `make clean` runs the same command on the default state (./state, or /var/lib/gpupool/<key>
        # for a root hub whose accounts cannot reach the clone: gpupool.host.system_env.default_state)
        assert "$(VENV)/bin/gpupool accounts --remove; fi" in (REPO / "Makefile").read_text()
    finally:
        subprocess.run(["userdel", "--remove", f"jupyter-{other}"], capture_output=True, timeout=60)
