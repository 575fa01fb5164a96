"""Run CLI commands in this process with no process started, no SSH opened, no socket
connected and no server run (each command goes as far as it can without), printing each
command's output and log records; used by tests that look for secrets in what commands say.

    python tests/support/cli_guarded.py ARGV_JSON   (a list of argv lists)
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import json
import logging
import os
import socket
import subprocess
import sys

HANG_S = 120


def _refuse(*args, **kwargs):
    raise AssertionError("refused: this run starts and connects to nothing")


def main() -> None:
    import paramiko
    import uvicorn

    subprocess.Popen = _refuse  # type: ignore[misc, assignment]
    paramiko.SSHClient.connect = _refuse  # type: ignore[method-assign]
    socket.create_connection = _refuse  # type: ignore[assignment]
    socket.socket.connect = _refuse  # type: ignore[method-assign]
    uvicorn.Server.run = _refuse  # type: ignore[method-assign]  # `proxy` would serve for ever
    from lab_utils import cli

    for argv in json.loads(sys.argv[1]):
        print(f"START {argv}", file=sys.__stdout__, flush=True)
        buf = io.StringIO()
        handler = logging.StreamHandler(buf)
        logging.getLogger().addHandler(handler)
        logging.getLogger().setLevel(logging.DEBUG)
        # a command that hangs prints every thread's stack and ends this run, so the test
        # fails with where it hung instead of waiting for its own timeout
        faulthandler.dump_traceback_later(HANG_S, exit=True, file=sys.__stderr__)
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf), \
                contextlib.suppress(Exception, SystemExit):
            cli.main(argv)
        faulthandler.cancel_dump_traceback_later()
        logging.getLogger().removeHandler(handler)
        print(buf.getvalue(), file=sys.__stdout__)
        print(f"DONE {argv}", file=sys.__stdout__, flush=True)


if __name__ == "__main__":
    main()
    # Exit without the interpreter's exit hooks: a command whose process the guard refused
    # leaves one behind that waits for ever (nbclient's atexit clean-up of a kernel that
    # never started runs an event loop waiting on a thread that never answers).
    sys.stdout.flush()
    os._exit(0)
