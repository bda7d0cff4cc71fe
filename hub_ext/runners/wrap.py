"""Runs a train job's command and records its exit code, so that a restarted hub knows how a
job ended even though it was not the parent.

    python …/gpupool/runners/wrap.py EXIT_FILE -- COMMAND...   (by path: it needs only the stdlib)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def main(argv: list[str]) -> int:
    exit_file, command = argv[0], argv[argv.index("--") + 1:]
    child = subprocess.Popen(command)
    # preemption signals the whole process group, the job included; the wrapper stays to
    # record how the job ended
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    code = child.wait()
    tmp = exit_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(code))
    os.replace(tmp, exit_file)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
