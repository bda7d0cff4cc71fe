"""Runs a train job's command and records how it ended, so that a restarted hub knows
even though it was not the parent.

    python .../gpupool/runners/wrap.py EXIT_FILE -- COMMAND...

The record is the exit code on its first line and, when the command could not start at
all, the reason in plain words (the errno message) on the second.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

# the shell's convention: 127 the command was not found, 126 it could not be executed
NOT_FOUND, NOT_EXECUTABLE = 127, 126


def record(exit_file: str, code: int, reason: str = "") -> None:
    tmp = exit_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{code}\n{reason}\n")
    os.replace(tmp, exit_file)


def main(argv: list[str]) -> int:
    exit_file, command = argv[0], argv[argv.index("--") + 1:]
    try:
        child = subprocess.Popen(command)
    except OSError as err:
        code = NOT_FOUND if isinstance(err, FileNotFoundError) else NOT_EXECUTABLE
        reason = f"could not start {command[0] if command else '(no command)'!r}: {err.strerror}"
        print(f"gpupool: {reason}", file=sys.stderr)
        record(exit_file, code, reason)
        return code
    # preemption signals the whole process group, the job included; the wrapper stays to
    # record how the job ended
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    code = child.wait()
    record(exit_file, code)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
