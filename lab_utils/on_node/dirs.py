"""Which directories the lab may replace or write into, judged on the node itself.

The lab removes only what it created: a directory it made carries a marker file (the
tiny model's recipe, the deployed code's `.deployed` stamp), so a path is the lab's to
replace when it is absent, an empty directory, or a directory holding that marker;
anything else belongs to someone else and is left alone. A node's workdir must be a
directory of the lab's own: not `/`, not the user's home or a directory above it, not a
top-level directory and nothing under a system directory.

Standard library only: its source is sent to the node's Python over stdin, like
`proctools`. Remote entry point, each printing its answer as JSON:

    owner PATH MARKER              "absent", "empty", "lab" or "other"
    remove PATH MARKER             remove PATH when it is the lab's; what it was
    replace STAGING TARGET MARKER  move STAGING onto TARGET when TARGET is the lab's;
                                   what TARGET was
    workdir PATH                   {"problem": why PATH is refused or null, "home": $HOME}
"""

from __future__ import annotations

import json
import os
import shutil
import sys

SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32",
                "/proc", "/run", "/sbin", "/sys", "/usr")


def owner(path: str, marker: str) -> str:
    """"absent", "empty" (an empty directory), "lab" (a directory holding `marker`) or
    "other" (anything else, a symlink included)."""
    if not os.path.lexists(path):
        return "absent"
    if os.path.islink(path) or not os.path.isdir(path):
        return "other"
    if os.path.isfile(os.path.join(path, marker)):
        return "lab"
    return "other" if os.listdir(path) else "empty"


def remove(path: str, marker: str) -> str:
    """Remove `path` when it is the lab's (empty or marked); return what it was."""
    kind = owner(path, marker)
    if kind in ("empty", "lab"):
        shutil.rmtree(path)
    return kind


def replace(staging: str, target: str, marker: str) -> str:
    """Move `staging` onto `target` unless `target` is someone else's; return what
    `target` was (on "other" nothing is touched)."""
    kind = remove(target, marker)
    if kind != "other":
        os.rename(staging, target)
    return kind


def workdir_problem(path: str) -> str | None:
    """Why `path` may not be the lab's workdir on this node, or None."""
    real = os.path.realpath(path)
    home = os.path.realpath(os.path.expanduser("~"))
    if real == home:
        return f"it is the home directory of this user ({home})"
    if home.startswith(real.rstrip("/") + "/"):
        return f"it holds the home directory of this user ({home})"
    if os.path.dirname(real) == "/":
        return "it is a top-level directory"
    if any(real == t or real.startswith(t + "/") for t in SYSTEM_TREES):
        return "it is a system directory"
    return None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    cmd, rest = args[0], args[1:]
    if cmd == "owner":
        result: object = owner(*rest)
    elif cmd == "remove":
        result = remove(*rest)
    elif cmd == "replace":
        result = replace(*rest)
    elif cmd == "workdir":
        result = {"problem": workdir_problem(rest[0]),
                  "home": os.path.expanduser("~")}
    else:
        print(f"unknown command {cmd!r}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
