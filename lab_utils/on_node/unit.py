"""Run a vLLM instance as one unit: when its main process ends, nothing of it runs on.

    python -m lab_utils.on_node.unit GRACE_S -- ARGV...

The lab starts every vLLM instance in a process group of its own. The API server (or a
headless rank's launcher) starts the engine core and its workers in that group; when the
API server dies (killed, out of memory, a crash), they are not told and run on, holding
the model's memory and the KV cache, until somebody runs `status` or `cleanup`. This
process leads the group instead: it starts ARGV as its child, waits for it, and the
moment the child ends it stops the rest of the group (TERM, then KILL after GRACE_S)
and exits with the child's status, so the instance is gone as a whole within seconds,
and its log (this process's output is the instance's) says why.

A TERM to the group (the lab's stop) reaches the child and everything else in it; this
process ignores it, waits for the child and stops whatever is left the same way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

from lab_utils.on_node.proctools import group_members


def _stop_rest(grace_s: float) -> list[int]:
    """TERM every other member of this process's group, KILL what is left after
    `grace_s`; the members that were found."""
    me, group = os.getpid(), os.getpgid(0)
    rest = [p for p in group_members(group) if p != me]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in rest:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline and [p for p in group_members(group) if p != me]:
            time.sleep(0.1)
    return rest


_GROUP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _default_signals() -> None:  # in the child, before exec: ignored signals stay ignored
    for sig in _GROUP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m lab_utils.on_node.unit GRACE_S -- ARGV...", file=sys.stderr)
        return 2
    grace_s, cmd = float(argv[0]), argv[2:]
    if os.getpgid(0) != os.getpid():
        print("lab_utils.on_node.unit: must lead its process group (start it with setsid)",
              file=sys.stderr)
        return 2
    for sig in _GROUP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)  # the child gets the group's signals itself
    child = subprocess.Popen(cmd, preexec_fn=_default_signals)
    code = child.wait()
    rest = _stop_rest(grace_s)
    how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    print(f"[lab] the instance's main process (pid {child.pid}) {how}; "
          + (f"stopped the {len(rest)} other process(es) of its group" if rest
             else "nothing else of it was running"), flush=True)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
