"""Run CLI commands in this process with no process started, no SSH opened, no socket
connected and no server run (each command goes as far as it can without), printing each
command's output and log records; used by tests that look for secrets in what commands say.

    python tests/support/cli_guarded.py ARGV_JSON   (a list of argv lists)
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import socket
import subprocess
import sys


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
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf), \
                contextlib.suppress(Exception, SystemExit):
            cli.main(argv)
        logging.getLogger().removeHandler(handler)
        print(buf.getvalue(), file=sys.__stdout__)
        print(f"DONE {argv}", file=sys.__stdout__, flush=True)


if __name__ == "__main__":
    main()
