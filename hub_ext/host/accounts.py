"""Hub users as unprivileged Unix accounts (TLJH's convention: hub user `alice` runs as `jupyter-alice`).

When the hub runs as root, a workspace or a train job must never run as root: each hub user
gets an account of their own, made with `useradd` the first time it is needed (JupyterHub's
`LocalAuthenticator.create_system_users` habit), with a home only it can read (0700).

Which account is whose is stored, not derived: the account's comment field names the hub user it
was made for and the hub that made it (`gpupool user <hub name> hub <hub key>`, the key naming the
hub's database, as its cgroups do), and a hub user's account is the one whose comment names them
and this hub, whatever its name: two hubs on one machine never share an account (another hub's
`jupyter-alice` is to this hub's alice what a squatted name is). A name is chosen only when the account is made: `prefix + hub name` when
that is a valid, free Unix name; for other hub names (`alice.smith@uni.edu`, 60 characters,
capitals) a normalized name with a hash of the hub name; and when the chosen name is already
taken — by an earlier account, or by another user who registered a hub name that maps onto it
first — a name with a random part. No one can claim another user's account by predicting its
name: they get the name, the other user gets another account, and nobody is locked out. Accounts
made before this rule (the name computed, the comment theirs) keep working; one whose comment has
no hub key is this hub's only when its home lies in this hub's `home_root`.

Making accounts is bounded: at most `max_created_per_minute` in any minute and `max_accounts` in
all, so log-ins cannot fill the password file.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import secrets
import stat
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traitlets import Bool, Int, TraitError, Unicode, default, validate
from traitlets.config import Configurable

if TYPE_CHECKING:
    from jupyterhub.auth import Authenticator

UNIX_NAME = re.compile(r"[a-z_][a-z0-9_-]*\Z")
MAX_UNIX_NAME = 32  # useradd's limit on Linux
MAX_HUB_NAME = 255  # the longest hub name gpupool maps (JupyterHub's own column is 255)
MARKER = "gpupool user "  # the comment (GECOS) of an account gpupool made; no ':' or ',' allowed there
HUB_MARK = " hub "  # then the key of the hub that made it
_lock = threading.Lock()  # two spawns of one user must not both run useradd
_made: deque[float] = deque()  # when this hub process made accounts (the per-minute bound)


class AccountError(Exception):
    """A hub user that cannot have (or use) a Unix account; the message says why, in plain words."""


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int
    home: str


class SystemAccounts(Configurable):
    """Which Unix account a hub user's workspaces and train jobs run as."""

    prefix = Unicode(
        "",
        config=True,
        help="""Put before a hub user's name to make the Unix account name.
        Empty: the hub name is the account name (JupyterHub's LocalProcessSpawner rule, e.g. with
        PAM log-in). `gpupool up` run as root uses TLJH's convention, "jupyter-". Example::

            c.SystemAccounts.prefix = "jupyter-"
        """,
    )
    create = Bool(
        False,
        config=True,
        help="""Create a missing account with useradd the first time its
        hub user spawns a workspace or submits a job (the hub must run as root). The account gets no
        password, no login shell and a home only it can read (0700). Example::

            c.SystemAccounts.create = True
        """,
    )
    home_root = Unicode(
        "",
        config=True,
        help="""Folder for the homes of created accounts (each gets
        <home_root>/<account name>); empty: useradd's default (/home). Other accounts must be able to
        pass through it (mode 0711 or 0755). Example::

            c.SystemAccounts.home_root = "/srv/gpupool/home"
        """,
    )
    shell = Unicode(
        "/usr/sbin/nologin",
        config=True,
        help="""Login shell of created accounts (they
        never log in; workspaces start their own programs). Example::

            c.SystemAccounts.shell = "/bin/bash"
        """,
    )
    max_created_per_minute = Int(
        60,
        min=1,
        config=True,
        help="""Accounts the hub may make in any 60
        seconds; a log-in, spawn or job past it gets no account yet and is told to try again in a
        minute. Bounds what a flood of log-ins (with an authenticator that admits any name) can do;
        the default lets a class of 60 log in on its first morning at once. Example::

            c.SystemAccounts.max_created_per_minute = 120
        """,
    )
    max_accounts = Int(
        1000,
        min=0,
        config=True,
        help="""Accounts gpupool may have made in all (those
        whose comment says `gpupool user ...`); past it no new hub user gets one until an admin
        removes some (`userdel`). Example::

            c.SystemAccounts.max_accounts = 5000
        """,
    )

    hub_key = Unicode(
        "",
        config=True,
        help="""Names this hub in the comment of each account it makes, so that
        another hub on the machine never uses it. Default: the hub's key, a hash of
        c.GPUPool.db_url (what names its cgroups); set it only to keep the accounts of a hub whose
        database moved. Example::

            c.SystemAccounts.hub_key = "3fa2c1d4e5f6"
        """,
    )

    @default("hub_key")
    def _hub_key(self) -> str:
        from gpupool.contain import hub_key
        from gpupool.settings.config import GPUPool

        return hub_key(GPUPool(config=self.config).db_url)

    @validate("hub_key")
    def _check_hub_key(self, proposal: dict[str, Any]) -> str:
        value = proposal["value"]
        if not re.fullmatch(r"[A-Za-z0-9]{1,64}", value):
            raise TraitError(f"SystemAccounts.hub_key must be 1 to 64 letters or digits, not {value[:40]!r}")
        return value

    def comment(self, hub_name: str) -> str:
        """What this hub writes in the comment of `hub_name`'s account."""
        return comment_for(hub_name, self.hub_key)

    def belongs(self, pw: pwd.struct_passwd, hub_name: str) -> bool:
        """Is `pw` the account this hub made for `hub_name`? Its comment names both; an account
        made before comments named the hub, only with its home in this hub's homes."""
        comment = pw.pw_gecos.split(",")[0]
        if comment == self.comment(hub_name):
            return True
        return comment == comment_for(hub_name) and self._ours(pw)

    @validate("prefix")
    def _check_prefix(self, proposal: dict[str, Any]) -> str:
        value = proposal["value"]
        if value and (not UNIX_NAME.match(value) or len(value) > 16):
            raise TraitError(
                f"SystemAccounts.prefix must be empty or a Unix name start of at most 16"
                f" characters ([a-z_][a-z0-9_-]*), not {value[:40]!r}"
            )
        return value

    def name_for(self, hub_name: str) -> str:
        return unix_name(hub_name, self.prefix)

    def lookup(self, hub_name: str) -> Account | None:
        """The account of `hub_name` if it exists and may be used; None when there is none: the
        account whose comment names this hub user (the stored mapping), else — an account gpupool
        did not make (an admin's, a PAM user's) — the one of the computed name."""
        name = self.name_for(hub_name)
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            pw = None
        if pw is not None and (self.belongs(pw, hub_name) or not pw.pw_gecos.startswith(MARKER)):
            return self._checked(pw, hub_name)
        if not self.create:  # accounts an admin made: by name only (LocalProcessSpawner's rule)
            return None
        found = next((p for p in pwd.getpwall() if self.belongs(p, hub_name) and self._ours(p)), None)
        return self._checked(found, hub_name) if found is not None else None

    def _ours(self, pw: pwd.struct_passwd) -> bool:
        """An account this hub's settings would have made (its prefix, its home root): another hub on
        the machine may map the same hub name to an account of its own."""
        root = self.home_root.rstrip("/")
        return pw.pw_name.startswith(self.prefix) and (not root or pw.pw_dir.startswith(root + "/"))

    def ensure(self, hub_name: str) -> Account | None:
        """The account, made now if `create` is on and it is missing; None when there is none.
        Blocking (useradd): call it off the event loop."""
        with _lock:
            found = self.lookup(hub_name)
            if found is not None or not self.create:
                return found
            if os.geteuid() != 0:
                raise AccountError("the hub must run as root to create Unix accounts (SystemAccounts.create)")
            self._may_create()
            self._useradd(hub_name)
            _made.append(time.monotonic())
            found = self.lookup(hub_name)
        if found is None:
            raise AccountError(f"useradd did not create an account for hub user {hub_name[:64]!r}")
        return found

    def _may_create(self) -> None:
        """The bounds on making accounts: per minute, and in all."""
        now = time.monotonic()
        while _made and _made[0] <= now - 60:
            _made.popleft()
        if len(_made) >= self.max_created_per_minute:
            raise AccountError(
                f"the hub has made {len(_made)} accounts in the last minute, at most"
                f" {self.max_created_per_minute} (c.SystemAccounts.max_created_per_minute):"
                " try again in a minute"
            )
        made = sum(1 for p in pwd.getpwall() if p.pw_gecos.startswith(MARKER))
        if made >= self.max_accounts:
            raise AccountError(
                f"this machine has {made} accounts made by gpupool, at most {self.max_accounts}"
                " (c.SystemAccounts.max_accounts): an admin must remove some first"
            )

    def free_name(self, hub_name: str) -> str:
        """The name a new account of `hub_name` gets: the computed one when it is free, else one with a
        random part (someone holds the computed name: an earlier account, or a squatter)."""
        name = self.name_for(hub_name)
        for _ in range(20):
            try:
                pwd.getpwnam(name)
            except KeyError:
                return name
            head = self.name_for(hub_name)[: MAX_UNIX_NAME - 9].rstrip("-")
            name = f"{head}-{secrets.token_hex(4)}"
        raise AccountError(f"no free Unix account name for hub user {hub_name[:64]!r}")

    def _useradd(self, hub_name: str) -> None:
        name = self.free_name(hub_name)
        if not UNIX_NAME.match(name) or len(name) > MAX_UNIX_NAME:
            raise AccountError(
                f"cannot make a Unix account named {name[:64]!r} (not a Unix name): set"
                " c.SystemAccounts.prefix so that hub names are mapped to valid ones"
            )
        cmd = [
            "useradd",
            "--create-home",
            "--user-group",
            "--shell",
            self.shell,
            "--comment",
            self.comment(hub_name),
            "-K",
            "UMASK=0077",
        ]
        if self.home_root:
            root = Path(self.home_root)
            root.mkdir(parents=True, exist_ok=True)
            if root.stat().st_mode & 0o011 != 0o011:
                root.chmod(root.stat().st_mode | 0o011)  # every account passes through to its own home
            if os.path.lexists(root / name):  # a former account's: its files are not handed to a new uid
                raise AccountError(
                    f"cannot make the Unix account {name!r}: its home {root / name} already"
                    " exists (left by an earlier account?); an admin must move it away first"
                )
            cmd += ["--home-dir", str(root / name)]
        done = subprocess.run([*cmd, "--", name], capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise AccountError(
                f"could not create the Unix account {name!r} for hub user"
                f" {hub_name[:64]!r}: {(done.stderr or done.stdout).strip()[:300]}"
            )
        home = pwd.getpwnam(name).pw_dir
        os.chmod(home, 0o700)  # whatever HOME_MODE the system's login.defs says

    def _checked(self, pw: pwd.struct_passwd, hub_name: str) -> Account:
        if pw.pw_uid == 0 or pw.pw_gid == 0:
            raise AccountError(
                f"the Unix account {pw.pw_name!r} is root's or in root's group:"
                " workspaces and jobs never run as root"
            )
        if pw.pw_gecos.startswith(MARKER) and not self.belongs(pw, hub_name):
            raise AccountError(
                f"the Unix account {pw.pw_name!r} belongs to hub user"
                f" {hub_user_of(pw.pw_gecos)[:64]!r} of a hub, not to {hub_name[:64]!r} of this one:"
                " this name cannot be used on this hub (ask an admin)"
            )
        return Account(pw.pw_name, pw.pw_uid, pw.pw_gid, pw.pw_dir)


def comment_for(hub_name: str, hub_key: str = "") -> str:
    """The account comment that names its hub user (the name where the passwd file can hold it,
    else a hash of it) and the hub that made it (`hub_key`; without it, the comment accounts had
    before comments named their hub)."""
    if re.fullmatch(r"[A-Za-z0-9_.@+-]{1,128}", hub_name):
        who = MARKER + hub_name
    else:
        who = MARKER + "sha256 " + hashlib.sha256(hub_name.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{who}{HUB_MARK}{hub_key}" if hub_key else who


def hub_user_of(gecos: str) -> str:
    """The hub user a gpupool comment names (its hub key left out)."""
    return gecos.split(",")[0][len(MARKER) :].split(HUB_MARK)[0]


def unix_name(hub_name: str, prefix: str = "") -> str:
    """The Unix account name of hub user `hub_name`: without a prefix the hub name itself;
    with one, prefix + name when that is a valid Unix name of at most 32 characters, otherwise a
    normalized name with a hash of the hub name. AccountError for an empty or over-long name."""
    if not hub_name or len(hub_name) > MAX_HUB_NAME:
        raise AccountError(f"a hub user name must be 1 to {MAX_HUB_NAME} characters to get a Unix account")
    if not prefix:  # LocalProcessSpawner's rule: the hub name is the account's (PAM names are as they are)
        return hub_name
    whole = prefix + hub_name
    if UNIX_NAME.match(whole) and len(whole) <= MAX_UNIX_NAME:
        return whole
    digest = hashlib.sha256(hub_name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    clean = re.sub(r"[^a-z0-9_-]+", "-", hub_name.lower()).strip("-") or "user"
    head = (prefix + clean)[: MAX_UNIX_NAME - len(digest) - 1].rstrip("-")
    if not UNIX_NAME.match(head):  # no prefix and a name that starts with a digit or '-'
        head = ("u" + head)[: MAX_UNIX_NAME - len(digest) - 1]
    return f"{head}-{digest}"


def unreachable(paths: list[str]) -> str:
    """Why an unprivileged account could not use these paths (a folder on the way it may not
    pass through, a file it may not read); "" when every one is usable."""
    # a link is followed by whoever opens it: the folders on the way to its target count too
    for path in dict.fromkeys(q for raw in paths for q in (Path(raw).absolute(), Path(raw).resolve())):
        for folder in [*reversed(path.parents)]:
            try:
                mode = folder.stat().st_mode
            except OSError as err:
                return f"{folder}: {err.strerror}"
            if not mode & stat.S_IXOTH:
                return f"other accounts may not pass through {folder} (mode {oct(mode & 0o777)})"
        try:
            mode = path.stat().st_mode
        except OSError as err:
            return f"{path}: {err.strerror}"
        need = stat.S_IXOTH if stat.S_ISDIR(mode) else stat.S_IROTH
        if not mode & need:
            return (
                f"other accounts may not {'pass through' if need == stat.S_IXOTH else 'read'} {path}"
                f" (mode {oct(mode & 0o777)})"
            )
    return ""


async def make_on_login(
    authenticator: Authenticator, handler: object, authentication: dict[str, Any] | None
) -> dict[str, object] | None:
    """`c.Authenticator.post_auth_hook` that makes the account at log-in (JupyterHub's
    create_system_users habit). A user whose account cannot be made still logs in: the spawn page
    then says why no server can start."""
    import asyncio
    import logging

    if authentication:
        try:
            await asyncio.to_thread(
                SystemAccounts(config=authenticator.config).ensure, authentication["name"]
            )
        except AccountError as err:
            logging.getLogger("gpupool").warning(
                "no Unix account for %s: %s", authentication["name"][:64], err
            )
    return authentication


def made_by_gpupool(name: str) -> bool:
    try:
        return pwd.getpwnam(name).pw_gecos.startswith(MARKER)
    except KeyError:
        return False
