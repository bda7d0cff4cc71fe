"""The hub never waits on a user's file: what a job's owner puts in place of a file the hub writes
(a FIFO nobody reads, a link) is refused at once, and the hub goes on (gpupool.runners.safe_files).
A FIFO at job.log once froze the hub's main thread when the job was cancelled: opening a FIFO for
writing blocks until someone reads it."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from types import SimpleNamespace

from gpupool.train.service import TrainingService


def appended_within(workdir: Path, seconds: float = 10) -> bool:
    """Append the hub's line to the job's log in a thread; False if it is still blocked."""
    row = SimpleNamespace(workdir=str(workdir), id="job1")
    t = threading.Thread(
        target=TrainingService._log_line, args=(row, "--- gpupool: cancelled ---"), daemon=True
    )
    t.start()
    t.join(seconds)
    return not t.is_alive()


def test_the_hubs_job_log_lines_never_block_on_a_fifo_nor_follow_a_link(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo-job"
    fifo.mkdir()
    os.mkfifo(fifo / "job.log")
    try:
        assert appended_within(fifo), "the hub blocked opening a FIFO put in place of job.log"
    finally:
        # a blocked writer (the old code) is released by a reader, so the test run ends
        os.close(os.open(fifo / "job.log", os.O_RDONLY | os.O_NONBLOCK))
    linked = tmp_path / "linked-job"
    linked.mkdir()
    target = tmp_path / "not-the-jobs"
    target.write_text("")
    (linked / "job.log").symlink_to(target)
    assert appended_within(linked) and target.read_text() == ""
    plain = tmp_path / "job"
    plain.mkdir()
    (plain / "job.log").write_text("the job's own line\n")
    assert appended_within(plain)
    assert (plain / "job.log").read_text() == "the job's own line\n--- gpupool: cancelled ---\n"


def test_every_open_in_a_job_folder_refuses_a_fifo_or_a_link_at_once(tmp_path: Path) -> None:
    """The one helper the hub opens a user's files with (the job's log read by the logs API, its
    exit record, its checkpoint files): a FIFO is refused without waiting for a writer or a reader,
    a link is not followed."""
    import pytest

    from gpupool.runners.safe_files import UnsafePath, folder, open_file, read_small

    os.mkfifo(tmp_path / "job.log")
    (tmp_path / "exit.json").symlink_to("/etc/passwd")
    uid = os.getuid()
    with folder(str(tmp_path), uid) as dir_fd:
        for flags in (os.O_RDONLY, os.O_WRONLY | os.O_APPEND):
            with pytest.raises(OSError, match="not a regular file|No such device"):
                open_file(dir_fd, "job.log", flags, uid)
        with pytest.raises(UnsafePath, match="links are not followed"):
            read_small(dir_fd, "exit.json", uid)
