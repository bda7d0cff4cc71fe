"""Runs a train job's command and records how it ended, so that a restarted hub knows
even though it was not the parent.

    python .../gpupool/runners/wrap.py        (in the job's folder; stdout is the job's log)

The command comes from `.command` in the job's folder (a file only the job's account may read,
removed once read), not from the wrapper's arguments: other users see a process's arguments in
`ps`. The command's output is copied to the log up to its size limit; past it the log gets one
line saying so and the rest is dropped, while the job goes on.

The record (`.exit_code`) is the exit code on its first line and, when the command could not start
at all, the reason in plain words (the errno message) on the second.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

# the shell's convention: 127 the command was not found, 126 it could not be executed
NOT_FOUND, NOT_EXECUTABLE = 127, 126
EXIT_FILE, COMMAND_FILE = ".exit_code", ".command"
DRAIN_S = 2.0  # after the command exits, how long its children may keep the output pipe open


def record(code: int, reason: str = "") -> None:
    tmp = EXIT_FILE + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{code}\n{reason}\n")
    os.replace(tmp, EXIT_FILE)


def read_spec() -> tuple[list[str], int]:
    with open(COMMAND_FILE, "rb") as f:
        spec = json.loads(f.read(4 * 1024 * 1024))
    os.unlink(COMMAND_FILE)
    command, limit = spec.get("command"), spec.get("log_limit", 0)
    if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
        raise ValueError("the command file does not hold a command")
    return command, int(limit) if isinstance(limit, int) else 0


def copy_output(src: int, dst: int, limit: int) -> None:
    """Copy the command's output to the log until the log holds `limit` bytes (0: no limit); then
    one note, and the rest is read and dropped so the command never blocks on a full pipe."""
    written = os.fstat(dst).st_size if limit else 0  # a resumed run appends to the same log
    cut = False
    while chunk := os.read(src, 64 * 1024):
        if cut:
            continue
        if limit and written + len(chunk) > limit:
            chunk = chunk[: max(0, limit - written)]
            cut = True
        os.write(dst, chunk)
        written += len(chunk)
        if cut:
            os.write(
                dst,
                (
                    f"\n--- gpupool: the log reached its limit of {limit // (1024 * 1024)} MiB"
                    " (c.TrainPool.max_log_mib); the job goes on, its further output is not kept ---\n"
                ).encode(),
            )


def main(argv: list[str]) -> int:
    try:
        command, limit = read_spec()
    except (OSError, ValueError) as err:
        reason = f"could not read the job's command: {err}"
        print(f"gpupool: {reason}", file=sys.stderr)
        record(NOT_EXECUTABLE, reason)
        return NOT_EXECUTABLE
    read_end, write_end = os.pipe()
    try:
        child = subprocess.Popen(command, stdout=write_end, stderr=write_end)
    except OSError as err:
        code = NOT_FOUND if isinstance(err, FileNotFoundError) else NOT_EXECUTABLE
        reason = f"could not start {command[0]!r}: {err.strerror}"
        print(f"gpupool: {reason}", file=sys.stderr)
        record(code, reason)
        return code
    finally:
        os.close(write_end)
    # preemption signals every process of the job, the wrapper included; the wrapper stays to
    # record how the job ended
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    copier = threading.Thread(target=copy_output, args=(read_end, sys.stdout.fileno(), limit), daemon=True)
    copier.start()
    code = child.wait()
    copier.join(DRAIN_S)  # a child the command left behind may hold the pipe: not waited for
    record(code)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
