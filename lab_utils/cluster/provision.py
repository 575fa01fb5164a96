"""Getting the lab's code and the model onto the nodes.

`deploy` copies the package (the version on the notebook host) into each SSH node's
workdir when the node's copy differs (a digest of the files is kept beside it), then
checks that the node's Python has what its roles need and says what to install where.
`model_fetch` makes the configured model present on every serving node: the generated
tiny model is built here and copied; a hub model is downloaded on each node unless its
snapshot is already in the node's cache (the token, if any, goes through the process
environment on stdin, never argv); a `path` model must already be there. Either way every
node must end up with the same snapshot. Both replace only what the lab made (a directory
carrying its marker, `lab_utils.on_node.dirs`). Both take a config (notebook 00, the
command line) or the cluster a caller already holds.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, cast

from lab_utils.cluster import tiny_model
from lab_utils.cluster.cluster import Cluster, as_cluster
from lab_utils.cluster.nodes import Node
from lab_utils.config import PACKAGE_DIR, LabConfig, hf_token
from lab_utils.errors import LabError
from lab_utils.on_node import dirs

if TYPE_CHECKING:
    from lab_utils.cluster.ssh import SSHNode

PACKAGE = PACKAGE_DIR  # the package as installed: a checkout or a wheel
ROLE_MODULES = {
    "serving": ["vllm", "nixl", "torch", "httpx"],
    "controller": ["fastapi", "uvicorn", "httpx", "pydantic"],
}
INSTALL_HINT = {
    "serving": ("the serving engine (docs/CLUSTER.md: 'Serving nodes (DGX Spark): "
                "installing (not tested by this project)')"),
    "controller": "the lab's requirements (`pip install -r requirements.txt`)",
}
# Names and sizes of a model directory's files, plus a full hash when asked: run on nodes.
_SNAPSHOT_CODE = """
import hashlib, json, sys, pathlib
root, full = pathlib.Path(sys.argv[1]), sys.argv[2] == "1"
if not (root / "config.json").is_file():
    print(json.dumps(None)); sys.exit(0)
h = hashlib.sha256()
for f in sorted(p for p in root.rglob("*") if p.is_file() and ".cache" not in p.parts):
    h.update(f.relative_to(root).as_posix().encode())
    h.update(f.read_bytes() if full else str(f.stat().st_size).encode())
print(json.dumps(h.hexdigest()))
"""
# The snapshot already in the node's cache when there is one (no network: instances then
# start with HF_HUB_OFFLINE=1 and find it there), else a download.
_HUB_FETCH_CODE = """
import json, sys
from huggingface_hub import snapshot_download
try:
    path = snapshot_download(sys.argv[1], revision=sys.argv[2] or None, local_files_only=True)
except Exception:
    path = snapshot_download(sys.argv[1], revision=sys.argv[2] or None)
print(json.dumps(path))
"""


# Sets `where` to the model's directory on the node: the hub cache's snapshot for a hub
# model (nothing is downloaded), otherwise the configured path. Code that reads the model
# there is appended to it.
_LOCATE_MODEL = """
import json, os, sys
source, where, revision = sys.argv[1:4]
if source == "hub":
    from huggingface_hub import snapshot_download
    where = snapshot_download(where, revision=revision or None, local_files_only=True)
"""


def run_in_model_dir(cluster: Cluster | LabConfig, name: str, code: str, timeout: float = 120):
    """Run Python `code` on node `name` with `where` set to the model's directory there."""
    with as_cluster(cluster) as cluster:
        cfg, node = cluster.cfg, cluster.node(name)
        where = cfg.model.name if cfg.model.source == "hub" else cfg.model_path_on(name)
        return node.run([node.python, "-c", _LOCATE_MODEL + code, cfg.model.source, where,
                         cfg.model.revision or ""], timeout=timeout)


def package_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def code_digest() -> str:
    h = hashlib.sha256()
    for f in package_files():
        h.update(f.relative_to(PACKAGE).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()


DEPLOYED_STAMP = ".deployed"  # in the deployed lab_utils/: the code's digest, the lab's marker


def _write_remote(node: Node, path: str, text: str) -> None:
    code = ("import sys, pathlib; p = pathlib.Path(sys.argv[1]); "
            "p.parent.mkdir(parents=True, exist_ok=True); p.write_text(sys.stdin.read())")
    r = node.run([node.python, "-c", code, path], input=text)
    if not r.ok:
        raise LabError(f"node {node.name}: cannot write {path}: {r.why}")


def missing_modules(node: Node, modules: list[str]) -> list[str]:
    code = ("import importlib.util, json, sys; "
            "print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]))")
    r = node.run([node.python, "-c", code, *modules], timeout=60)
    if not r.ok:
        raise LabError(f"node {node.name}: cannot run {node.python}: {r.why}"
                       " (set nodes.<name>.python to the node's interpreter)")
    return json.loads(r.stdout)


def deploy_node(cluster: Cluster, name: str, force: bool = False) -> str:
    """Bring one node's copy of the lab up to date; return what was done."""
    node = cluster.node(name)
    problems = []
    for role in node.cfg.roles:
        missing = missing_modules(node, ROLE_MODULES[role])
        if missing:
            problems.append(f"node {name} ({role}): {node.python} lacks {', '.join(missing)}; "
                            f"install {INSTALL_HINT[role]} into that environment")
    if problems:
        raise LabError("\n".join(problems))
    if node.cfg.connection == "local":
        return f"{name}: local, runs the code in this checkout"
    digest = code_digest()
    target = f"{node.cfg.workdir}/lab_utils"
    stamp = f"{target}/{DEPLOYED_STAMP}"
    current = node.run(["cat", stamp])
    if not force and current.ok and current.stdout.strip() == digest:
        return f"{name}: up to date ({digest[:12]})"
    node = cast("SSHNode", node)  # past the local return: an SSH node
    node.check_workdir()
    # the whole copy is replaced, so a module the package no longer has does not linger
    _copy_files(node, [(f, f.relative_to(PACKAGE).as_posix()) for f in package_files()],
                target, DEPLOYED_STAMP, f"nodes.{name}.workdir", stamp=digest)
    return f"{name}: deployed lab_utils {digest[:12]} to {node.cfg.workdir}"


def deploy(cluster: Cluster | LabConfig, nodes: list[str] | None = None,
           force: bool = False) -> list[str]:
    """`deploy_node` on the named nodes (all of them by default)."""
    with as_cluster(cluster) as cluster:
        return [deploy_node(cluster, n, force) for n in (cluster.names() if nodes is None else nodes)]


def model_snapshot(node: Node, path: str, full: bool) -> str | None:
    r = node.run([node.python, "-c", _SNAPSHOT_CODE, path, "1" if full else "0"],
                 timeout=600)
    if not r.ok:
        raise LabError(f"node {node.name}: cannot inspect {path}: {r.why}")
    return json.loads(r.stdout)


def _not_the_labs(node: str, path: str, marker: str, field: str) -> str:
    return (f"node {node}: {path} exists and is not the lab's (it is not empty and has no "
            f"{marker}); the lab replaces only what it made. Choose another {field}, or "
            "remove that directory yourself if it is yours.")


def _copy_files(node: SSHNode, files: list[tuple[Path, str]], remote: str, marker: str,
                field: str, stamp: str | None = None) -> None:
    """Copy `files` (local path, path under `remote`) to `remote` on the node through a
    staging directory beside it, then move it in place: nothing stale survives, and
    `remote` and the staging directory are replaced only when they are the lab's (absent,
    empty or holding `marker`). The marker goes first, so an interrupted copy is still
    the lab's; `stamp` (when given) is written into the marker last."""
    partial = f"{remote}.partial"
    for path in (remote, partial):
        if json.loads(node.run_sent(dirs, "owner", path, marker)) == "other":
            raise LabError(_not_the_labs(node.name, path, marker, field))
    node.run_sent(dirs, "remove", partial, marker)
    if stamp is not None:
        _write_remote(node, f"{partial}/{marker}", "copying")
    for local, rel in sorted(files, key=lambda f: f[1] != marker):
        node.put_file(local, f"{partial}/{rel}")
    if stamp is not None:
        _write_remote(node, f"{partial}/{marker}", stamp)
    if json.loads(node.run_sent(dirs, "replace", partial, remote, marker)) == "other":
        raise LabError(_not_the_labs(node.name, remote, marker, field))


def ensure_model_on(cluster: Cluster, name: str) -> str:
    """Make the model present on one node; return its snapshot id."""
    cfg, node = cluster.cfg, cluster.node(name)
    where = cfg.model_path_on(name)
    if cfg.model.source == "tiny":
        local = tiny_model.generate(cfg.model_path, seed=cfg.model.tiny_seed)
        want = tiny_model.fingerprint(local)
        if node.cfg.connection == "local":  # `where` is the model just generated here
            return want
        if model_snapshot(node, where, full=True) != want:
            files = [(f, f.relative_to(local).as_posix()) for f in local.rglob("*") if f.is_file()]
            _copy_files(cast("SSHNode", node), files, where, tiny_model.MARKER, "model.node_path")
        have = model_snapshot(node, where, full=True)
        if have != want:
            raise LabError(f"node {name}: the tiny model at {where} differs from this host's")
        return have
    if cfg.model.source == "hub":
        token = hf_token(cfg)
        r = node.run([node.python, "-c", _HUB_FETCH_CODE, cfg.model.name,
                      cfg.model.revision or ""], env={"HF_TOKEN": token} if token else None,
                     timeout=7200)
        if not r.ok:
            raise LabError(f"node {name}: downloading {cfg.model.name} failed:\n"
                           f"{r.stderr.strip()[-800:]}")
        where = json.loads(r.stdout.strip().splitlines()[-1])
    snap = model_snapshot(node, where, full=False)
    if snap is None:
        raise LabError(f"model not found on node {name}: {where}/config.json is missing; "
                       "run `python -m lab_utils model fetch` or fix model.path in the config")
    return snap


def model_fetch(cluster: Cluster | LabConfig, nodes: list[str] | None = None) -> dict[str, str]:
    """The model on every serving node, checked to be the same snapshot everywhere."""
    with as_cluster(cluster) as cluster:
        targets = nodes if nodes is not None else [n.name for n in cluster.serving()]
        snaps = {n: ensure_model_on(cluster, n) for n in targets}
    if len(set(snaps.values())) > 1:
        detail = ", ".join(f"{n}: {s[:12]}" for n, s in snaps.items())
        raise LabError(f"the model differs between nodes ({detail}); pin model.revision and "
                       "fetch again")
    return snaps
