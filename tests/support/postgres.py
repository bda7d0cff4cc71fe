"""A throwaway PostgreSQL server for the store's tests: Debian's `postgresql` package (initdb and
pg_ctl), a cluster in a temporary folder reached by its Unix socket only, one fresh database per
test. PostgreSQL refuses to run as root, so as root (CI) the cluster belongs to the `postgres`
account the package makes; otherwise to the current user."""

from __future__ import annotations

import glob
import os
import pwd
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest


def pg_bin() -> Path | None:
    """The folder of initdb and pg_ctl: on PATH, else Debian's /usr/lib/postgresql/<major>/bin."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.access(f"{folder}/initdb", os.X_OK) and os.access(f"{folder}/pg_ctl", os.X_OK):
            return Path(folder)
    return None


def unavailable() -> str:
    """Why no server can start here ('' when one can)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (run `make venv`)"
    if pg_bin() is None:
        return "PostgreSQL is not installed (`make postgres`: Debian's postgresql package)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and no `postgres` account to run the server as"
    return ""


class PostgresServer:
    def __init__(self) -> None:
        self.bin = pg_bin()
        assert self.bin is not None
        # short: a Unix socket path has a limit of 107 bytes
        self.root = Path(tempfile.mkdtemp(prefix="gpupool-pg-"))
        self.data = self.root / "data"
        self.user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        self.databases = 0
        self._watchdog: subprocess.Popen[bytes] | None = None

    def _as_owner(self, *argv: str) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else list(argv)

    def start(self) -> None:
        run = lambda *a: subprocess.run(self._as_owner(*a), check=True, capture_output=True, timeout=120)  # noqa: E731
        run(str(self.bin / "initdb"), "-D", str(self.data), "-U", self.user, "-A", "trust", "--no-sync")
        # no TCP (nothing else on the machine can reach it); durability off: a test database
        opts = f"-c listen_addresses='' -k {self.root} -c fsync=off -c full_page_writes=off"
        run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            opts,
            "-l",
            str(self.root / "log"),
            "-w",
            "start",
        )
        self._watch()

    def _watch(self) -> None:
        """pg_ctl's server outlives whoever started it: a test run killed with SIGKILL (a CI
        timeout, `kill -9`) would leave it running and its folder in /tmp. A watchdog in its own
        session reads a pipe only this process writes to; the pipe's end (this process's exit,
        however it dies) stops the server and removes its folder."""
        pg_ctl, data, root = (shlex.quote(str(p)) for p in (self.bin / "pg_ctl", self.data, self.root))
        self._watchdog = subprocess.Popen(
            [
                "sh",
                "-c",
                f"cat >/dev/null; {pg_ctl} -D {data} -m immediate stop >/dev/null 2>&1; rm -rf {root}",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C to the test run's group reaches pytest, not this
            user="postgres" if os.geteuid() == 0 else None,
        )

    def stop(self) -> None:
        if self._watchdog is not None:
            assert self._watchdog.stdin is not None
            self._watchdog.stdin.close()  # the watchdog's EOF: it stops the server and removes the folder
            self._watchdog.wait(timeout=60)
            self._watchdog = None
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{self.user}@/{database}?host={self.root}"

    def new_database(self) -> str:
        """A fresh, empty database's URL."""
        import psycopg

        self.databases += 1
        name = f"t{self.databases}"
        with psycopg.connect(host=str(self.root), user=self.user, dbname="postgres", autocommit=True) as c:
            c.execute(f"CREATE DATABASE {name}")
        return self.url(name)


def store_url_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The store's URL for one test: a SQLite file, or a new database on the session's server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'gpupool.sqlite'}"
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.new_database()
