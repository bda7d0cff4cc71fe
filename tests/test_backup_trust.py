"""`gpupool backup` / `gpupool restore` an operator can trust (gpupool.host.backup): a backup never
writes into a folder someone else made (a user who made it first, in /tmp, would read both
databases or redirect root's writes through a link), and a restore never takes files another
account could have changed; a restored database closes the shares of what stopped after the backup
at the backup's time, and names running work it does not know (gpupool.host.instance).

Unit tests on real files and databases; the real hub's side is in tests/test_lost_state.py.
"""

from __future__ import annotations

import os
import pwd
import sqlite3
import time
from pathlib import Path

import pytest

from gpupool.alloc.manager import Workload
from gpupool.contain.cgroups import Tree
from gpupool.host.backup import FILES, MANIFEST, BackupError, backup, restore
from gpupool.host.instance import LostState, settle
from gpupool.store import Store
from gpupool.usage.ledger import Ledger
from tests.support.pools import make_pool

H = 3600
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="another account's files need root to make")


def other_uid() -> int:
    return pwd.getpwnam("nobody").pw_uid


def a_state(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    state.mkdir()
    store = Store(f"sqlite:///{state / FILES[0]}")
    store.put_setting("instance", {"id": "a1b2c3d4e5f6"})
    store.engine.dispose()
    con = sqlite3.connect(state / FILES[1])
    con.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    con.execute("INSERT INTO users (name) VALUES ('ann')")
    con.commit()
    con.close()
    return state


def test_backup_makes_its_own_private_folder_and_never_writes_into_one_that_exists(tmp_path: Path) -> None:
    state = a_state(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    planted = tmp_path / "made-by-a-user"  # empty, as /tmp/gpupool-backup-<date> made first by a user
    planted.mkdir()
    planted.chmod(0o777)
    if os.geteuid() == 0:
        os.chown(planted, other_uid(), -1)
    with pytest.raises(BackupError, match="exists"):
        backup(state, planted)
    assert list(planted.iterdir()) == []  # nothing the user could read
    (planted / MANIFEST).symlink_to(victim)  # nor write through a link, once there are files
    with pytest.raises(BackupError, match="exists"):
        backup(state, planted)
    assert victim.read_text() == "root's file\n"

    old = os.umask(0)  # an operator's permissive umask changes nothing
    try:
        made = backup(state, tmp_path / "new" / "backup")
    finally:
        os.umask(old)
    out = tmp_path / "new" / "backup"
    assert made["instance"] == "a1b2c3d4e5f6"
    assert oct(out.stat().st_mode & 0o777) == "0o700"
    for p in out.iterdir():
        assert oct(p.stat().st_mode & 0o777) == "0o600", p.name
    assert sorted(p.name for p in out.iterdir()) == sorted([*FILES, MANIFEST])


def test_restore_refuses_a_backup_others_could_have_changed(tmp_path: Path) -> None:
    state = a_state(tmp_path)
    good = tmp_path / "backup"
    backup(state, good)
    before = (state / FILES[0]).read_bytes()

    def refused(folder: Path, says: str) -> None:
        with pytest.raises(BackupError, match=says):
            restore(folder, state)
        assert (state / FILES[0]).read_bytes() == before  # nothing replaced
        assert not [p.name for p in state.iterdir() if "restor" in p.name]  # nothing left behind

    good.chmod(0o777)
    refused(good, "may be written by others")
    good.chmod(0o700)
    (good / FILES[1]).chmod(0o666)
    refused(good, "may be written by others")
    (good / FILES[1]).chmod(0o600)
    link = tmp_path / "linked"
    link.symlink_to(good)
    refused(link, "links are not followed")
    (good / FILES[0]).rename(tmp_path / "real.sqlite")
    (good / FILES[0]).symlink_to(tmp_path / "real.sqlite")
    refused(good, "links are not followed")
    (good / FILES[0]).unlink()
    (tmp_path / "real.sqlite").rename(good / FILES[0])
    assert any("restored" in line for line in restore(good, state))
    assert not list(state.glob("*.restoring-*"))  # the checked copies became the state's files


@as_root
def test_restore_refuses_a_backup_folder_or_file_another_account_owns(tmp_path: Path) -> None:
    state = a_state(tmp_path)
    good = tmp_path / "backup"
    backup(state, good)
    os.chown(good / FILES[0], other_uid(), -1)
    with pytest.raises(BackupError, match="belongs to uid"):
        restore(good, state)
    os.chown(good / FILES[0], 0, -1)
    os.chown(good, other_uid(), -1)
    with pytest.raises(BackupError, match="belongs to uid"):
        restore(good, state)


def test_a_restored_backup_charges_what_stopped_after_it_only_up_to_the_backups_time(tmp_path: Path) -> None:
    pool = make_pool(tmp_path, 2, db="pool.sqlite")
    pool.reserve_build("ann", [], "", 250)
    pool.reserve_build("bob", [], "", 250)
    from tests.test_usage_accounting import backdate

    backdate(pool.store, 3 * H)  # both started 3 h ago
    made = time.time() - 2 * H  # the backup, 2 h ago; it is restored now
    pool.store.put_setting("backup", {"made": made})
    pool.store.engine.dispose()
    again = make_pool(tmp_path, 2, db="pool.sqlite")  # the hub starts on the restored database
    again.reconcile(lambda row: row.owner == "bob")  # ann's server stopped after the backup; bob's runs
    again.started()
    again.release(Workload("build", "bob", ""), reason="stopped")  # later, bob stops
    rows = {h.owner: h for h in Ledger(again.store, again.inventory).held(0, 2**31)}
    assert rows["ann"].end == int(made)  # not the restart's time: 2 h nobody used
    assert rows["bob"].end is not None and rows["bob"].end >= int(time.time()) - 5  # ran until now
    assert again.store.get_setting("backup") is None  # the next restart closes nothing at it


def test_running_work_the_restored_database_does_not_know_stops_the_start(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'pool.sqlite'}")
    store.put_setting("instance", {"id": "a1b2c3d4e5f6"})
    tree = Tree(tmp_path / "cgroups")
    for workload, pids in (("job-known", "1"), ("job-0123abcd", f"{os.getpid()}\n"), ("ws-empty", "")):
        (tree.root / "a1b2c3d4e5f6" / workload).mkdir(parents=True)
        (tree.root / "a1b2c3d4e5f6" / workload / "cgroup.procs").write_text(pids)
    with pytest.raises(LostState, match="1 workload.*does not know: train job 0123abcd") as err:
        settle(store, tree, "hubkey", where="x.sqlite", known={"job-known"})
    assert str(os.getpid()) in str(err.value)
    assert (
        settle(store, tree, "hubkey", where="x.sqlite", known={"job-known", "job-0123abcd"}) == "a1b2c3d4e5f6"
    )
