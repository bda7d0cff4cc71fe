"""`gpupool accounts [--remove]`: the Unix accounts a root `gpupool up` made for its users, and
their removal (`make clean` runs it).

An account is gpupool's when its comment says so (`gpupool user <hub name>`, written by
gpupool.host.accounts when it made it) and its home lies in this hub's state folder (`state/home`):
accounts of other hubs on the machine, and every account gpupool did not make, are left alone.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpupool.host.accounts import MARKER, hub_user_of


@dataclass(frozen=True)
class MadeAccount:
    name: str
    uid: int
    home: str
    hub_user: str  # from the comment: the hub name, or "sha256 ..." for a name the comment cannot hold


def made_accounts(state: str) -> list[MadeAccount]:
    """The accounts gpupool made for the hub whose state folder is `state`."""
    homes = os.path.join(os.path.abspath(state), "home") + os.sep
    out = []
    for pw in pwd.getpwall():
        comment = pw.pw_gecos.split(",")[0]
        if comment.startswith(MARKER) and pw.pw_uid != 0 and pw.pw_dir.startswith(homes):
            out.append(MadeAccount(pw.pw_name, pw.pw_uid, pw.pw_dir, hub_user_of(comment)))
    return sorted(out, key=lambda a: a.name)


def processes_of(uid: int, proc: Path = Path("/proc")) -> list[int]:
    pids = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        uids = next((line.split()[1:] for line in status.splitlines() if line.startswith("Uid:")), [])
        if str(uid) in uids:
            pids.append(int(entry.name))
    return pids


def what_runs(pids: list[int], state: str, proc: Path = Path("/proc")) -> str:
    """What the processes are, for the message: the train jobs (by their folder), else programs."""
    jobs = os.path.join(os.path.abspath(state), "jobs") + os.sep
    found: dict[str, list[int]] = {}
    for pid in pids:
        try:
            cwd = os.readlink(proc / str(pid) / "cwd")
        except OSError:
            cwd = ""
        if cwd.startswith(jobs) and len(Path(cwd[len(jobs) :]).parts) >= 2:
            what = f"train job {Path(cwd[len(jobs) :]).parts[1]}"
        else:
            try:
                what = os.path.basename((proc / str(pid) / "cmdline").read_bytes().split(b"\0")[0].decode())
            except (OSError, UnicodeDecodeError):
                what = "?"
        found.setdefault(what or "?", []).append(pid)
    shown = [f"{w} (pids {', '.join(map(str, p[:5]))})" for w, p in sorted(found.items())[:8]]
    return "; ".join(shown) + (" ..." if len(found) > 8 else "")


def remove_accounts(state: str, kill: bool = False) -> tuple[list[str], list[str]]:
    """userdel --remove every account gpupool made for this hub. An account with processes still
    running (its hub is up) is kept, with the reason, unless `kill`: then they are killed first.
    Returns (removed names, problems)."""
    import signal

    removed, problems = [], []
    for account in made_accounts(state):
        running = processes_of(account.uid)
        if running and not kill:
            problems.append(
                f"{account.name}: {len(running)} of its processes still run (stop the hub first; train"
                " jobs keep running after a stop unless it was `gpupool up --stop-jobs`; `gpupool stop-jobs` ends them;"
                f" `gpupool accounts --remove --kill` ends them): {what_runs(running, state)}"
            )
            continue
        for pid in running:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        done = subprocess.run(
            ["userdel", "--remove", account.name], capture_output=True, text=True, timeout=60
        )
        # userdel says so when the home was already gone; the account is removed all the same
        if done.returncode not in (0, 12):
            problems.append(f"{account.name}: userdel failed: {(done.stderr or done.stdout).strip()[:200]}")
            continue
        removed.append(account.name)
    return removed, problems


def remove_cgroups(state: str) -> list[str]:
    """The hub's cgroup folders (gpupool.contain), when nothing runs in them: the hub made them, and
    they would outlive the state folder that names them. What still runs keeps its folder."""
    from gpupool.contain import detect, hub_key

    tree = detect("auto", hub_key(f"sqlite:///{os.path.abspath(state)}/gpupool.sqlite"))
    if not tree.available or not tree.root.is_dir():
        return []
    for inst in tree.names():
        tree.remove(inst)  # False (kept) while a workload in it has processes
    try:
        tree.root.rmdir()
    except OSError:
        return []
    return [f"cgroup folder {tree.root}"]


def main(state: str, remove: bool, kill: bool = False) -> int:
    """The `gpupool accounts` command."""
    accounts = made_accounts(state)
    if not remove:
        if not accounts:
            print(f"no accounts made by gpupool for the hub in {os.path.abspath(state)}")
        for a in accounts:
            print(f"{a.name}\tuid {a.uid}\thub user {a.hub_user}\thome {a.home}")
        return 0
    if accounts and os.geteuid() != 0:
        print("gpupool: removing accounts needs root (userdel)")
        return 1
    removed, problems = remove_accounts(state, kill)
    removed += remove_cgroups(state)
    for name in removed:
        print(f"removed {name}")
    for line in problems:
        print(f"gpupool: kept {line}")
    if not removed and not problems:
        print(f"no accounts made by gpupool for the hub in {os.path.abspath(state)}")
    return 1 if problems else 0
