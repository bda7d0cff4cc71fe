"""Train jobs as local processes pinned to their GPUs.

Each run: `python …/gpupool/runners/wrap.py` around the command, in the job's folder, with a
log file and GPUPOOL_CHECKPOINT_DIR that survives preemption. Preemption is SIGTERM, a grace
period, then SIGKILL; resuming starts the same command with the same checkpoint folder.
"""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# run by path, not `-m gpupool.…`: it is stdlib-only, so any interpreter the job uses (the system
# one, for a job that runs as its owner's account) can run it without gpupool installed
WRAPPER = str(Path(__file__).with_name("wrap.py"))


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int
    home: str


def account_of(name: str) -> Account | None:
    """The Unix account of a hub user, when the hub may switch to it (it runs as root)."""
    if os.geteuid() != 0:
        return None
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        return None
    return Account(pw.pw_name, pw.pw_uid, pw.pw_gid, pw.pw_dir)


def give_to(folder: Path, account: Account) -> None:
    """The job's folder belongs to its owner alone (0700): other users' jobs cannot read it."""
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, account.uid, account.gid, follow_symlinks=False)
    folder.chmod(0o700)


class LocalRunner:
    def __init__(self, grace_s: float = 60.0, python: str = sys.executable) -> None:
        self.grace_s, self.python = grace_s, python
        self.procs: dict[int, subprocess.Popen] = {}
        self.term_sent: dict[int, float] = {}

    @staticmethod
    def paths(workdir: str) -> dict[str, Path]:
        root = Path(workdir)
        return {"root": root, "log": root / "job.log", "exit": root / ".exit_code",
                "checkpoint": root / "checkpoint"}

    def start(self, job_id: str, command: list[str], workdir: str, env: dict[str, str], run: int,
              account: Account | None = None) -> int:
        """Start a run; with `account`, as that Unix user (the job's owner), never as the hub."""
        p = self.paths(workdir)
        p["checkpoint"].mkdir(parents=True, exist_ok=True)
        p["exit"].unlink(missing_ok=True)
        full_env = {**os.environ, **env, "GPUPOOL_JOB_ID": job_id, "GPUPOOL_JOB_RUN": str(run),
                    "GPUPOOL_CHECKPOINT_DIR": str(p["checkpoint"]), "PYTHONUNBUFFERED": "1"}
        as_user: dict = {}
        if account is not None:
            give_to(p["root"], account)
            full_env.update(HOME=account.home, USER=account.name, LOGNAME=account.name)
            as_user = {"user": account.uid, "group": account.gid, "extra_groups": []}
        with open(p["log"], "ab") as log:
            log.write(f"--- gpupool: run {run} of job {job_id} starts ---\n".encode())
            log.flush()
            proc = subprocess.Popen(
                [self.python, WRAPPER, str(p["exit"]), "--", *command],
                cwd=p["root"], env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                **as_user,
            )
        self.procs[proc.pid] = proc
        return proc.pid

    def exit_code(self, pid: int, workdir: str) -> int | None:
        """None while the run is alive; its exit code once it ended (negative: killed by signal)."""
        proc = self.procs.get(pid)
        if proc is not None and proc.poll() is None:
            return None
        if proc is None and _alive(pid):
            return None  # a run adopted after a hub restart, still going
        self.procs.pop(pid, None)
        self.term_sent.pop(pid, None)
        try:
            return int(self.paths(workdir)["exit"].read_text())
        except (OSError, ValueError):
            return -signal.SIGKILL  # killed before the wrapper could record anything

    def preempt(self, pid: int, now: float) -> None:
        """SIGTERM now; `enforce` sends SIGKILL once the grace period is over."""
        if pid not in self.term_sent:
            self.term_sent[pid] = now
            _signal(pid, signal.SIGTERM)

    def enforce(self, now: float) -> None:
        for pid, sent in list(self.term_sent.items()):
            if now - sent >= self.grace_s:
                _signal(pid, signal.SIGKILL)

    def kill(self, pid: int) -> None:
        _signal(pid, signal.SIGKILL)


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
