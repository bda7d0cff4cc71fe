"""Train jobs as local processes pinned to their GPUs.

Each run: the wrapper `runners/wrap.py` in the job's folder, which reads the command from a file only
the job's account may read (`.command`: no argument of it shows in `ps` through the wrapper) and
copies the command's output to the log, up to its size limit. Preemption is SIGTERM, a grace
period, then SIGKILL; resuming starts the same command with the same checkpoint folder.

With cgroups (gpupool.contain) each job runs in its own: signals reach every process it started,
whatever session it moved to, and a run has ended only once its cgroup is empty — what a run
left behind is killed before its GPUs go to the next job.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpupool.contain import Limits, WorkloadCgroups, joiner
from gpupool.host.accounts import Account, SystemAccounts
from gpupool.host.instance import HUB_VAR, INSTANCE_VAR
from gpupool.runners.safe_files import ensure_folder, folder, open_file, read_small

EXIT_FILE = ".exit_code"
COMMAND_FILE = ".command"  # {"command": [...], "log_limit": bytes}: read (and removed) by the wrapper
# run by path, not as a module: the job's account may run a Python that has no gpupool
# (the wrapper needs only the standard library)
# run by the job's account: from the users' environment in the system prefix when `gpupool up`
# made one (GPUPOOL_USER_PACKAGE, gpupool.host.system_env), never from a clone it cannot read
WRAPPER = os.path.join(
    os.environ.get("GPUPOOL_USER_PACKAGE") or str(Path(__file__).parent.parent), "runners", "wrap.py"
)
# what a job keeps of the hub's environment: the locale and where libraries are; never the hub's
# tokens, the proxy's secret or the demo password, nor its PATH (root's may name folders the job's
# account cannot search, and a missing command then reads "Permission denied")
KEEP_ENV = (
    "LANG",
    "LANGUAGE",
    "TZ",
    "TMPDIR",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
)
KEEP_PREFIXES = ("LC_", "NVIDIA_")
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def job_path(python: str) -> str:
    """The PATH of jobs: the folder of the Python jobs run with (their environment's tools), then
    the system's."""
    here = os.path.dirname(python) if os.path.isabs(python) else ""
    return ":".join(dict.fromkeys(p for p in (here, *SYSTEM_PATH.split(":")) if p))


def account_of(name: str, accounts: SystemAccounts | None = None) -> Account | None:
    """The Unix account of hub user `name` (made now where `accounts.create` says so), when the
    hub may switch to it (it runs as root)."""
    if os.geteuid() != 0:
        return None
    return (accounts or SystemAccounts()).ensure(name)


def give_to(path: Path, account: Account) -> None:
    """A folder the hub has just made belongs to its owner alone (0700): other users' jobs
    cannot read it. Only for fresh folders: once the owner can write in it, the hub never
    walks it again (a hard link planted there would hand the linked file over)."""
    for top, dirs, files in os.walk(path, followlinks=False):
        for name in [*dirs, *files]:
            os.chown(os.path.join(top, name), account.uid, account.gid, follow_symlinks=False)
    os.chown(path, account.uid, account.gid, follow_symlinks=False)
    path.chmod(0o700)


def owner_ids(account: Account | None) -> tuple[int, int]:
    """The uid/gid that owns a job's files: its account's, else the hub's own."""
    return (account.uid, account.gid) if account is not None else (os.geteuid(), os.getegid())


def job_base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k in KEEP_ENV or k.startswith(KEEP_PREFIXES)}


def read_exit(workdir: str, uid: int) -> tuple[int, str]:
    """How a run ended, from the wrapper's record: (code, reason)."""
    try:
        with folder(workdir, uid) as dir_fd:
            text = read_small(dir_fd, EXIT_FILE, uid).decode(errors="replace")
    except FileNotFoundError:
        return -signal.SIGKILL, ""  # killed before the wrapper could record anything
    except OSError as err:
        return -signal.SIGKILL, f"its exit record was not readable: {err}"
    first, _, reason = text.partition("\n")
    try:
        code = int(first.strip()[:8])
    except ValueError:
        return -signal.SIGKILL, "its exit record was not a number"
    return (code if -256 < code < 256 else -signal.SIGKILL), reason.strip()[:500]


def is_run(pid: int, workdir: str = "") -> bool:
    """Is `pid` alive and still the wrapper of this job's run (not a recycled pid)? The wrapper
    runs in the job's folder and never leaves it."""
    if not _alive(pid):
        return False
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc to ask: trust the pid
    if WRAPPER.encode() not in args:
        return False
    try:
        return not workdir or os.readlink(f"/proc/{pid}/cwd") == str(Path(workdir).resolve())
    except OSError:
        return False


class LocalRunner:
    def __init__(
        self,
        grace_s: float = 60.0,
        python: str = sys.executable,
        cgroups: WorkloadCgroups | None = None,
        log_limit: int = 0,
        path: str = "",
    ) -> None:
        self.grace_s, self.python, self.cgroups = grace_s, python, cgroups
        self.log_limit = log_limit  # bytes of a job's log (0: none); the wrapper cuts it with a note
        self.path = path or job_path(python)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.term_sent: dict[int, float] = {}
        self.workdirs: dict[int, str] = {}
        self.groups: dict[int, str] = {}  # pid of a run's wrapper -> its job's cgroup

    @property
    def contained(self) -> bool:
        return self.cgroups is not None and self.cgroups.available

    @property
    def contained_cgroups(self) -> WorkloadCgroups:
        """The cgroups, where `contained` was checked or a run's group exists (only they make one)."""
        assert self.cgroups is not None, "no cgroups: the runner is not contained"
        return self.cgroups

    @staticmethod
    def paths(workdir: str) -> dict[str, Path]:
        root = Path(workdir)
        return {
            "root": root,
            "log": root / "job.log",
            "exit": root / ".exit_code",
            "checkpoint": root / "checkpoint",
        }

    def start(
        self,
        job_id: str,
        command: list[str],
        workdir: str,
        env: dict[str, str],
        run: int,
        account: Account | None = None,
        limits: Limits | None = None,
    ) -> int:
        """Start a run; with `account`, as that Unix user (the job's owner), never as the hub; in
        its cgroup with `limits` (its GPUs' device nodes only; none: no GPU).

        Raises OSError (UnsafePath among them) with a plain reason when the run cannot start:
        the folder is not the job's any more, `checkpoint` is not a folder, the log is a link.
        Nothing in the folder is opened by path (see safe_files)."""
        uid, gid = owner_ids(account)
        p = self.paths(workdir)
        with folder(workdir, uid) as dir_fd:
            ensure_folder(dir_fd, "checkpoint", uid, gid)
            try:
                os.unlink(EXIT_FILE, dir_fd=dir_fd)  # unlink never follows a link
            except FileNotFoundError:
                pass
            spec = json.dumps({"command": command, "log_limit": self.log_limit}).encode()
            cmd_fd = open_file(dir_fd, COMMAND_FILE, os.O_WRONLY, uid, gid, create=True)
            try:
                os.ftruncate(cmd_fd, 0)
                os.write(cmd_fd, spec)
            finally:
                os.close(cmd_fd)
            log_fd = open_file(dir_fd, "job.log", os.O_WRONLY | os.O_APPEND, uid, gid, create=True)
        # a clean environment: the hub's secrets (its tokens, the proxy's) are not the job's
        full_env = {
            **job_base_env(),
            "PATH": self.path,
            **env,
            "GPUPOOL_JOB_ID": job_id,
            "GPUPOOL_JOB_RUN": str(run),
            "GPUPOOL_CHECKPOINT_DIR": str(p["checkpoint"]),
            "PYTHONUNBUFFERED": "1",
        }
        if self.cgroups is not None:  # what a restarted hub recognizes this instance's jobs by
            full_env.update({HUB_VAR: self.cgroups.hub_key, INSTANCE_VAR: self.cgroups.instance})
        as_user: dict[str, Any] = {}
        if account is not None:
            full_env.update(HOME=account.home, USER=account.name, LOGNAME=account.name)
            as_user = {"user": account.uid, "group": account.gid, "extra_groups": []}
        group = self.contained_cgroups.job(job_id) if self.contained else ""
        join_fds: list[int] = []
        try:
            if group:
                self.contained_cgroups.tree.end(group, 5.0)  # what an earlier run left (normally nothing)
                join_fds = self.contained_cgroups.tree.join_fds(group, limits or Limits())
            os.write(log_fd, f"--- gpupool: run {run} of job {job_id} starts ---\n".encode())
            proc = subprocess.Popen(
                [self.python, WRAPPER],
                cwd=p["root"],
                env=full_env,
                stdout=log_fd,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=joiner(join_fds),
                **as_user,
            )
        finally:
            os.close(log_fd)
            for fd in join_fds:
                os.close(fd)
        self.procs[proc.pid] = proc
        self.workdirs[proc.pid] = workdir
        if group:
            self.groups[proc.pid] = group
        return proc.pid

    def exit_code(
        self, pid: int, workdir: str, account: Account | None = None, job_id: str = ""
    ) -> int | None:
        """None while the run is alive; its exit code once it ended (negative: killed by signal)."""
        ended = self.ended(pid, workdir, account, job_id)
        return None if ended is None else ended[0]

    def ended(
        self, pid: int, workdir: str, account: Account | None = None, job_id: str = ""
    ) -> tuple[int, str] | None:
        """None while the run is alive; (exit code, reason) once it ended. The reason is the
        wrapper's plain words when the command could not start (e.g. the errno message). With a
        cgroup, a run whose wrapper exited has ended only once its cgroup is empty: what is left
        in it (a daemon it forked, a `setsid` child) is killed first."""
        proc = self.procs.get(pid)
        if proc is not None and proc.poll() is None:
            return None
        if proc is None and is_run(pid, workdir):
            return None  # a run adopted after a hub restart, still going
        group = self._group(pid, job_id)
        if group and not self.contained_cgroups.tree.kill(group):
            return None  # its last processes are dying: the next cycle settles it
        oom = ""
        if group:
            oom = self.memory_note(group)
            self.contained_cgroups.tree.remove(group)
        for table in (self.procs, self.term_sent, self.workdirs, self.groups):
            table.pop(pid, None)
        code, reason = read_exit(workdir, owner_ids(account)[0])
        if oom:  # the user reads why, in the log and the job's message
            self._log_line(workdir, account, f"--- gpupool: {oom} ---\n")
            reason = f"{oom}; {reason}" if reason else oom
        return code, reason

    def memory_note(self, group: str) -> str:
        """What the kernel's OOM killer did in the run's cgroup, in the user's words ("" nothing)."""
        return self.contained_cgroups.tree.memory_note(group)

    @staticmethod
    def _log_line(workdir: str, account: Account | None, line: str) -> None:
        uid, gid = owner_ids(account)
        try:
            with folder(workdir, uid) as dir_fd:
                fd = open_file(dir_fd, "job.log", os.O_WRONLY | os.O_APPEND, uid, gid)
                try:
                    os.write(fd, line.encode())
                finally:
                    os.close(fd)
        except OSError:
            pass  # the log is gone or not the job's any more: the job's message still says it

    def preempt(
        self, pid: int, now: float, workdir: str = "", sent: float | None = None, job_id: str = ""
    ) -> None:
        """SIGTERM now; `enforce` sends SIGKILL once the grace period is over. `sent`: when
        the first SIGTERM went out (persisted), so that a restarted hub keeps the deadline."""
        if pid not in self.term_sent:
            self.term_sent[pid] = sent if sent is not None else now
            self.workdirs.setdefault(pid, workdir)
            self._group(pid, job_id)
            self._signal(pid, signal.SIGTERM)

    def enforce(self, now: float) -> None:
        for pid, sent in list(self.term_sent.items()):
            if now - sent >= self.grace_s:
                self._signal(pid, signal.SIGKILL)

    def kill(self, pid: int, workdir: str = "", job_id: str = "") -> None:
        self.workdirs.setdefault(pid, workdir)
        self._group(pid, job_id)
        self._signal(pid, signal.SIGKILL)

    def clear(self, job_id: str) -> bool:
        """For a run whose wrapper is gone (or never began): kill what is left in its cgroup; True
        once nothing of it runs."""
        if not self.contained:
            return True
        group = self.contained_cgroups.job(job_id)
        if not self.contained_cgroups.tree.kill(group):
            return False
        self.contained_cgroups.tree.remove(group)
        return True

    def _group(self, pid: int, job_id: str) -> str:
        """The cgroup of the run `pid` of job `job_id` (remembered: a restarted hub learns it here)."""
        if pid not in self.groups and job_id and self.contained:
            self.groups[pid] = self.contained_cgroups.job(job_id)
        return self.groups.get(pid, "")

    def _signal(self, pid: int, sig: int) -> None:
        group = self.groups.get(pid, "")
        if group:  # every process of the job, whatever session it moved to
            if sig == signal.SIGKILL:
                self.contained_cgroups.tree.kill(group)
            else:
                self.contained_cgroups.tree.signal(group, sig)
        # a child not yet reaped keeps its pid; any other pid must still be this job's
        # wrapper, or a hub restarted long after would signal whoever has the pid now
        if pid in self.procs or is_run(pid, self.workdirs.get(pid, "")):
            _signal(pid, sig)


def find_run(workdir: str, proc_root: str = "/proc") -> int | None:
    """The wrapper of this job's run, if one is alive (started just before a hub crash,
    before its pid was written)."""
    for proc in Path(proc_root).iterdir():
        if proc.name.isdigit() and is_run(int(proc.name), workdir):
            return int(proc.name)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie of ours is not alive
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _signal(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the wrapper leads its own session: the whole job gets it
    except (ProcessLookupError, PermissionError):
        pass
